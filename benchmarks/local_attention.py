"""Benchmark: centred sliding-window attention vs full / band-masked / materialised attention.

Setting (the paper's encoder): batch 8, d = 256, 4 heads (dh = 64), fp32, CPU, for
N in {166, 512, 1052} (MuST-C mean / - / max length after the conv subsampler) and
w in {5, 13, 25} (the paper's window range).  Methods:

  sdpa        torch.nn.functional.scaled_dot_product_attention, no mask (full attention)
  sdpa_band   the same with attn_mask = band (N x N bool): exact local attention, full cost
  material    q @ k^T -> softmax -> @ v with the N x N scores materialised (fairseq MHA style)
  local       lib.model.local_attention.local_attention (blocked sliding window)

Time: median (and min, in the JSON) over at least ``--reps`` repetitions after 2 warm-ups
(more, up to 400, until each method has 0.5 s of samples: ~300 at N = 166),
in this process, of the forward alone (under ``torch.no_grad``) and of forward +
backward (``torch.autograd.grad`` of the output w.r.t. q, k, v with a fixed upstream
gradient).  Repetitions are interleaved round-robin across the methods of a
configuration, so load from other processes on a shared machine affects them
alike; the median is the headline number.  Window-independent methods (sdpa,
material) are measured once per N and repeated on every w row.

Peak extra memory: every (method, N, w) runs in a *fresh subprocess* (this script
with ``--_child``) so that nothing else lives in the process.  The child creates
the inputs and warms up twice at full size (one-off code pages, thread pools, BLAS
buffers); then, for the inference forward and again for forward + backward, it
reads the current resident set (VmRSS), resets the kernel's peak-RSS mark
(``echo 5 > /proc/self/clear_refs``), runs the step and reads the peak (VmHWM).
Peak minus starting RSS is the memory that step needed beyond its inputs: all
temporaries, the activations saved for backward, the outputs and the gradients.
(``ru_maxrss`` is not used: it is monotone and, on Linux, inherits the parent's
peak across fork/exec.)  The child runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so
that glibc serves every large tensor by mmap and returns it to the kernel on free;
RSS then tracks live tensors rather than allocator caching.  Resolution is one
page; values are in MiB.

The score-work bound printed per window is ``w / N`` (fraction of the N x N score
matrix inside the band) and the blocked kernel's actual fraction ``(blk + w - 1) / N``.

Usage:  python benchmarks/local_attention.py [--quick] [--json PATH] [--reps R]
Default run is a few minutes on 2 CPU cores; ``--quick`` (N in {166, 1052}, w = 13,
fewer reps) about 30 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lib.model.local_attention import band_mask, choose_block_size, local_attention  # noqa: E402

BATCH, D_MODEL, HEADS = 8, 256, 4
DH = D_MODEL // HEADS
METHODS = ("sdpa", "sdpa_band", "material", "local")
WINDOW_FREE = {"sdpa", "material"}  # results do not depend on w
MIN_SECONDS = 0.5  # measured time per method and configuration, at least (more reps for fast steps)


# ----------------------------------------------------------------------------- methods


def _material(q, k, v):
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, N, N)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def make_fn(method: str, n: int, w: int):
    if method == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
    if method == "sdpa_band":
        mask = band_mask(n, w)  # (N, N) bool, True = attend
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if method == "material":
        return _material
    if method == "local":
        return lambda q, k, v: local_attention(q, k, v, w)
    raise ValueError(method)


def make_inputs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(BATCH, HEADS, n, DH, generator=g).requires_grad_(True) for _ in range(3))
    go = torch.randn(BATCH, HEADS, n, DH, generator=g)
    return q, k, v, go


def step_fwd(fn, q, k, v, go):
    with torch.no_grad():
        return fn(q, k, v)


def step_fwdbwd(fn, q, k, v, go):
    out = fn(q, k, v)
    return torch.autograd.grad(out, (q, k, v), go)


# ----------------------------------------------------------------------------- timing


def time_interleaved(step, fns: dict, inputs, reps: int, warmup: int = 2, min_seconds: float = 0.0,
                     max_reps: int = 400) -> dict:
    """Median/min wall time of ``step`` for several methods, repetitions interleaved.

    The methods are timed round-robin (rep 1 of every method, then rep 2, ...), so a
    burst of load from another process on a shared machine hits all of them alike
    instead of skewing whichever method happened to be running.  At least ``reps``
    rounds; more (up to ``max_reps``) until every method has ``min_seconds`` of
    measured time, so that millisecond-scale steps (N = 166) get hundreds of samples
    and a stable median instead of a handful dominated by scheduler noise.
    """
    for fn in fns.values():
        for _ in range(warmup):
            step(fn, *inputs)
    samples = {m: [] for m in fns}
    rounds = 0
    while rounds < reps or (rounds < max_reps and min(sum(v) for v in samples.values()) < min_seconds * 1e3):
        for m, fn in fns.items():
            t0 = time.perf_counter()
            step(fn, *inputs)
            samples[m].append((time.perf_counter() - t0) * 1e3)
        rounds += 1
    return {m: {"median_ms": statistics.median(v), "min_ms": min(v), "reps": len(v), "samples_ms": v}
            for m, v in samples.items()}


# ----------------------------------------------------------------------------- memory


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> bool:
    """Reset this process's peak-RSS mark (VmHWM); Linux >= 4.0, own process only."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_extra(step, fn, inputs) -> int:
    """Bytes by which the resident set peaked above its level before ``step``."""
    base = _proc_status_kib("VmRSS")
    if _reset_peak():
        res = step(fn, *inputs)
        peak = _proc_status_kib("VmHWM")
    else:  # fallback: the monotone ru_maxrss (may include earlier peaks -> 0)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        res = step(fn, *inputs)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before + base
    del res
    return max(0, peak - base) * 1024


