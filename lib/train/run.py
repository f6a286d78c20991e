"""One training run as a pipeline stage sees it: data -> model -> train -> final model -> test metrics.

Shared by the ``train_asr``, ``train_st`` (and local-attention) stages, which differ only in the
task, the attention spec and where the encoder is initialised from. Paths: :class:`lib.layout.RunPaths`.

    runs/<run>/checkpoints/   last.pt (resume), best.pt, snapshots/, avg_last_k.pt   (not DVC outputs:
    runs/<run>/live/          dvclive logs during training                            kept across kills)
    runs/<run>/model.pt       the final model (``final_checkpoint``: avg_last_k | best | last) + its config
    runs/<run>/timing.json    wall seconds of training and decoding in *this* invocation (a resumed run
                              counts only its own part; kept out of the metrics, which are deterministic)
    data/decoded/<run>/       hyps.<split>.txt (detokenised, manifest order) and refs.<split>.txt
    plots/train/<run>/        the training curves, copied from live/ when the run ends
    metrics/<run>.json        test metrics

The resume state is deliberately not a DVC output: DVC deletes a stage's outputs before running it
(unless ``persist``), and a ``persist`` output turns the run-cache off for the stage. Kept beside
the outputs instead, it survives a kill (``dvc repro`` resumes from ``last.pt``, and the resumed
run appends to its curves in ``live/``), while DVC can still restore a finished run from its
run-cache (the per-seed recipe in docs/pipeline.md relies on that). ``rm -rf runs/*/**/checkpoints``
frees the disk once the results are in.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lib.data.dataset import SpeechDataset, first_batches
from lib.decode.beam_search import BeamSearchConfig, translate_dataset
from lib.decode.metrics import bleu, bleu_signature, chrf, wer
from lib.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from lib.layout import SHARED_SYSTEMS, RunPaths, windows_json
from lib.model.s2t_transformer import ModelConfig, S2TTransformer, model_config
from lib.params import Params, TrainConfig
from lib.precision import PROBE_BATCHES, configure_cuda, resolve_amp, resolve_padding, resolve_train_precision
from lib.train import checkpoint as ckpt
from lib.train.loop import FORK_FILE, OPTIMIZER, Resume, decide_resume, dist_info, fork_is_valid, train

LIVE_PLOTS = Path("plots") / "metrics"  # dvclive's curves inside its folder; copied to RunPaths.curves
FINAL_CHECKPOINTS = {"avg_last_k": "avg_last_k.pt", "best": "best.pt", "last": "last.pt"}


@dataclass
class RunSpec:
    task: str  # "asr" | "st"
    pair: str
    prepared_dir: Path
    paths: RunPaths
    train: TrainConfig
    model_size: str = "demo"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    encoder_attention: list[dict] | None = None
    init_encoder: Path | None = None  # ST: the ASR model.pt
    fork_at: int | None = None  # also keep the training state after this update (RunPaths.fork_state)
    start_from: Path | None = None  # a fork state (another run's RunPaths.fork_state) to continue from
    decode: BeamSearchConfig = field(default_factory=BeamSearchConfig)
    dev_decode: BeamSearchConfig = field(default_factory=lambda: BeamSearchConfig(beam=1))
    decode_batch_frames: int = 20000
    final_checkpoint: str = "avg_last_k"
    test_split: str = "tst-COMMON"
    dev_split: str = "dev"
    max_dev_decode: int = 200  # sentences decoded at each evaluation (greedy)
    # CPU threads of this run (lib.parallel.threads_per_run for per-pair / per-seed runs); None: torch's
    # default (every core). Part of the run's config: the thread count changes the last bits.
    threads: int | None = None


def auto_device() -> torch.device:
    """CUDA when available (with :func:`lib.precision.configure_cuda`'s backend choices), else CPU."""
    if torch.cuda.is_available():
        configure_cuda()
        return torch.device("cuda")
    return torch.device("cpu")


def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes())
    return h.hexdigest()[:16]


def score(task: str, hyps: list[str], refs: list[str]) -> dict[str, float]:
    """ASR: WER (%). ST: sacreBLEU BLEU and chrF on detokenised text against raw references."""
    if task == "asr":
        return {"wer": round(wer(hyps, refs), 2)}
    return {"bleu": round(bleu(hyps, refs), 2), "chrf": round(chrf(hyps, refs), 2)}


