"""Benchmark: the real training loop on one GPU, data loading included, on a MuST-C-like length mix.

benchmarks/gpu.py times the update on batches already in memory. This one times what a run does per
update: ``lib.train.loop.train`` reading a prepared corpus from disk (memory-mapped features,
utterance CMVN, SpecAugment, collation, pinned copies), the paper-size model with the paper's
En-De windows, update_freq 8 × 40k-frame batches, bf16 on CUDA.

The corpus is synthetic, written in the prepared layout (``<split>.tsv``, ``<split>.fbank.npy``,
``spm_st.model``) to a temporary folder (``--data DIR`` keeps it): ``--utterances`` training
utterances with MuST-C-like lengths (log-normal around 5.5 s, 0.5-30 s: gpu.py's
``mustc_like_lengths``), random features, and targets of random words, about one per 20 frames, from a
SentencePiece model of about ``--vocab`` pieces. An epoch is a few updates; the loop goes on into
the next one, as a run does.

Modes, each a fresh model from the same seed, ``--updates`` timed updates after ``--warmup``:

- ``accumulated_serial``: ``fold_update: off``, batches collated after each update (``prefetch``
  off): the loop without its background collation;
- ``accumulated``: ``fold_update: off``, the next update's batches collated while this one runs
  (``data_workers: auto``: in worker processes, lib/train/feed.py);
- ``folded``: ``fold_update: on`` (the update's 8 batches as one), prefetch on;
- ``auto``: ``fold_update: auto``, the default: folds where the measured memory says it fits;
- ``auto_thread``: ``auto`` with ``data_workers: 0``: the batches collated in one background thread,
  as the loop did before its worker processes.

One JSON line per mode: ``ms_per_update`` (median over the timed updates; an update is the time
between the starts of two updates, so it holds the batches' collation where it is not hidden, the
forward and backward, the once-per-update reads and the optimizer), ``ratio`` = ms /
``accumulated_serial``'s, the frames per update and the last logged loss. With ``--sync-check``
(CUDA only) a first run of ``auto``, before the timed modes (so that a run cut short by a time limit
still has it), under ``torch.cuda.set_sync_debug_mode("warn")`` counts the synchronising calls per
update and names where they come from (``loop_syncs``): by design once per update (the loss parts,
the gradient norm), never per batch or per utterance. With ``--oom-check`` (CUDA only; next, before
the timed modes) a folded update runs out of memory for real under a capped memory fraction and the
run goes on accumulating (``oom_recovery``, :func:`oom_figure`).

Usage:  python benchmarks/gpu_loop.py [--updates 10] [--warmup 3] [--utterances 4000] [--vocab 8000]
                                      [--sync-check] [--oom-check] [--data DIR] [--cpu-smoke]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.gpu import mustc_like_lengths  # noqa: E402
from lib.data.dataset import SpeechDataset  # noqa: E402
from lib.data.manifest import MANIFEST_COLUMNS, tsv_writer  # noqa: E402
from lib.data.store import FeatureStoreWriter  # noqa: E402
from lib.data.vocab import train_sentencepiece  # noqa: E402
from lib.model.s2t_transformer import S2TTransformer, model_config  # noqa: E402
from lib.paper import EN_DE_WINDOWS, FULL_LAYERS  # noqa: E402
from lib.params import TrainConfig  # noqa: E402
from lib.precision import configure_cuda  # noqa: E402
from lib.train.loop import train  # noqa: E402

MODES = {  # name: (fold_update, prefetch, data_workers)
    "accumulated_serial": ("off", False, 0),
    "accumulated": ("off", True, "auto"),
    "folded": ("on", True, "auto"),
    "auto": ("auto", True, "auto"),
    "auto_thread": ("auto", True, 0),
}


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def synthetic_prepared(folder: Path, n_train: int, n_dev: int, vocab: int, *, seed: int = 3, n_mels: int = 80,
                       frames_per_token: int = 20, scale: float = 1.0) -> dict:
    """Write a prepared pair folder (the layout of lib/data/prepare.py) of random features with
    MuST-C-like lengths (× ``scale``) and random-word targets; returns its sizes."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    words = sorted({"".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
                    for _ in range(int(1.5 * vocab) + 50)})
    gen = np.random.default_rng(seed)
    texts: list[str] = []
    sizes = {}
    for split, n, split_seed in (("train", n_train, seed), ("dev", n_dev, seed + 1)):
        lengths = [max(8, round(x * scale)) for x in mustc_like_lengths(n, split_seed)]
        rows = []
        with FeatureStoreWriter(folder / f"{split}.fbank.npy", sum(lengths), n_mels) as store:
            for i, n_frames in enumerate(lengths):
                ref = store.write(gen.standard_normal((n_frames, n_mels), dtype=np.float32))
                text = " ".join(rng.choice(words) for _ in range(min(200, max(3, n_frames // frames_per_token))))
                texts.append(text)
                rows.append((f"{split}_{i}", ref, str(n_frames), text, text, "spk"))
        with open(folder / f"{split}.tsv", "w", encoding="utf-8", newline="") as f:
            w = tsv_writer(f)
            w.writerow(MANIFEST_COLUMNS)
            w.writerows(rows)
        sizes[split] = {"utterances": n, "frames": sum(lengths)}
    sizes["vocab"] = train_sentencepiece(texts, folder / "spm_st.model", vocab)
    (folder / "spm_asr.model").write_bytes((folder / "spm_st.model").read_bytes())
    return sizes


def paper_model(size: str, vocab: int, seed: int = 0) -> S2TTransformer:
    """The ``size`` model with the paper's attention: layers 1-3 full, 4-12 local with its En-De windows."""
    layers = model_config(size, vocab_size=vocab).encoder_layers
    spec = ([{"type": "full"}] * FULL_LAYERS + [{"type": "local", "window": w} for w in EN_DE_WINDOWS])[:layers]
    spec += [{"type": "full"}] * (layers - len(spec))
    torch.manual_seed(seed)
    return S2TTransformer(model_config(size, vocab_size=vocab, encoder_attention=spec))


def run_mode(mode: str, data: Path, out: Path, device: torch.device, size: str, cfg: TrainConfig, amp: str,
             sync_check: bool = False) -> dict:
    """Train ``cfg.max_updates`` updates in ``mode``; returns the update start times and, with
    ``sync_check``, the synchronising calls recorded between the starts of two updates."""
    fold, prefetch, workers = MODES[mode]
    cfg = TrainConfig(**{**cfg.__dict__, "fold_update": fold, "data_workers": workers})
    train_ds = SpeechDataset(data, "train", "st", max_frames=cfg.max_frames_train, max_target_tokens=cfg.max_target_tokens)
    dev_ds = SpeechDataset(data, "dev", "st")
    model = paper_model(size, train_ds.vocab_size)
    starts: list[float] = []
    marks: list[int] = []
    caught: list = []

    def at_update_start(update: int) -> None:
        if device.type == "cuda" and not sync_check:
            torch.cuda.synchronize(device)  # the previous update's kernels end inside the time it is given
        starts.append(time.perf_counter())
        marks.append(len(caught))

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        caught = record
        if sync_check:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            summary = train(model, cfg, train_ds, dev_ds, out / mode, run_config={"benchmark": mode},
                            device=device, progress=False, update_hooks=[at_update_start], prefetch=prefetch, amp=amp)
        finally:
            if sync_check:
                torch.cuda.set_sync_debug_mode("default")
    syncs = [[w for w in caught[a:b] if "synchroniz" in str(w.message)] for a, b in zip(marks, marks[1:])]
    return {"starts": starts, "syncs": syncs, "summary": summary, "vocab": train_ds.vocab_size}


def sync_figure(args, device: torch.device, size: str, cfg: TrainConfig, amp: str, data: Path, out: Path) -> None:
    """``loop_syncs``: an ``auto`` run under ``set_sync_debug_mode("warn")``, its synchronising calls counted
    per update after ``args.warmup`` updates, with their most frequent source lines."""
    r = run_mode("auto", data, out / "sync", device, size, cfg, amp, sync_check=True)
    per_update = [len(s) for s in r["syncs"]][args.warmup:]
    sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for s in r["syncs"][args.warmup:] for w in s)
    emit(figure="loop_syncs", mode="auto", dtype=amp, update_freq=cfg.update_freq, per_update=per_update,
         most_per_update=max(per_update, default=0), sites=dict(sites.most_common(12)))


def oom_figure(device: torch.device, size: str, cfg: TrainConfig, amp: str, data: Path, out: Path,
               updates: int = 4) -> None:
    """``oom_recovery`` (CUDA): a real out-of-memory error in a folded update, and the run going on.

    An ``accumulated`` run of ``updates`` updates measures its peak; the process is then capped at 1.5
    times that (``torch.cuda.set_per_process_memory_fraction``), which an accumulated update fits and the
    folded update of 8 batches does not, while ``fold_update: auto`` still reads the card's whole memory
    and decides to fold after its first (measured) update. The ``auto`` run must run out of memory
    there, fall back to accumulating (``gave_up`` in last.pt) and end all its updates under the cap,
    with the accumulated run's losses up to the card's nondeterminism (bf16, atomics in the backward)."""
    import gc
    if device.type != "cuda":
        emit(figure="oom_recovery", skipped="needs CUDA (a capped memory fraction)")
        return
    small = TrainConfig(**{**cfg.__dict__, "max_updates": updates, "eval_every": updates, "save_every": updates})
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    acc = run_mode("accumulated", data, out / "oom", device, size, small, amp)
    peak = torch.cuda.max_memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int(1.5 * peak)
    if cap >= total:  # set_per_process_memory_fraction takes a fraction in [0, 1]
        emit(figure="oom_recovery", skipped=f"1.5 x the accumulated peak ({cap / 2**30:.1f} GiB) is over the card's memory")
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(cap / total, index)
    fields: dict = {"figure": "oom_recovery", "dtype": amp, "update_freq": cfg.update_freq, "updates": updates,
                    "accumulated_peak_gib": round(peak / 2**30, 2), "cap_gib": round(cap / 2**30, 2)}
    t = time.perf_counter()
    try:
        torch.cuda.reset_peak_memory_stats(device)
        auto = run_mode("auto", data, out / "oom", device, size, small, amp)
    except torch.cuda.OutOfMemoryError as e:  # the fallback failed: the figure says so
        emit(**fields, error=f"OutOfMemoryError: {str(e).splitlines()[0][:200]}")
        return
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
    state = torch.load(out / "oom" / "auto" / "checkpoints" / "last.pt", weights_only=True, map_location="cpu")
    a, b = acc["summary"]["history"][-1], auto["summary"]["history"][-1]
    emit(**fields, seconds=round(time.perf_counter() - t, 1), auto_peak_gib=round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
         fold_state=state.get("fold"), updates_done=auto["summary"]["updates"],
         dev_loss_accumulated=round(a["dev/loss"], 4), dev_loss_auto=round(b["dev/loss"], 4),
         dev_loss_rel_diff=round(abs(b["dev/loss"] - a["dev/loss"]) / abs(a["dev/loss"]), 5))


def figures(args, device: torch.device, size: str, cfg: TrainConfig, amp: str, data: Path, out: Path) -> None:
    if args.sync_check and device.type == "cuda":  # first: a run cut short by its time limit still has it
        sync_figure(args, device, size, cfg, amp, data, out)
    if args.oom_check:
        oom_figure(device, size, cfg, amp, data, out)
    base_ms = None
    for mode in MODES:
        r = run_mode(mode, data, out, device, size, cfg, amp)
        times = [b - a for a, b in zip(r["starts"], r["starts"][1:])][args.warmup:]
        ms = 1000 * statistics.median(times)
        base_ms = ms if base_ms is None else base_ms
        last = r["summary"]["history"][-1] if r["summary"]["history"] else {}
        emit(figure="loop", mode=mode, size=size, dtype=amp, update_freq=cfg.update_freq, max_frames=cfg.max_frames,
             vocab=r["vocab"], updates_timed=len(times), ms_per_update=round(ms, 1), ratio=round(ms / base_ms, 3),
             ms_min=round(1000 * min(times), 1), ms_max=round(1000 * max(times), 1),
             dev_loss=round(last.get("dev/loss", float("nan")), 4), train_loss=round(last.get("train/loss", float("nan")), 4))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=10, help="timed updates per mode")
    ap.add_argument("--warmup", type=int, default=3, help="updates per mode before timing")
    ap.add_argument("--utterances", type=int, default=4000, help="training utterances of the synthetic corpus")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--sync-check", action="store_true", help="count synchronising calls per update (CUDA)")
    ap.add_argument("--oom-check", action="store_true",
                    help="a folded update run out of memory under a capped memory fraction, and the run going on (CUDA)")
    ap.add_argument("--data", type=Path, help="keep the synthetic corpus here (reused when it has train.tsv)")
    ap.add_argument("--cpu-smoke", action="store_true", help="every mode on the CPU at tiny shapes (no figures)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.cpu_smoke:
        device, size, amp, scale = torch.device("cpu"), "tiny", "none", 0.1
        cfg = TrainConfig(max_frames=600, update_freq=2, max_frames_train=300, warmup_updates=10)
        args.utterances, args.vocab = min(args.utterances, 120), min(args.vocab, 60)
        emit(figure="env", device="cpu (smoke test: tiny shapes, no figures)", torch=torch.__version__)
    elif not torch.cuda.is_available():
        print("benchmarks/gpu_loop.py: no CUDA device here; nothing measured (run it on a GPU machine, or "
              "--cpu-smoke to check the script on the CPU)", file=sys.stderr)
        return 0
    else:
        device, size, amp, scale = torch.device("cuda"), "s", "bf16", 1.0
        configure_cuda()
        cfg = TrainConfig()  # the paper's: 40k frames × update_freq 8, 3000-frame cap
        emit(figure="env", device=torch.cuda.get_device_name(device), torch=torch.__version__, cuda=torch.version.cuda)
    n_updates = args.warmup + args.updates + 1  # the last update's end is not timed (it evaluates and saves)
    cfg = TrainConfig(**{**cfg.__dict__, "max_updates": n_updates, "eval_every": n_updates, "save_every": n_updates,
                         "average_last": 1, "amp": amp})
    with tempfile.TemporaryDirectory(prefix="gpu-loop-") as tmp:
        data = args.data or Path(tmp) / "prepared"
        if not (data / "train.tsv").is_file():
            t = time.perf_counter()
            sizes = synthetic_prepared(data, args.utterances, max(8, args.utterances // 200), args.vocab, scale=scale)
            emit(figure="corpus", seconds=round(time.perf_counter() - t, 1), **sizes)
        figures(args, device, size, cfg, amp, data, Path(tmp) / "runs")
    emit(figure="done", seconds=round(time.perf_counter() - t0, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