def child_main(method: str, n: int, w: int) -> None:
    """Runs in a fresh process; prints JSON with the peak resident-set increases (bytes)."""
    inputs = make_inputs(n)
    fn = make_fn(method, n, w)
    for _ in range(2):  # warm-up at full size: code pages, thread pools, BLAS buffers
        step_fwd(fn, *inputs)
        step_fwdbwd(fn, *inputs)
    fwd = _peak_extra(step_fwd, fn, inputs)
    fb = _peak_extra(step_fwdbwd, fn, inputs)
    print(json.dumps({"fwd_bytes": fwd, "fwdbwd_bytes": fb}))


def measure_memory(method: str, n: int, w: int) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", method, str(n), str(w)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- main


def run(ns, ws, reps: int) -> list[dict]:
    rows = []
    cache: dict[tuple, dict] = {}
    for n in ns:
        inputs = make_inputs(n)
        for w in ws:
            blk = choose_block_size(n, w)
            row = {"N": n, "w": w, "blk": blk, "score_bound": w / n, "score_actual": min(1.0, (blk + w - 1) / n)}
            keys = {m: (m, n, None if m in WINDOW_FREE else w) for m in METHODS}
            todo = {m: make_fn(m, n, w) for m in METHODS if keys[m] not in cache}
            fwd = time_interleaved(step_fwd, todo, inputs, reps, min_seconds=MIN_SECONDS)
            fb = time_interleaved(step_fwdbwd, todo, inputs, reps, min_seconds=MIN_SECONDS)
            for m in todo:
                cache[keys[m]] = {"fwd": fwd[m], "fwdbwd": fb[m], "mem": measure_memory(m, n, w)}
            for m in METHODS:
                row[m] = cache[keys[m]]
            rows.append(row)
            print(f"  measured N={n} w={w}", file=sys.stderr, flush=True)
    return rows


def _mib(b: int) -> float:
    return b / 2**20


