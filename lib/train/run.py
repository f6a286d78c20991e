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
import os
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
from lib.io import InputError, atomic_write_bytes, atomic_write_json, atomic_write_text
from lib.layout import RunPaths
from lib.model import checkpoint as model_file
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.params import TrainConfig
from lib.precision import configure_cuda, resolve_amp, resolve_padding
from lib.parallel import claim_gpu, gpu_keys
from lib.train.precision import PROBE_BATCHES, cache_dir, resolve_train_precision
from lib.train import checkpoint as ckpt
from lib.train.distributed import dist_info
from lib.train.loop import FORK_FILE, OPTIMIZER, fork_is_valid, train
from lib.train.resume import Resume, decide_resume

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
    """CUDA when available (with :func:`lib.precision.configure_cuda`'s backend choices), else CPU.

    With several GPUs and one process (not torchrun, which gives each process its own), the process
    claims the first GPU no other run holds (:func:`lib.parallel.claim_gpu`), so that runs started side
    by side use every GPU; when all are held it shares one, chosen by its process id, and says so."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    configure_cuda()
    n = torch.cuda.device_count()
    if n < 2 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return torch.device("cuda")
    if _claimed_gpu:
        return _claimed_gpu[0]
    i = claim_gpu(gpu_keys(), cache_dir() / "gpu-claims")
    if i is None:
        i = os.getpid() % n
        print(f"all {n} GPUs are held by other runs; sharing cuda:{i}", file=sys.stderr)
    torch.cuda.set_device(i)
    _claimed_gpu.append(torch.device("cuda", i))
    return _claimed_gpu[0]


_claimed_gpu: list[torch.device] = []  # this process's GPU, once chosen


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
    print(f"{ckpt_dir / 'last.pt'}: past update {fork_at} without its fork state ({FORK_FILE}, missing or unreadable): training again "
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


class RunTask:
    """What one kind of run brings to :func:`execute`, the skeleton every training stage shares: its
    datasets and model (with their initialisation), the run's identity, its dev evaluation, what
    training adds for it, and its test decoding and extra outputs. :class:`BilingualTask` is the ASR
    and ST runs' (a :class:`RunSpec`); ``lib.train.multi.MultilingualTask`` the multilingual one.

    ``setup`` sets ``train_ds``, ``dev_ds``, ``model`` and ``mcfg``; ``cfg`` is the run's TrainConfig
    (its ``auto`` padding resolved by the skeleton); ``paths`` where it writes; ``threads`` the CPU
    threads (None: torch's default); ``final_checkpoint`` which state becomes model.pt."""

    paths: RunPaths
    cfg: TrainConfig
    threads: int | None = None
    final_checkpoint: str = "avg_last_k"
    train_ds: Any
    dev_ds: Any
    model: S2TTransformer
    mcfg: Any

    def setup(self, device: torch.device, rank: int) -> None:
        """Datasets, then the model: seeded, built and initialised (from another model file)."""
        raise NotImplementedError

    def data_digest(self) -> str:
        """The training data's identity (resume and the precision probe's cache key)."""
        raise NotImplementedError

    def precision(self, device: torch.device, data_digest: str) -> tuple[str, tuple[int, int]]:
        """The training precision and the batches' padding: measured or read from the params."""
        cfg = self.cfg
        return resolve_train_precision(cfg, device, self.mcfg.to_dict(), data_id=data_digest, batches=lambda pad: first_batches(
            self.train_ds, cfg.max_frames, PROBE_BATCHES, pad_frames_to=pad[0], pad_tokens_to=pad[1]))

    def describe(self, amp: str, decode_amp: str, pad: tuple[int, int], device: torch.device) -> str:
        """The one line printed before training."""
        raise NotImplementedError

    def run_config(self, amp: str, world: int, data_digest: str, threads: int | None) -> dict[str, Any]:
        """Everything that defines the run besides ``cfg`` (its hash decides whether last.pt resumes).
        ``threads``: the CPU threads set for the run, None with torch's default."""
        raise NotImplementedError

    def adjust_resume(self, resume: Resume) -> Resume:
        return resume

    def evaluate(self, model: torch.nn.Module, device: torch.device, decode_amp: str) -> dict[str, float]:
        """The dev scores of each evaluation during training."""
        raise NotImplementedError

    def train_options(self) -> dict[str, Any]:
        """What the variant adds to :func:`lib.train.loop.train` (``kl_weight``, ``update_hooks``, ``fork_at``)."""
        return {}

    def after_training(self) -> None:
        """Outputs of the training itself (rank 0), before the final model is chosen."""

    def model_fields(self) -> dict[str, Any]:
        """The fields model.pt carries besides the weights and the config."""
        raise NotImplementedError

    def test(self, model: S2TTransformer, device: torch.device, decode_amp: str, progress: bool) -> Any:
        """Decode the test split(s) and write the hypotheses; returns what ``metrics`` needs."""
        raise NotImplementedError

    def metrics(self, decoded: Any, summary: dict[str, Any], amp: str, decode_amp: str, threads: int) -> dict[str, Any]:
        """The metrics file's content (``threads``: the CPU threads the run trained with)."""
        raise NotImplementedError

    def timing(self, decoded: Any, train_seconds: float, decode_seconds: float) -> dict[str, Any]:
        return {"train_seconds": round(train_seconds, 1), "decode_seconds": round(decode_seconds, 1)}

    def extra_outputs(self, decoded: Any, timing: dict[str, Any]) -> None:
        """Outputs beyond the model, metrics and timing (rank 0, at the end)."""


def execute(task: RunTask, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) and evaluate one run; returns the metrics written to ``task.paths.metrics``."""
    from lib.train.live import TrainingLive

    rank, world = dist_info()
    device = auto_device()
    threads = task.threads if device.type == "cpu" else None
    if threads is not None:  # before the precision probe, which times steps at this thread count
        torch.set_num_threads(threads)
    if task.final_checkpoint not in FINAL_CHECKPOINTS:
        raise ValueError(f"final_checkpoint must be one of {sorted(FINAL_CHECKPOINTS)}, got {task.final_checkpoint!r}")
    task.setup(device, rank)
    model = task.model
    data_digest = task.data_digest()
    amp, pad = task.precision(device, data_digest)
    # `auto` padding resolved: the run's config (resume fingerprint, fork state) holds the numbers used
    task.cfg = cfg = dataclasses.replace(task.cfg, pad_frames_to=pad[0], pad_tokens_to=pad[1])
    decode_amp = resolve_amp(cfg.amp, device)
    if amp == "fp64":  # exactness checks: every weight, activation, gradient and optimizer state in float64
        model.double()
    tf32 = device.type == "cuda" and amp == "none"
    if tf32:  # fp32 training on a card: its matmuls and convolutions on the tensor cores (TF32)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if rank == 0:
        print(task.describe(amp, decode_amp, pad, device) + ("; fp32 matmuls in TF32" if tf32 else "")
              + (f"; {threads} CPU thread{'s' * (threads > 1)} (parallel.jobs)" if threads is not None else ""),
              file=sys.stderr)
    run_config = task.run_config(amp, world, data_digest, threads)

    paths = task.paths
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    # Decided once (rank 0 loads last.pt, moves a mismatching one aside, and broadcasts under
    # torchrun, so every rank calls it): dvclive resumes exactly when training does.
    resume = task.adjust_resume(decide_resume(paths.checkpoints, cfg, run_config, live_dir=paths.live))
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
        live = TrainingLive(dir=str(paths.live), resume=resume.state is not None and not resume.fork, dvcyaml=False,
                            save_dvc_exp=False, report=None)
    t0 = time.perf_counter()
    summary = train(model, cfg, task.train_ds, task.dev_ds, paths.run_dir, run_config=run_config,
                    evaluate=lambda m: task.evaluate(m, device, decode_amp), device=device, progress=progress,
                    live=live, resume=resume, amp=amp, **task.train_options())
    train_seconds = time.perf_counter() - t0
    if rank != 0:
        return {}
    task.after_training()
    if live is not None:
        live.end()
    # The curves are a DVC output: they must exist even when a resumed run had nothing left to log.
    copy_curves(paths.live / LIVE_PLOTS, paths.curves)

    final = ckpt.load(paths.checkpoints / FINAL_CHECKPOINTS[task.final_checkpoint])
    model.load_state_dict(final["model"])
    model.eval()
    model_file.save_model(paths.model, model, task.mcfg, **task.model_fields())
    t1 = time.perf_counter()
    decoded = task.test(model, device, decode_amp, progress)
    decode_seconds = time.perf_counter() - t1
    metrics = task.metrics(decoded, summary, amp, decode_amp, threads if threads is not None else torch.get_num_threads())
    atomic_write_json(paths.metrics, metrics)
    # Wall times vary run to run: kept out of the metrics so equal seeds give equal metrics files.
    timing = task.timing(decoded, train_seconds, decode_seconds)
    atomic_write_json(paths.timing, timing)
    task.extra_outputs(decoded, timing)
    return metrics


class BilingualTask(RunTask):
    """An ASR or ST run of one pair (:class:`RunSpec`): the ASR and ST stages, local attention, the
    controls and the smoothing variant."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec, self.paths, self.cfg = spec, spec.paths, spec.train
        self.threads, self.final_checkpoint = spec.threads, spec.final_checkpoint
        self.fork_state: dict[str, Any] | None = None
        self.init_digest: str | None = None

    def setup(self, device: torch.device, rank: int) -> None:
        spec, cfg = self.spec, self.cfg
        self.train_ds = SpeechDataset(spec.prepared_dir, "train", spec.task, max_frames=cfg.max_frames_train,
                                      max_target_tokens=cfg.max_target_tokens)
        self.dev_ds = SpeechDataset(spec.prepared_dir, spec.dev_split, spec.task)
        self.test_ds = SpeechDataset(spec.prepared_dir, spec.test_split, spec.task)
        self.mcfg = model_config(spec.model_size, vocab_size=self.train_ds.vocab_size,
                                 ctc_vocab_size=self.train_ds.vocab_size if cfg.ctc_weight > 0 else None,
                                 encoder_attention=spec.encoder_attention, **spec.model_overrides)
        torch.manual_seed(cfg.seed)  # parameter initialisation is a function of the seed
        self.model = model = S2TTransformer(self.mcfg)
        if spec.init_encoder is not None:
            state = ckpt.load(spec.init_encoder)
            if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
                what = state.get("unused", "no weights") if isinstance(state, dict) else type(state).__name__
                raise InputError(f"{spec.init_encoder}: not a model to start the encoder from ({what}); "
                                 f"rerun the stage that writes it")
            try:
                report = model_file.load_encoder(model, state["model"])
                if cfg.init_decoder:
                    model_file.load_decoder_layers(model, state["model"])
            except ValueError as e:  # another model size or version: the file, not this run, is wrong
                raise InputError(f"{spec.init_encoder}: does not fit this run's model: {e}") from None
            if report.missing and rank == 0:  # attention-variant parameters the source has not: initialised
                print(f"init from {spec.init_encoder}: not in the source, kept at initialisation: "
                      f"{', '.join(report.missing)}", file=sys.stderr)
            self.init_digest = file_digest(spec.init_encoder)
        self.refs_dev = [self.dev_ds.reference(i) for i in range(min(spec.max_dev_decode, len(self.dev_ds)))]
        self.dev_subset = _Subset(self.dev_ds, spec.max_dev_decode)

    def data_digest(self) -> str:
        d = self.spec.prepared_dir
        return file_digest(d / "train.tsv", d / "dev.tsv", d / ("spm_asr.model" if self.spec.task == "asr" else "spm_st.model"))

    def precision(self, device: torch.device, data_digest: str) -> tuple[str, tuple[int, int]]:
        if self.spec.start_from is None:
            return super().precision(device, data_digest)
        # a fork continues its run's training, in that run's precision
        self.fork_state = load_fork_state(self.spec.start_from)
        amp = self.fork_state["config"]["precision"]
        return amp, resolve_padding(self.cfg.pad_frames_to, self.cfg.pad_tokens_to, amp, device)

    def describe(self, amp: str, decode_amp: str, pad: tuple[int, int], device: torch.device) -> str:
        return (f"precision: training {amp}, decoding {decode_amp}"
                + (" (the fork state's)" if self.fork_state is not None else
                   f" (amp: auto on {device.type})" if self.spec.train.amp == "auto" else "")
                + (f"; training batches padded to multiples of {pad[0]} frames / {pad[1]} tokens" if pad != (1, 1) else ""))

    def run_config(self, amp: str, world: int, data_digest: str, threads: int | None) -> dict[str, Any]:
        config = {
            "task": self.spec.task, "model": self.mcfg.to_dict(), "init_encoder": self.init_digest,
            "precision": amp,  # `auto` resolves per machine: never resume a run made in another precision
            "optimizer": OPTIMIZER,  # fused Adam: checkpoints of a for-loop Adam do not resume
            "world_size": world,  # the data order per process depends on it: resume only with the same
            "data": data_digest,
        }
        if threads is not None:  # (absent with torch's default: the configs of earlier runs keep their hash)
            config["threads"] = threads
        if self.spec.start_from is not None:  # a fork's continuation is not a run from scratch of the same config
            config["start_from"] = file_digest(self.spec.start_from)
        return config

    def adjust_resume(self, resume: Resume) -> Resume:
        if self.spec.fork_at is not None:
            resume = _fork_or_restart(resume, self.paths.checkpoints, self.spec.fork_at)
        if self.fork_state is not None and resume.state is None:
            resume = _start_from_fork(resume, self.fork_state, self.spec.start_from)
        return resume

    def evaluate(self, model: torch.nn.Module, device: torch.device, decode_amp: str) -> dict[str, float]:
        spec = self.spec
        hyps = translate_dataset(model, self.dev_subset, spec.decode_batch_frames, spec.dev_decode, device,
                                 progress=False, amp=decode_amp)
        return score(spec.task, hyps, self.refs_dev)

    def train_options(self) -> dict[str, Any]:
        return {"fork_at": self.spec.fork_at}

    def after_training(self) -> None:
        if self.spec.fork_at is not None:
            atomic_write_bytes(self.paths.fork_state, (self.paths.checkpoints / FORK_FILE).read_bytes())

    def model_fields(self) -> dict[str, Any]:
        return {"task": self.spec.task, "pair": self.spec.pair, "checkpoint": self.spec.final_checkpoint}

    def test(self, model: S2TTransformer, device: torch.device, decode_amp: str, progress: bool) -> Any:
        spec = self.spec
        hyps = translate_dataset(model, self.test_ds, spec.decode_batch_frames, spec.decode, device,
                                 progress=progress, amp=decode_amp)
        refs = [self.test_ds.reference(i) for i in range(len(self.test_ds))]
        write_decoded(self.paths, spec.test_split, hyps, refs)
        return hyps, refs

    def metrics(self, decoded: Any, summary: dict[str, Any], amp: str, decode_amp: str, threads: int) -> dict[str, Any]:
        hyps, refs = decoded
        metrics: dict[str, Any] = {
            **score(self.spec.task, hyps, refs),
            "dev_best": summary["best"],
            "updates": summary["updates"],
            "sentences": len(hyps),
            "params": self.model.num_parameters(),
            "precision": amp,
            "decode_precision": decode_amp,
            "pad_frames_to": self.cfg.pad_frames_to,  # the training batches' padding as resolved (1: none)
            "pad_tokens_to": self.cfg.pad_tokens_to,
            "threads": threads,
        }
        if self.spec.task == "st":
            metrics["bleu_signature"] = bleu_signature()
        return metrics


def run(spec: RunSpec, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) and evaluate one model; returns the metrics written to ``metrics_path``."""
    return execute(BilingualTask(spec), progress)


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


