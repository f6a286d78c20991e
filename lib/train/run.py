"""One training run as a pipeline stage sees it: data -> model -> train -> final model -> test metrics.

Shared by the ``train_asr``, ``train_st`` (and local-attention) stages, which differ only in the
task, the attention spec and where the encoder is initialised from. Outputs in ``out_dir``:

    checkpoints/         last.pt (resume), best.pt, snapshots/, avg_last_k.pt
    live/                dvclive logs (train loss, lr, dev loss, dev BLEU or WER per evaluation)
    model.pt             the final model (``final_checkpoint``: avg_last_k | best | last) + its config
    hyps.<split>.txt     detokenised test hypotheses, one per line, in manifest order
    timing.json          wall seconds of training and decoding in *this* invocation (a resumed run
                         counts only its own part; kept out of the metrics, which are deterministic)
and the metrics JSON at ``metrics_path``. ``live/`` and ``checkpoints/`` are persistent DVC outputs,
so a run resumed by ``dvc repro`` after a kill appends to its curves.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lib.data.dataset import SpeechDataset
from lib.decode.beam_search import BeamSearchConfig, translate_dataset
from lib.decode.metrics import bleu, bleu_signature, chrf, wer
from lib.io import atomic_write_json, atomic_write_text
from lib.model.s2t_transformer import ModelConfig, S2TTransformer, model_config
from lib.precision import resolve_amp
from lib.train import checkpoint as ckpt
from lib.train.loop import TrainConfig, dist_info, train

SYSTEMS = ("asr", "asr_shared", "asr_local", "st", "local")
LIVE_PLOTS = Path("live") / "plots" / "metrics"  # dvclive curves, declared as plots in dvc.yaml
FINAL_CHECKPOINTS = {"avg_last_k": "avg_last_k.pt", "best": "best.pt", "last": "last.pt"}


@dataclass
class RunSpec:
    task: str  # "asr" | "st"
    pair: str
    prepared_dir: Path
    out_dir: Path
    metrics_path: Path
    train: TrainConfig
    model_size: str = "demo"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    encoder_attention: list[dict] | None = None
    init_encoder: Path | None = None  # ST: the ASR model.pt
    decode: BeamSearchConfig = field(default_factory=BeamSearchConfig)
    dev_decode: BeamSearchConfig = field(default_factory=lambda: BeamSearchConfig(beam=1))
    decode_batch_frames: int = 20000
    final_checkpoint: str = "avg_last_k"
    test_split: str = "tst-COMMON"
    dev_split: str = "dev"
    max_dev_decode: int = 200  # sentences decoded at each evaluation (greedy)


def auto_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


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


def run(spec: RunSpec, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) and evaluate one model; returns the metrics written to ``metrics_path``."""
    from dvclive import Live

    rank, world = dist_info()
    device = auto_device()
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
        model.load_encoder_from(state["model"])
        if cfg.init_decoder:
            model.load_decoder_layers_from(state["model"])
        init_digest = file_digest(spec.init_encoder)

    amp = resolve_amp(cfg.amp, device)
    if rank == 0:
        print(f"precision: {amp}" + (f" (amp: auto on {device.type})" if cfg.amp == "auto" else ""), file=sys.stderr)
    run_config = {
        "task": spec.task, "model": mcfg.to_dict(), "init_encoder": init_digest,
        "precision": amp,  # `auto` resolves per machine: never resume a run made in another precision
        "world_size": world,  # the data order per process depends on it: resume only with the same
        "data": file_digest(spec.prepared_dir / "train.tsv", spec.prepared_dir / "dev.tsv",
                            spec.prepared_dir / ("spm_asr.model" if spec.task == "asr" else "spm_st.model")),
    }
    refs_dev = [dev_ds.reference(i) for i in range(min(spec.max_dev_decode, len(dev_ds)))]
    dev_subset = _Subset(dev_ds, spec.max_dev_decode)

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        hyps = translate_dataset(m, dev_subset, spec.decode_batch_frames, spec.dev_decode, device, progress=False,
                                 amp=amp)
        return score(spec.task, hyps, refs_dev)

    spec.out_dir.mkdir(parents=True, exist_ok=True)
    live = None
    if rank == 0:
        last = spec.out_dir / "checkpoints" / "last.pt"
        resuming = last.is_file() and ckpt.load(last).get("fingerprint") == ckpt.fingerprint(
            {"train": asdict(cfg), **run_config})
        if resuming:
            update = ckpt.load(last)["run_state"]["update"]
            if not (spec.out_dir / LIVE_PLOTS).is_dir():
                print(f"warning: {spec.out_dir / LIVE_PLOTS} is missing: the training curves up to update "
                      f"{update} are lost; resuming from {last} all the same", file=sys.stderr)
            _truncate_live_logs(spec.out_dir / "live", update)
        live = Live(dir=str(spec.out_dir / "live"), resume=resuming, dvcyaml=False, save_dvc_exp=False, report=None)
    t0 = time.perf_counter()
    summary = train(model, cfg, train_ds, dev_ds, spec.out_dir, run_config=run_config, evaluate=evaluate,
                    device=device, progress=progress, live=live)
    train_seconds = time.perf_counter() - t0
    if rank != 0:
        return {}
    if live is not None:
        live.end()
    # The curves are a DVC output: they must exist even when a resumed run had nothing left to log.
    (spec.out_dir / LIVE_PLOTS).mkdir(parents=True, exist_ok=True)

    final = ckpt.load(spec.out_dir / "checkpoints" / FINAL_CHECKPOINTS[spec.final_checkpoint])
    model.load_state_dict(final["model"])
    model.eval()
    ckpt.save(spec.out_dir / "model.pt", {"model": model.state_dict(), "model_config": mcfg.to_dict(),
                                          "task": spec.task, "pair": spec.pair, "checkpoint": spec.final_checkpoint})
    t1 = time.perf_counter()
    hyps = translate_dataset(model, test_ds, spec.decode_batch_frames, spec.decode, device, progress=progress,
                             amp=amp)
    decode_seconds = time.perf_counter() - t1
    refs = [test_ds.reference(i) for i in range(len(test_ds))]
    atomic_write_text(spec.out_dir / f"hyps.{spec.test_split}.txt", "".join(h + "\n" for h in hyps))
    metrics: dict[str, Any] = {
        **score(spec.task, hyps, refs),
        "dev_best": summary["best"],
        "updates": summary["updates"],
        "sentences": len(hyps),
        "params": model.num_parameters(),
        "precision": amp,
    }
    if spec.task == "st":
        metrics["bleu_signature"] = bleu_signature()
    atomic_write_json(spec.metrics_path, metrics)
    # Wall times vary run to run: kept out of the metrics so equal seeds give equal metrics files.
    atomic_write_json(spec.out_dir / "timing.json", {"train_seconds": round(train_seconds, 1),
                                                     "decode_seconds": round(decode_seconds, 1)})
    return metrics