def print_table(rows: list[dict]) -> None:
    hdr = (f"{'N':>5} {'w':>3} {'w/N':>6} {'blk':>4} | "
           f"{'fwd ms: sdpa':>12} {'band':>7} {'mat':>7} {'local':>6} {'xsdpa':>6} | "
           f"{'fwd+bwd ms: sdpa':>16} {'band':>7} {'mat':>7} {'local':>6} {'xsdpa':>6} {'xband':>6} {'xmat':>6} | "
           f"{'peak MiB fb: sdpa':>17} {'band':>6} {'mat':>6} {'local':>6} {'loc/sdpa':>8} {'mat/loc':>7}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        f = {m: r[m]["fwd"]["median_ms"] for m in METHODS}
        fb = {m: r[m]["fwdbwd"]["median_ms"] for m in METHODS}
        mem = {m: _mib(r[m]["mem"]["fwdbwd_bytes"]) for m in METHODS}
        print(f"{r['N']:>5} {r['w']:>3} {r['score_bound']:>6.3f} {r['blk']:>4} | "
              f"{f['sdpa']:>12.1f} {f['sdpa_band']:>7.1f} {f['material']:>7.1f} {f['local']:>6.1f} "
              f"{f['sdpa'] / f['local']:>5.1f}x | "
              f"{fb['sdpa']:>16.1f} {fb['sdpa_band']:>7.1f} {fb['material']:>7.1f} {fb['local']:>6.1f} "
              f"{fb['sdpa'] / fb['local']:>5.1f}x {fb['sdpa_band'] / fb['local']:>5.1f}x "
              f"{fb['material'] / fb['local']:>5.1f}x | "
              f"{mem['sdpa']:>17.1f} {mem['sdpa_band']:>6.1f} {mem['material']:>6.1f} {mem['local']:>6.1f} "
              f"{mem['local'] / max(mem['sdpa'], 1e-9):>7.2f}x {mem['material'] / max(mem['local'], 1e-9):>6.1f}x")
    print("\nx* = time(method) / time(local) (higher = local faster); loc/sdpa = local peak / sdpa peak; "
          "mat/loc = materialised peak / local peak.")
    print("Score-work bound: local computes (blk + w - 1)/N of the full N x N scores "
          "(ideal band fraction w/N):")
    for r in rows:
        print(f"  N={r['N']:>5} w={r['w']:>3}: w/N = {r['score_bound']:.4f}, "
              f"(blk+w-1)/N = {r['score_actual']:.4f}")
    print("Peak extra memory for the inference forward alone (MiB):")
    for r in rows:
        print(f"  N={r['N']:>5} w={r['w']:>3}: " + "  ".join(
            f"{m}={_mib(r[m]['mem']['fwd_bytes']):.1f}" for m in METHODS))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="N in {166, 1052}, w = 13, 5 reps (~30 s)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (default 9, quick 5)")
    ap.add_argument("--json", type=Path, default=None, help="write all measurements to this JSON file")
    ap.add_argument("--_child", nargs=3, metavar=("METHOD", "N", "W"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        method, n, w = args._child
        child_main(method, int(n), int(w))
        return

    ns, ws = ((166, 1052), (13,)) if args.quick else ((166, 512, 1052), (5, 13, 25))
    reps = args.reps or (5 if args.quick else 9)
    t0 = time.time()
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, {platform.processor() or platform.machine()}, "
          f"B={BATCH} d={D_MODEL} H={HEADS} dh={DH} fp32 CPU, median of {reps} reps", flush=True)
    rows = run(ns, ws, reps)
    print()
    print_table(rows)
    print(f"\n(total {time.time() - t0:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "batch": BATCH,
                "d_model": D_MODEL, "heads": HEADS, "dtype": "float32", "device": "cpu", "reps": reps,
                "memory_method": "VmHWM after the step (peak reset via /proc/self/clear_refs) minus VmRSS before it, in a fresh subprocess, MALLOC_MMAP_THRESHOLD_=65536"}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
