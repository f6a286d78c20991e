"""Throughput of `prepare_pair` (feature extraction + manifests + vocabularies) on a synthetic
MuST-C-layout corpus, with workers=1 (in-process) and workers=2 (process pool).

    .venv/bin/python benchmarks/prepare_throughput.py [--talks 20] [--segments 30] [--workers 1,2]

The corpus (noise + tones, no eSpeak) is written to a temporary folder: ``--talks`` talks of
``--segments`` segments each (0.5-1.5 s, ~1 s on average, so ~10 min of audio by default),
spread over train/dev/tst-COMMON. Prints, per worker count: audio seconds, wall seconds,
x real time, x real time per core (target >= 500), plus the time of fbank alone (one thread,
in-process, same segments) against the whole prepare, and checks that the outputs of all
worker counts are byte-identical.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.data.features import fbank  # noqa: E402
from lib.data.mustc import cut_segment, load_talk, read_split  # noqa: E402
from lib.data.prepare import prepare_pair  # noqa: E402
from lib.params import PrepareParams  # noqa: E402

SR = 16000
TARGET_PER_CORE = 500.0
WORDS = ("the talk is about science and art we see how people learn to build better tools for "
         "everyone who wants to understand our world").split()


def build_corpus(root: Path, n_talks: int, n_segments: int, seed: int = 0) -> float:
    """Write the corpus under ``root/en-de``; returns the total segment audio in seconds."""
    rng = np.random.default_rng(seed)
    n_dev = max(1, n_talks // 10)
    splits = {"train": n_talks - 2 * n_dev, "dev": n_dev, "tst-COMMON": n_dev}
    talk_no, total = 1, 0.0
    for split, n in splits.items():
        d = root / "en-de" / "data" / split
        (d / "wav").mkdir(parents=True)
        (d / "txt").mkdir(parents=True)
        yaml_lines, en, de = [], [], []
        for _ in range(n):
            durs = np.round(rng.uniform(0.5, 1.5, n_segments), 2)
            gaps = np.round(rng.uniform(0.1, 0.4, n_segments), 2)
            offsets = np.cumsum(gaps + np.concatenate([[0.0], durs[:-1]]))
            length = float(offsets[-1] + durs[-1] + 0.5)
            t = np.arange(int(length * SR)) / SR
            f0 = rng.uniform(100, 250)
            audio = (0.2 * np.sin(2 * np.pi * f0 * t) + 0.1 * np.sin(2 * np.pi * 2.7 * f0 * t)
                     + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
            wav = f"ted_{talk_no}.wav"
            sf.write(d / "wav" / wav, audio, SR, subtype="PCM_16")
            for off, dur in zip(offsets, durs):
                words = rng.choice(WORDS, size=rng.integers(3, 12))
                yaml_lines.append(f"- {{duration: {dur:.6f}, offset: {off:.6f}, rW: {len(words)}, uW: 0, "
                                  f"speaker_id: spk.{talk_no}, wav: {wav}}}")
                en.append(" ".join(words))
                de.append(" ".join(w[::-1] for w in words))
                total += float(dur)
            talk_no += 1
        (d / "txt" / f"{split}.yaml").write_text("\n".join(yaml_lines) + "\n")
        (d / "txt" / f"{split}.en").write_text("\n".join(en) + "\n")
        (d / "txt" / f"{split}.de").write_text("\n".join(de) + "\n")
    return total


def fbank_only_seconds(root: Path, splits: tuple[str, ...]) -> float:
    """Seconds spent in fbank alone (one torch thread), audio loading and cutting excluded."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spent = 0.0
        for split in splits:
            segs = read_split(root, "en-de", split)
            talks = {}
            for i, seg in enumerate(segs):
                if seg.wav not in talks:
                    talks[seg.wav] = load_talk(seg.wav)
                wave = cut_segment(talks[seg.wav], seg, i)
                t0 = time.perf_counter()
                fbank(wave)
                spent += time.perf_counter() - t0
        return spent
    finally:
        torch.set_num_threads(old)


def _spin(n: int) -> float:
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i
    return time.perf_counter() - t0


def parallel_capacity(workers: int, n: int = 5_000_000) -> float:
    """How many cores' worth of pure-Python work ``workers`` processes get on this machine
    (``workers`` on dedicated cores; less on a shared or oversubscribed machine)."""
    import multiprocessing as mp

    one = min(_spin(n) for _ in range(2))
    if workers == 1:
        return 1.0
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(_spin, [1000] * workers)
        t0 = time.perf_counter()
        pool.map(_spin, [n] * workers, chunksize=1)
        wall = time.perf_counter() - t0
    return workers * one / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--talks", type=int, default=20)
    ap.add_argument("--segments", type=int, default=30)
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--repeats", type=int, default=5, help="runs per worker count (best is reported)")
    args = ap.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]

    with tempfile.TemporaryDirectory(prefix="prepare-bench-") as tmp:
        root = Path(tmp) / "mustc"
        audio_s = build_corpus(root, args.talks, args.segments)
        print(f"corpus: {args.talks} talks x {args.segments} segments, {audio_s:.1f} s of segment audio")
        rows, outputs = [], {}
        for w in worker_counts:
            cfg = PrepareParams(workers=w, asr_vocab_size=100, st_vocab_size=100)
            best = float("inf")
            for r in range(args.repeats):
                out = Path(tmp) / f"out-w{w}"
                t0 = time.perf_counter()
                report = prepare_pair(root, "en-de", out, cfg, progress=False)
                best = min(best, time.perf_counter() - t0)
            kept_s = sum(s["kept_audio_seconds"] for s in report["splits"].values())
            outputs[w] = {p.name: p.read_bytes() for p in out.iterdir()}
            rows.append((w, kept_s, best, kept_s / best, kept_s / best / w))
        fb = min(fbank_only_seconds(root, cfg.splits) for _ in range(args.repeats))

    print()
    print(f"{'workers':>7} | {'audio s':>8} | {'wall s':>7} | {'x real time':>11} | {'x RT / core':>11}")
    print("-" * 58)
    for w, a, wall, xrt, per_core in rows:
        print(f"{w:>7} | {a:>8.1f} | {wall:>7.2f} | {xrt:>11.0f} | {per_core:>11.0f}")
    print()
    w1 = next((r for r in rows if r[0] == 1), None)
    print(f"fbank alone (1 thread, in-process): {fb:.2f} s = {rows[0][1] / fb:.0f}x real time"
          + (f"; {100 * fb / w1[2]:.0f}% of the workers=1 prepare ({w1[2]:.2f} s)" if w1 else ""))
    for w in worker_counts:
        if w > 1:
            print(f"machine check: {w} processes of pure-Python work get {parallel_capacity(w):.2f} cores' worth "
                  f"(os.cpu_count()={os.cpu_count()}, load average {os.getloadavg()[0]:.2f})")
    same = all(outputs[w] == outputs[worker_counts[0]] for w in worker_counts)
    print(f"outputs byte-identical across workers {worker_counts}: {same}")
    ok = all(r[4] >= TARGET_PER_CORE for r in rows)
    print(f"target >= {TARGET_PER_CORE:.0f}x real time per core: {'met' if ok else 'NOT met'}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