def spec_from_params(p: Any, root: Path, system: str, pair: str, seed: int | None = None,
                     encoder_attention: list[dict] | None = None) -> RunSpec:
    """The RunSpec of one pipeline run from params: ``system`` is ``asr`` (per pair), ``asr_shared``
    (the one English ASR model of ``asr.mode: shared``, trained on ``asr.shared_pair``; ``pair`` is
    ignored), ``asr_local``
    (per pair: ASR pretraining with the local-attention spec, when ``local.asr_pretraining`` is
    ``local``), ``st`` (the baseline) or ``local`` (per pair and seed). ST and local runs take the
    ``train_st`` hyperparameters with their seed and the pair's ASR encoder, so they differ in
    attention only: ``st`` starts from runs/asr/<pair>/model.pt, ``local`` from
    runs/asr_local/<pair>/model.pt (which is a copy of the former unless ``local.asr_pretraining``
    is ``local``)."""
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; known: {list(SYSTEMS)}")
    d = p.decode
    test = BeamSearchConfig(beam=d.beam, len_penalty=d.len_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    dev = BeamSearchConfig(beam=1, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    if system == "asr_shared":  # one English ASR model for every pair (asr.mode: shared)
        pair = p.asr.shared_pair
        out_dir, metrics_path = root / "runs" / system, root / "metrics" / f"{system}.json"
        train_cfg, init = p.train_asr, None
    elif system in ("asr", "asr_local"):
        out_dir, metrics_path = root / "runs" / system / pair, root / "metrics" / system / f"{pair}.json"
        train_cfg, init = p.train_asr, None
    else:
        if seed is None:
            raise ValueError(f"system {system!r} needs a seed")
        out_dir = root / "runs" / system / pair / f"seed{seed}"
        metrics_path = root / "metrics" / system / pair / f"seed{seed}.json"
        train_cfg = dataclasses.replace(p.train_st, seed=seed)
        init = root / "runs" / ("asr_local" if system == "local" else "asr") / pair / "model.pt"
    return RunSpec(task="asr" if system.startswith("asr") else "st", pair=pair,
                   prepared_dir=root / p.data.prepared_dir / pair,
                   out_dir=out_dir, metrics_path=metrics_path, train=train_cfg, model_size=p.model.size,
                   model_overrides=p.model.overrides, encoder_attention=encoder_attention, init_encoder=init,
                   decode=test, dev_decode=dev, decode_batch_frames=d.batch_frames,
                   final_checkpoint=d.final_checkpoint, max_dev_decode=d.dev_sentences)


def local_encoder_attention(p: Any, root: Path, pair: str) -> list[dict]:
    """Per-layer encoder attention of the local-attention model: layers 1..analysis.full_layers
    full, the rest local with ``local.windows`` when that list is non-empty, else with the windows
    that select_windows wrote to data/windows/<pair>/windows.json. ValueError names the param or file."""
    from lib.analysis.pipeline import analysis_params
    from lib.model.spec import local_attention_spec, validate_spec

    n_layers = model_config(p.model.size, **p.model.overrides).encoder_layers
    if p.local.windows:
        return local_attention_spec(n_layers, analysis_params(p).full_layers, p.local.windows, key="local.windows")
    path = root / "data" / "windows" / pair / "windows.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing; it is written by the select_windows stage (or set local.windows)")
    spec = json.loads(path.read_text(encoding="utf-8"))["encoder_attention"]
    return validate_spec(spec, n_layers, key=f"{path}: encoder_attention")


def _adopt_run_dir(src_dir: Path, dst_dir: Path, hyps: str | None = None) -> None:
    """Make ``dst_dir`` hold ``src_dir``'s model.pt, its tst-COMMON hypotheses (or ``hyps`` when
    given: decoded elsewhere) and its training curves, with an empty ``checkpoints/`` (they are the
    source run's). Files are written atomically, the curves folder is swapped in whole."""
    import shutil

    from lib.io import atomic_write_bytes

    dst_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(dst_dir / "model.pt", (src_dir / "model.pt").read_bytes())
    if hyps is None:
        atomic_write_bytes(dst_dir / "hyps.tst-COMMON.txt", (src_dir / "hyps.tst-COMMON.txt").read_bytes())
    else:
        atomic_write_text(dst_dir / "hyps.tst-COMMON.txt", hyps)
    if (dst_dir / "checkpoints").exists():
        shutil.rmtree(dst_dir / "checkpoints")
    (dst_dir / "checkpoints").mkdir()
    tmp = dst_dir / "live.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if (src_dir / "live").is_dir():
        shutil.copytree(src_dir / "live", tmp)
    else:
        (tmp / LIVE_PLOTS.relative_to("live")).mkdir(parents=True)
    if (dst_dir / "live").exists():
        shutil.rmtree(dst_dir / "live")
    tmp.rename(dst_dir / "live")


def share_asr_run(src_dir: Path, src_metrics: Path, dst_dir: Path, dst_metrics: Path) -> dict[str, Any]:
    """``local.asr_pretraining: shared``: make ``dst_dir`` (runs/asr_local/<pair>) a faithful copy of
    the baseline's ASR run ``src_dir`` -- model.pt, test hypotheses and training curves -- with its
    metrics marked ``"asr_pretraining": "shared"``, so that train_local always starts from
    runs/asr_local/<pair>/model.pt and the copy says where it came from. ``dst_dir/checkpoints``
    is left empty (checkpoints of an earlier ``local`` run are removed: they are not this model's).
    Every file is written atomically; returns the metrics written."""
    for name in ("model.pt", "hyps.tst-COMMON.txt"):
        if not (src_dir / name).is_file():
            raise FileNotFoundError(f"{src_dir / name}: missing; it is written by the train_asr stage")
    _adopt_run_dir(src_dir, dst_dir)
    metrics = {**json.loads(src_metrics.read_text(encoding="utf-8")), "asr_pretraining": "shared"}
    atomic_write_json(dst_metrics, metrics)
    return metrics


def adopt_shared_asr(p: Any, root: Path, pair: str, *, progress: bool = True) -> dict[str, Any]:
    """``asr.mode: shared``: make runs/asr/<pair> the shared English ASR model (runs/asr_shared,
    trained on ``asr.shared_pair``): model.pt and training curves copied, its tst-COMMON
    hypotheses decoded on *this* pair's test audio (with the shared model's vocabulary) and scored
    against this pair's English references, so metrics/asr/<pair>.json is the shared model's WER
    here. ``checkpoints/`` is left empty (they are the shared run's). Written atomically."""
    src = root / "runs" / "asr_shared"
    if not (src / "model.pt").is_file():
        raise FileNotFoundError(f"{src / 'model.pt'}: missing; it is written by the train_asr_shared stage")
    state = ckpt.load(src / "model.pt")
    if "model" not in state:
        raise ValueError(f"{src / 'model.pt'}: not a model (train_asr_shared ran with asr.mode: per_pair); "
                         f"run `dvc repro train_asr_shared` again")
    shared_metrics = json.loads((root / "metrics" / "asr_shared.json").read_text(encoding="utf-8"))
    spec = spec_from_params(p, root, "asr", pair)
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
    _adopt_run_dir(src, spec.out_dir, "".join(h + "\n" for h in hyps))
    metrics = {**score("asr", hyps, refs), "asr_mode": "shared", "trained_on": p.asr.shared_pair,
               "dev_best": shared_metrics.get("dev_best"), "updates": shared_metrics.get("updates"),
               "sentences": len(hyps), "params": model.num_parameters(), "precision": amp}
    atomic_write_json(spec.metrics_path, metrics)
    atomic_write_json(spec.out_dir / "timing.json", {"train_seconds": 0.0,
                                                     "decode_seconds": round(time.perf_counter() - t0, 1)})
    return metrics


def write_unused_shared_asr(root: Path) -> dict[str, Any]:
    """``asr.mode: per_pair``: train_asr_shared has nothing to train; it writes placeholders for its
    outputs (a model.pt with no weights that names the mode) so the DVC graph is the same in both modes."""
    from lib.io import atomic_write_bytes

    out = root / "runs" / "asr_shared"
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    (out / LIVE_PLOTS).mkdir(parents=True, exist_ok=True)
    ckpt.save(out / "model.pt", {"unused": "asr.mode is per_pair: every pair trains its own ASR model (train_asr)"})
    atomic_write_bytes(out / "hyps.tst-COMMON.txt", b"")
    atomic_write_json(out / "timing.json", {"train_seconds": 0.0, "decode_seconds": 0.0})
    metrics = {"asr_mode": "per_pair"}
    atomic_write_json(root / "metrics" / "asr_shared.json", metrics)
    return metrics