def _truncate_live_logs(live_dir: Path, last_step: int) -> None:
    """Drop dvclive rows logged after ``last_step`` (by a run killed after its last checkpoint),
    so that a resumed run does not log those steps twice."""
    for tsv in (live_dir / "plots").rglob("*.tsv") if (live_dir / "plots").exists() else []:
        with open(tsv, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t"))
        if not rows:
            continue
        step_col = rows[0].index("step") if "step" in rows[0] else None
        if step_col is None:
            continue
        kept = [rows[0]] + [r for r in rows[1:] if int(r[step_col]) <= last_step]
        atomic_write_text(tsv, "".join("\t".join(r) + "\n" for r in kept))


class _Subset:
    """The first ``n`` items of a dataset (dev decoding during training stays cheap)."""

    def __init__(self, ds: SpeechDataset, n: int) -> None:
        self.ds, self.n = ds, min(n, len(ds))
        self.n_frames = ds.n_frames[: self.n]
        self.rows, self.targets = ds.rows[: self.n], ds.targets[: self.n]

    def __len__(self) -> int:
        return self.n

    def features(self, i: int) -> torch.Tensor:
        return self.ds.features(i)

    def decode(self, ids: list[int]) -> str:
        return self.ds.decode(ids)


def _fork_or_restart(resume: Resume, ckpt_dir: Path, fork_at: int) -> Resume:
    """A run that must leave a fork state after update ``fork_at`` resumes from last.pt only if it is
    not past that update yet, or if its fork.pt is there: else it restarts (its last.pt was made
    without a fork, e.g. before ``local.asr_pretraining: fork`` was chosen)."""
    if resume.state is None or resume.state["run_state"]["update"] < fork_at:
        return resume
    if fork_is_valid(ckpt_dir, resume.fingerprint, fork_at):
        return resume
    print(f"{ckpt_dir / 'last.pt'}: past update {fork_at} without its fork state ({FORK_FILE}): training again "
          f"from scratch to keep it", file=sys.stderr)
    return Resume(fingerprint=resume.fingerprint, config=resume.config)


def load_fork_state(path: Path) -> dict[str, Any]:
    """A fork state written by :func:`run` with ``fork_at`` (RunPaths.fork_state). ValueError names the file."""
    if not path.is_file():
        raise ValueError(f"{path}: missing; it is written by the ASR stage (local.asr_pretraining: fork)")
    state = ckpt.load(path)
    if "run_state" not in state:
        raise ValueError(f"{path}: not a fork state ({state.get('unused', 'no training state')}); "
                         f"rerun the ASR stage with local.asr_pretraining: fork")
    return state


def _with_train_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the training keys it lacks set to their defaults: a fork state written before a
    key existed (e.g. ``pad_frames_to``, whose default 1 changes nothing) still matches a run that
    leaves it at its default, while any other value of the new key still differs."""
    if not isinstance(config.get("train"), dict):
        return config
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)
                if f.default is not dataclasses.MISSING}
    return {**config, "train": {**defaults, **config["train"]}}


def _start_from_fork(resume: Resume, state: dict[str, Any], path: Path) -> Resume:
    """``resume`` starting from the fork state ``state`` read from ``path`` (another run's training
    state: same hyperparameters, data, precision and model shapes; the attention spec may differ).
    ValueError names the file."""
    theirs, ours = _with_train_defaults(state.get("config", {})), _with_train_defaults(resume.config)
    differ = sorted(k for k in set(theirs) | set(ours)
                    if k not in ("model", "start_from", "threads") and theirs.get(k) != ours.get(k))
    if differ:
        raise ValueError(f"{path}: made by a run with other settings ({', '.join(differ)} differ); "
                         f"a fork continues the same training")
    their_model = {k: v for k, v in theirs.get("model", {}).items() if k != "encoder_attention"}
    our_model = {k: v for k, v in ours.get("model", {}).items() if k != "encoder_attention"}
    if their_model != our_model:
        raise ValueError(f"{path}: made for another model configuration; a fork may change the encoder "
                         f"attention only")
    return Resume(fingerprint=resume.fingerprint, config=resume.config, state=state, fork=True)


def run(spec: RunSpec, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) and evaluate one model; returns the metrics written to ``metrics_path``."""
    from dvclive import Live

    rank, world = dist_info()
    device = auto_device()
    threads = spec.threads if device.type == "cpu" else None
    if threads is not None:  # before the precision probe, which times steps at this thread count
        torch.set_num_threads(threads)
    cfg = spec.train
    if spec.final_checkpoint not in FINAL_CHECKPOINTS:
        raise ValueError(f"final_checkpoint must be one of {sorted(FINAL_CHECKPOINTS)}, got {spec.final_checkpoint!r}")
    train_ds = SpeechDataset(spec.prepared_dir, "train", spec.task, max_frames=cfg.max_frames_train,
                             max_target_tokens=cfg.max_target_tokens)
    dev_ds = SpeechDataset(spec.prepared_dir, spec.dev_split, spec.task)
    test_ds = SpeechDataset(spec.prepared_dir, spec.test_split, spec.task)

    mcfg = model_config(spec.model_size, vocab_size=train_ds.vocab_size,
                        ctc_vocab_size=train_ds.vocab_size if cfg.ctc_weight > 0 else None,
                        encoder_attention=spec.encoder_attention, **spec.model_overrides)
    torch.manual_seed(cfg.seed)  # parameter initialisation is a function of the seed
    model = S2TTransformer(mcfg)
    init_digest = None
    if spec.init_encoder is not None:
        state = ckpt.load(spec.init_encoder)
        report = model.load_encoder_from(state["model"])
        if report.missing and rank == 0:  # attention-variant parameters the source has not: initialised
            print(f"init from {spec.init_encoder}: not in the source, kept at initialisation: "
                  f"{', '.join(report.missing)}", file=sys.stderr)
        if cfg.init_decoder:
            model.load_decoder_layers_from(state["model"])
        init_digest = file_digest(spec.init_encoder)

    data_digest = file_digest(spec.prepared_dir / "train.tsv", spec.prepared_dir / "dev.tsv",
                              spec.prepared_dir / ("spm_asr.model" if spec.task == "asr" else "spm_st.model"))
    fork_state = load_fork_state(spec.start_from) if spec.start_from is not None else None
    if fork_state is not None:  # a fork continues its run's training, in that run's precision
        amp = fork_state["config"]["precision"]
        pad = resolve_padding(cfg.pad_frames_to, cfg.pad_tokens_to, amp, device)
    else:
        amp, pad = resolve_train_precision(cfg, device, mcfg.to_dict(), data_id=data_digest, batches=lambda pad: first_batches(
            train_ds, cfg.max_frames, PROBE_BATCHES, pad_frames_to=pad[0], pad_tokens_to=pad[1]))
    # `auto` padding resolved: the run's config (resume fingerprint, fork state) holds the numbers used
    cfg = dataclasses.replace(cfg, pad_frames_to=pad[0], pad_tokens_to=pad[1])
    decode_amp = resolve_amp(cfg.amp, device)
    if rank == 0:
        print(f"precision: training {amp}, decoding {decode_amp}"
              + (" (the fork state's)" if fork_state is not None else
               f" (amp: auto on {device.type})" if cfg.amp == "auto" else "")
              + (f"; training batches padded to multiples of {pad[0]} frames / {pad[1]} tokens" if pad != (1, 1) else "")
              + (f"; {threads} CPU thread{'s' * (threads > 1)} (parallel.jobs)" if threads is not None else ""),
              file=sys.stderr)
    run_config = {
        "task": spec.task, "model": mcfg.to_dict(), "init_encoder": init_digest,
        "precision": amp,  # `auto` resolves per machine: never resume a run made in another precision
        "optimizer": OPTIMIZER,  # fused Adam: checkpoints of a for-loop Adam do not resume
        "world_size": world,  # the data order per process depends on it: resume only with the same
        "data": data_digest,
    }
    if threads is not None:  # (absent with torch's default: the configs of earlier runs keep their hash)
        run_config["threads"] = threads
    if spec.start_from is not None:  # a fork's continuation is not a run from scratch of the same config
        run_config["start_from"] = file_digest(spec.start_from)
    refs_dev = [dev_ds.reference(i) for i in range(min(spec.max_dev_decode, len(dev_ds)))]
    dev_subset = _Subset(dev_ds, spec.max_dev_decode)

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        hyps = translate_dataset(m, dev_subset, spec.decode_batch_frames, spec.dev_decode, device, progress=False,
                                 amp=decode_amp)
        return score(spec.task, hyps, refs_dev)

    paths = spec.paths
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    # Decided once (rank 0 loads last.pt, moves a mismatching one aside, and broadcasts under
    # torchrun, so every rank calls it): dvclive resumes exactly when training does.
    resume = decide_resume(paths.checkpoints, cfg, run_config)
    if spec.fork_at is not None:
        resume = _fork_or_restart(resume, paths.checkpoints, spec.fork_at)
    if fork_state is not None and resume.state is None:
        resume = _start_from_fork(resume, fork_state, spec.start_from)
    live = None
    if rank == 0:
        if resume.state is not None and not resume.fork:
            update = resume.state["run_state"]["update"]
            if not (paths.live / LIVE_PLOTS).is_dir():
                print(f"warning: {paths.live / LIVE_PLOTS} is missing: the training curves up to update "
                      f"{update} are lost; resuming from {paths.checkpoints / 'last.pt'} all the same",
                      file=sys.stderr)
            _truncate_live_logs(paths.live, update)
        elif paths.live.exists():  # curves of another config (or of an unresumable run): start afresh
            shutil.rmtree(paths.live)
        live = Live(dir=str(paths.live), resume=resume.state is not None and not resume.fork, dvcyaml=False, save_dvc_exp=False,
                    report=None)
    t0 = time.perf_counter()
    summary = train(model, cfg, train_ds, dev_ds, paths.run_dir, run_config=run_config, evaluate=evaluate,
                    device=device, progress=progress, live=live, resume=resume, amp=amp, fork_at=spec.fork_at)
    train_seconds = time.perf_counter() - t0
    if rank != 0:
        return {}
    if spec.fork_at is not None:
        atomic_write_bytes(paths.fork_state, (paths.checkpoints / FORK_FILE).read_bytes())
    if live is not None:
        live.end()
    # The curves are a DVC output: they must exist even when a resumed run had nothing left to log.
    copy_curves(paths.live / LIVE_PLOTS, paths.curves)

    final = ckpt.load(paths.checkpoints / FINAL_CHECKPOINTS[spec.final_checkpoint])
    model.load_state_dict(final["model"])
    model.eval()
    ckpt.save(paths.model, {"model": model.state_dict(), "model_config": mcfg.to_dict(),
                            "task": spec.task, "pair": spec.pair, "checkpoint": spec.final_checkpoint})
    t1 = time.perf_counter()
    hyps = translate_dataset(model, test_ds, spec.decode_batch_frames, spec.decode, device, progress=progress,
                             amp=decode_amp)
    decode_seconds = time.perf_counter() - t1
    refs = [test_ds.reference(i) for i in range(len(test_ds))]
    write_decoded(paths, spec.test_split, hyps, refs)
    metrics: dict[str, Any] = {
        **score(spec.task, hyps, refs),
        "dev_best": summary["best"],
        "updates": summary["updates"],
        "sentences": len(hyps),
        "params": model.num_parameters(),
        "precision": amp,
        "decode_precision": decode_amp,
        "pad_frames_to": cfg.pad_frames_to,  # the training batches' padding as resolved (1: none)
        "pad_tokens_to": cfg.pad_tokens_to,
        "threads": threads if threads is not None else torch.get_num_threads(),
    }
    if spec.task == "st":
        metrics["bleu_signature"] = bleu_signature()
    atomic_write_json(paths.metrics, metrics)
    # Wall times vary run to run: kept out of the metrics so equal seeds give equal metrics files.
    atomic_write_json(paths.timing, {"train_seconds": round(train_seconds, 1),
                                                     "decode_seconds": round(decode_seconds, 1)})
    return metrics


def spec_from_params(p: Params, root: Path, system: str, pair: str, seed: int | None = None,
                     encoder_attention: list[dict] | None = None) -> RunSpec:
    """The RunSpec of one pipeline run from params: ``system`` is ``asr`` (per pair), ``asr_shared``
    (the one English ASR model of ``asr.mode: shared``, trained on ``asr.shared_pair``; ``pair`` is
    ignored), ``asr_local`` (per pair: ASR pretraining with the local-attention spec, when
    ``local.asr_pretraining`` is ``local``; :func:`asr_fork_spec_from_params` adapts it for ``fork``),
    ``baseline`` or ``local`` (per pair and seed). Baseline
    and local runs take the ``train_st`` hyperparameters with their seed and the pair's ASR encoder,
    so they differ in attention only: ``baseline`` starts from runs/asr/<pair>/model.pt, ``local``
    from runs/asr_local/<pair>/model.pt (a copy of the former when ``local.asr_pretraining`` is
    ``shared``)."""
    d = p.decode
    test = BeamSearchConfig(beam=d.beam, len_penalty=d.len_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    dev = BeamSearchConfig(beam=1, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    if system in SHARED_SYSTEMS:  # one model for every pair (asr.mode: shared; local.fork: shared)
        pair = p.asr.shared_pair
        paths, train_cfg, init = RunPaths(root, system), p.train_asr, None
    elif system in ("asr", "asr_local"):
        paths, train_cfg, init = RunPaths(root, system, pair), p.train_asr, None
    else:
        paths = RunPaths(root, system, pair, seed)  # ValueError for an unknown system or a missing seed
        train_cfg = dataclasses.replace(p.train_st, seed=seed)
        init = RunPaths(root, "asr_local" if system == "local" else "asr", pair).model
    from lib.parallel import threads_per_run

    # the shared ASR model trains alone (every core: nothing else is ready then); every other run, the
    # one shared fork included (local runs and baselines of later seeds are ready beside it), shares
    # them (lib/parallel.py)
    threads = None if system == "asr_shared" else threads_per_run(p.parallel.jobs)
    return RunSpec(task="asr" if system.startswith("asr") else "st", pair=pair, threads=threads,
                   prepared_dir=root / p.data.prepared_dir / pair, paths=paths, train=train_cfg,
                   model_size=p.model.size, model_overrides=p.model.overrides, encoder_attention=encoder_attention,
                   init_encoder=init, decode=test, dev_decode=dev, decode_batch_frames=d.batch_frames,
                   final_checkpoint=d.final_checkpoint, max_dev_decode=d.dev_sentences)


def asr_fork_at(p: Params) -> int | None:
    """The update after which an ASR run keeps its training state (``asr.fork_updates`` before its
    end) for ``local.asr_pretraining: fork``; None when ``asr.fork_updates`` is 0."""
    if p.asr.fork_updates == 0:
        return None
    return p.train_asr.max_updates - p.asr.fork_updates


def asr_fork_spec_from_params(p: Params, root: Path, pair: str, encoder_attention: list[dict]) -> RunSpec:
    """``local.asr_pretraining: fork``: the RunSpec (system ``asr_local``) that continues the pair's
    ASR training from its fork state (runs/asr/<pair>/fork.pt: weights, Adam moments, RNG, data
    position and update count ``asr.fork_updates`` before the end) to ``train_asr.max_updates``
    with the local-attention spec ``encoder_attention``: same data (``asr.shared_pair``'s English under
    ``asr.mode: shared``), schedule, batches and precision as the baseline's ASR model, so the two
    ASR models differ only in the attention of their last ``asr.fork_updates`` updates. Its WER is
    measured on that data's tst-COMMON.

    A demo option, not in the paper (whose local model starts from the full-attention ASR model,
    ``shared``): it lets the encoder learn to work inside its windows before ST, at the cost of
    ``asr.fork_updates`` ASR updates per pair and without more ASR training than the baseline had."""
    spec = spec_from_params(p, root, "asr_local", pair, encoder_attention=encoder_attention)
    if p.asr.mode == "shared":
        spec.prepared_dir = root / p.data.prepared_dir / p.asr.shared_pair
    spec.start_from = RunPaths(root, "asr", pair).fork_state
    return spec


def shared_fork_spec_from_params(p: Params, root: Path, encoder_attention: list[dict]) -> RunSpec:
    """``local.fork: shared``: the one fork (system ``asr_local_shared``, runs/asr_local_shared) that
    finishes the shared English ASR training (runs/asr_shared/fork.pt, ``asr.shared_pair``'s data)
    with ``encoder_attention`` (:func:`shared_fork_attention`); every pair's asr_local is a copy of it.
    Like :func:`asr_fork_spec_from_params`, but trained once instead of once per pair."""
    spec = spec_from_params(p, root, "asr_local_shared", p.asr.shared_pair, encoder_attention=encoder_attention)
    spec.start_from = RunPaths(root, "asr_shared").fork_state
    return spec


def shared_fork_attention(p: Params, root: Path) -> list[dict]:
    """The encoder attention of the ``local.fork: shared`` fork: per layer the widest of every pair's
    local-attention spec (:func:`local_encoder_attention`; ``local.windows`` when set, which is the
    same for all pairs). ValueError names the missing windows file."""
    from lib.model.spec import widest_spec

    return widest_spec([local_encoder_attention(p, root, pair) for pair in p.pairs], key="local.fork: shared")


def control_fork_attention(p: Params, root: Path, system: str) -> list[dict]:
    """The encoder attention of control ``system``'s own fork (stage train_asr_control): per layer the
    widest of every pair's control windows (lib.model.spec.control_attention_spec of that pair's
    local spec), as :func:`shared_fork_attention` is for Algorithm 1's. ValueError names what is missing."""
    from lib.model.spec import control_attention_spec, widest_spec

    specs = [control_attention_spec(local_encoder_attention(p, root, pair), system,
                                    shuffle_seed=p.controls.shuffle_seed, key=f"{system} of {pair}'s local windows")
             for pair in p.pairs]
    return widest_spec(specs, key=f"controls.asr_systems: {system}")


def control_fork_spec_from_params(p: Params, root: Path, system: str, encoder_attention: list[dict]) -> RunSpec:
    """Control ``system``'s own fork (``controls.asr_systems``, runs/variants/controls_asr/<system>): the
    shared English ASR training finished from its fork state with ``encoder_attention``
    (:func:`control_fork_attention`), exactly as :func:`shared_fork_spec_from_params` finishes it with
    Algorithm 1's windows for the local system; so a control and `local` start their ST runs from ASR
    models that differ only in the windows of the last ``asr.fork_updates`` updates."""
    spec = shared_fork_spec_from_params(p, root, encoder_attention)
    spec.paths = RunPaths(root, "controls_asr", variant=system)
    return spec


def control_asr_model(p: Params, root: Path, system: str, pair: str) -> Path:
    """The ASR model control ``system``'s ST run starts from: its own fork when it is in
    ``controls.asr_systems``, else the local system's runs/asr_local/<pair>/model.pt."""
    if system in p.controls.asr_systems:
        return RunPaths(root, "controls_asr", variant=system).model
    return RunPaths(root, "asr_local", pair).model


def uses_shared_fork(p: Params) -> bool:
    """Whether train_local's ASR models come from the one shared fork (stage train_asr_local_shared)."""
    return p.local.asr_pretraining == "fork" and p.local.fork == "shared"


def write_no_fork(paths: RunPaths) -> None:
    """The fork-state output of an ASR run that takes no fork: a placeholder naming the mode."""
    ckpt.save(paths.fork_state, {"unused": "no fork state: asr.fork_updates is 0"})


def local_encoder_attention(p: Params, root: Path, pair: str) -> list[dict]:
    """Per-layer encoder attention of the local-attention model: layers 1..analysis.full_layers
    full, the rest local with ``local.windows`` when that list is non-empty, else with the windows
    that select_windows wrote to data/windows/<pair>/windows.json. ValueError names the param or file."""
    from lib.model.spec import local_attention_spec, validate_spec

    n_layers = model_config(p.model.size, **p.model.overrides).encoder_layers
    if p.local.windows:
        return local_attention_spec(n_layers, p.analysis.full_layers, p.local.windows, key="local.windows")
    path = windows_json(root, pair)
    if not path.is_file():
        raise ValueError(f"{path}: missing; it is written by the select_windows stage (or set local.windows)")
    spec = json.loads(path.read_text(encoding="utf-8"))["encoder_attention"]
    return validate_spec(spec, n_layers, key=f"{path}: encoder_attention")


def copy_curves(live_plots: Path | None, curves: Path) -> None:
    """Make ``curves`` (a DVC plots output) a copy of dvclive's ``live_plots`` folder, swapped in whole
    (an empty folder when there is nothing: the output must exist)."""
    tmp = curves.with_name(curves.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if live_plots is not None and live_plots.is_dir():
        shutil.copytree(live_plots, tmp)
    else:
        tmp.mkdir(parents=True)
    if curves.exists():
        shutil.rmtree(curves)
    tmp.rename(curves)


def write_decoded(paths: RunPaths, split: str, hyps: list[str], refs: list[str]) -> None:
    """The run's test hypotheses and references, one per line in manifest order (atomic)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    atomic_write_text(paths.hyps(split), "".join(h + "\n" for h in hyps))
    atomic_write_text(paths.refs(split), "".join(r + "\n" for r in refs))


def _adopt_run(src: RunPaths, dst: RunPaths, hyps: str | None = None) -> None:
    """Make ``dst`` hold ``src``'s model.pt, its decoded test set (or ``hyps`` when given: decoded
    elsewhere; the references are then ``dst``'s own, written by the caller) and its training curves.
    ``dst``'s resume state is removed (it belongs to an earlier run of another model)."""
    dst.run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(dst.model, src.model.read_bytes())
    if hyps is None:
        atomic_write_bytes(dst.hyps(), src.hyps().read_bytes())
        atomic_write_bytes(dst.refs(), src.refs().read_bytes())
    else:
        atomic_write_text(dst.hyps(), hyps)
    for stale in (dst.checkpoints, dst.live):
        if stale.exists():
            shutil.rmtree(stale)
    copy_curves(src.curves, dst.curves)


def share_asr_run(src: RunPaths, dst: RunPaths) -> dict[str, Any]:
    """``local.asr_pretraining: shared``: make ``dst`` (runs/asr_local/<pair>) a faithful copy of the
    baseline's ASR run ``src`` -- model.pt, decoded test set and training curves -- with its metrics
    marked ``"asr_pretraining": "shared"``, so that train_local always starts from
    runs/asr_local/<pair>/model.pt and the copy says where it came from. Every file is written
    atomically; returns the metrics written."""
    for path in (src.model, src.hyps(), src.refs()):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; it is written by the train_asr stage")
    _adopt_run(src, dst)
    atomic_write_json(dst.timing, {"train_seconds": 0.0, "decode_seconds": 0.0})  # a copy: nothing ran
    metrics = {**json.loads(src.metrics.read_text(encoding="utf-8")), "asr_pretraining": "shared"}
    atomic_write_json(dst.metrics, metrics)
    return metrics


def adopt_shared_asr(p: Params, root: Path, pair: str, *, progress: bool = True, source: str = "asr_shared",
                     system: str = "asr") -> dict[str, Any]:
    """``asr.mode: shared``: make runs/asr/<pair> the shared English ASR model (runs/asr_shared,
    trained on ``asr.shared_pair``): model.pt and training curves copied, its tst-COMMON
    hypotheses decoded on *this* pair's test audio (with the shared model's vocabulary) and scored
    against this pair's English references, so metrics/asr/<pair>.json is the shared model's WER
    here. Written atomically. With ``source="asr_local_shared", system="asr_local"`` the same for
    the one fork of ``local.fork: shared`` (no fork state is copied then: a fork has none)."""
    src = RunPaths(root, source)
    stage = {"asr_shared": "train_asr_shared", "asr_local_shared": "train_asr_local_shared"}[source]
    if not src.model.is_file():
        raise FileNotFoundError(f"{src.model}: missing; it is written by the {stage} stage")
    state = ckpt.load(src.model)
    if "model" not in state:
        raise ValueError(f"{src.model}: not a model ({state.get('unused', 'a placeholder')}); "
                         f"run `dvc repro {stage}` again")
    shared_metrics = json.loads(src.metrics.read_text(encoding="utf-8"))
    spec = spec_from_params(p, root, system, pair)
    device = auto_device()
    amp = resolve_amp(spec.train.amp, device)
    model = S2TTransformer(ModelConfig.from_dict(state["model_config"])).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    test_ds = SpeechDataset(spec.prepared_dir, spec.test_split, "asr",
                            vocab_dir=root / p.data.prepared_dir / p.asr.shared_pair)
    t0 = time.perf_counter()
    hyps = translate_dataset(model, test_ds, spec.decode_batch_frames, spec.decode, device, progress=progress, amp=amp)
    refs = [test_ds.reference(i) for i in range(len(test_ds))]
    _adopt_run(src, spec.paths, "".join(h + "\n" for h in hyps))
    if system == "asr":  # an ASR run keeps a fork state (or its placeholder); a fork does not
        if src.fork_state.is_file():
            atomic_write_bytes(spec.paths.fork_state, src.fork_state.read_bytes())
        else:
            write_no_fork(spec.paths)
    write_decoded(spec.paths, spec.test_split, hyps, refs)
    metrics = {**score("asr", hyps, refs), "asr_mode": "shared", "trained_on": p.asr.shared_pair,
               "dev_best": shared_metrics.get("dev_best"), "updates": shared_metrics.get("updates"),
               "sentences": len(hyps), "params": model.num_parameters(),
               "precision": shared_metrics.get("precision"), "decode_precision": amp}
    if source == "asr_local_shared":
        metrics.update({k: shared_metrics[k] for k in ("asr_pretraining", "fork", "forked_at", "windows")
                        if k in shared_metrics})
    atomic_write_json(spec.paths.metrics, metrics)
    atomic_write_json(spec.paths.timing, {"train_seconds": 0.0, "decode_seconds": round(time.perf_counter() - t0, 1)})
    return metrics


def write_unused_shared_asr(root: Path, system: str = "asr_shared", why: str | None = None,
                            metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """``asr.mode: per_pair``: train_asr_shared has nothing to train; it writes placeholders for its
    outputs (a model.pt with no weights that names the mode) so the DVC graph is the same in both modes.
    ``system="asr_local_shared"`` (with ``why`` and ``metrics``): the same for train_asr_local_shared
    when ``local.fork`` is not ``shared`` (no fork-state output there)."""
    paths = RunPaths(root, system)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    ckpt.save(paths.model, {"unused": why or "asr.mode is per_pair: every pair trains its own ASR model (train_asr)"})
    write_decoded(paths, "tst-COMMON", [], [])
    copy_curves(None, paths.curves)
    # a curve with no rows, not an empty folder: git keeps no empty folder, and a fresh clone must
    # find this (git-tracked) plots output or DVC reports the stage as changed
    atomic_write_text(paths.curves / "train" / "loss.tsv", "step\tloss\n")
    if system == "asr_shared":
        write_no_fork(paths)
    atomic_write_json(paths.timing, {"train_seconds": 0.0, "decode_seconds": 0.0})
    metrics = metrics if metrics is not None else {"asr_mode": "per_pair"}
    atomic_write_json(paths.metrics, metrics)
    return metrics


def smoothing_spec_from_params(p: Params, root: Path, name: str, pair: str, seed: int | None = None) -> RunSpec:
    """The RunSpec of one smoothing run (docs/variants.md): ``seed=None`` is the ASR
    pretraining of definition ``name`` (stage train_asr_smoothing, ``train_asr`` hyperparameters, into
    runs/variants/smoothing_asr/<name>/<pair>); with a seed it is the ST run (stage train_smoothing,
    ``train_st`` with that seed), whose encoder starts from that smoothed ASR model when ``name`` is in
    ``smoothing.asr_systems`` and from the baseline's runs/asr/<pair>/model.pt otherwise -- so a
    smoothed ST model differs from the baseline of the same seed in its attention only (and in the
    priors' own parameters, trained at ``smoothing.variant_lr`` outside the encoder's lr scale).

    The definition ``smoothing.defs.<name>`` overlays the encoder's full attention (or, with
    ``base: local``, the local-attention model's spec of :func:`local_encoder_attention`) and sets
    the decoder's self-/cross-attention for the places its ``where`` names. ValueError names the key."""
    from lib.model.spec import smoothing_model_specs

    if name not in p.smoothing.defs:
        raise ValueError(f"smoothing.defs: no system {name!r}; defined: {sorted(p.smoothing.defs)}")
    sdef = p.smoothing.defs[name]
    mcfg = model_config(p.model.size, **p.model.overrides)
    if sdef.get("base", "full") == "local":
        base = local_encoder_attention(p, root, pair)
    else:
        base = [{"type": "full"} for _ in range(mcfg.encoder_layers)]
    encoder, decoder = smoothing_model_specs(base, sdef, mcfg.decoder_layers, key=f"smoothing.defs.{name}")
    overrides = {**p.model.overrides, **{k: v for k, v in decoder.items() if v is not None}}
    if seed is None:
        spec = spec_from_params(p, root, "asr", pair, encoder_attention=encoder)
        spec.paths = RunPaths(root, "smoothing_asr", pair, variant=name)
    else:
        spec = spec_from_params(p, root, "baseline", pair, seed, encoder_attention=encoder)
        spec.paths = RunPaths(root, "smoothing", pair, seed, variant=name)
        if name in p.smoothing.asr_systems:
            spec.init_encoder = RunPaths(root, "smoothing_asr", pair, variant=name).model
    spec.model_overrides = overrides
    # the priors' own parameters (band logits, gate vector and bias) in an optimizer group of their own
    spec.train = dataclasses.replace(spec.train, variant_lr=p.smoothing.variant_lr)
    return spec
