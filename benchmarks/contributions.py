"""Benchmark: fast (Gram) vs naive (materialised) contribution matrices.

One paper-size encoder's worth of work (12 layers, d = 256, H = 4, N = 1052, the longest MuST-C
sentence after the two stride-2 convolutions; paper Sec. 4) with random LayerNorm / W_V / W_O
and random softmax attention. Reports time, peak memory and the max relative difference.

Memory accounting: each method runs in its own fresh subprocess (``--worker``). The worker first
builds every input (all layers, attention generated in place so setup leaves no large freed
blocks behind), reads ``ru_maxrss`` (peak resident set size of the process so far), runs the
layers, and reads ``ru_maxrss`` again. The difference is the extra peak RSS of the computation
itself: it counts everything the process touched (torch allocator, temporaries inside einsum /
norm kernels), which tracemalloc cannot see, at page granularity. Each layer's C is written to
disk (raw float64, no serialisation copy) and freed before the next layer, so the peak is the
per-layer working set. The parent then reads both sets of matrices and compares them.

    .venv/bin/python benchmarks/contributions.py            # full: 12 layers, N = 1052
    .venv/bin/python benchmarks/contributions.py --quick    # 2 layers, N = 400 (< 30 s)

Both methods run with the same number of torch threads (``--threads``, default 1).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lib.analysis.contributions import contributions, contributions_naive  # noqa: E402


def make_layer(n: int, d: int, h: int, g: torch.Generator) -> dict:
    """Random Pre-LN attention layer inputs (float32, as a model would hand them over)."""
    attn = torch.randn(h, n, n, generator=g).mul_(3.0)  # peaky-ish random logits
    attn.sub_(attn.amax(-1, keepdim=True)).exp_()  # in-place softmax: no large temporaries
    attn.div_(attn.sum(-1, keepdim=True))
    return dict(
        x=torch.randn(n, d, generator=g) * 2.0,
        attn=attn,
        ln_weight=1.0 + 0.2 * torch.randn(d, generator=g),
        ln_bias=0.2 * torch.randn(d, generator=g),
        ln_eps=1e-5,
        v_weight=torch.randn(d, d, generator=g) / d**0.5,
        v_bias=0.3 * torch.randn(d, generator=g),
        out_weight=torch.randn(d, d, generator=g) / d**0.5,
        out_bias=0.3 * torch.randn(d, generator=g),
    )


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def worker(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(args.seed)
    layers = [make_layer(args.n, args.d, args.heads, g) for _ in range(args.layers)]
    fn = contributions if args.method == "fast" else contributions_naive
    # warm-up on a tiny layer (loads kernels, allocator bookkeeping) outside the measured region
    tiny = make_layer(8, args.d, args.heads, torch.Generator().manual_seed(1))
    fn(*[tiny[k] for k in ARG_ORDER])
    out_dir = Path(args.out)
    base = maxrss_mb()
    times = []
    for li, p in enumerate(layers):
        t0 = time.perf_counter()
        c = fn(*[p[k] for k in ARG_ORDER])
        times.append(time.perf_counter() - t0)
        c.numpy().tofile(out_dir / f"{args.method}_{li}.f64")
        del c
    peak = maxrss_mb()
    print(json.dumps({"method": args.method, "times": times, "base_mb": base, "peak_mb": peak,
                      "delta_mb": peak - base, "threads": torch.get_num_threads()}))


ARG_ORDER = ["x", "attn", "ln_weight", "ln_bias", "ln_eps", "v_weight", "v_bias", "out_weight", "out_bias"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 layers, N = 400")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads for both methods (default 1: on a small shared machine "
                         "multi-threaded elementwise kernels stall on busy cores; 0 = torch default)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--method", choices=["fast", "naive"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.layers is None:
        args.layers = 2 if args.quick else 12
    if args.n is None:
        args.n = 400 if args.quick else 1052
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.worker:
        worker(args)
        return

    print(f"contributions benchmark: {args.layers} layers, N={args.n}, d={args.d}, H={args.heads}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    naive_tensor_mb = args.n * args.n * args.d * 8 / 2**20
    print(f"(naive materialises an (N, N, d) float64 tensor: {naive_tensor_mb:.0f} MiB per layer)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("fast", "naive"):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--method", method, "--out", tmp,
                   "--layers", str(args.layers), "--n", str(args.n), "--d", str(args.d),
                   "--heads", str(args.heads), "--seed", str(args.seed), "--threads", str(args.threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results[method] = json.loads(proc.stdout.strip().splitlines()[-1])
        max_rel, max_abs = 0.0, 0.0
        for li in range(args.layers):
            a = np.fromfile(Path(tmp) / f"fast_{li}.f64")
            b = np.fromfile(Path(tmp) / f"naive_{li}.f64")
            max_abs = max(max_abs, float(np.abs(a - b).max()))
            max_rel = max(max_rel, float((np.abs(a - b) / np.maximum(np.abs(b), 1e-300)).max()))

    f, nv = results["fast"], results["naive"]
    tf, tn = sum(f["times"]), sum(nv["times"])
    print(f"{'method':<8}{'total s':>10}{'s/layer':>10}{'peak extra RSS MiB':>20}")
    for name, r, t in (("fast", f, tf), ("naive", nv, tn)):
        print(f"{name:<8}{t:>10.3f}{t / args.layers:>10.4f}{r['delta_mb']:>20.1f}")
    print(f"per-layer fast s: {' '.join(f'{t:.3f}' for t in f['times'])}")
    print(f"per-layer naive s: {' '.join(f'{t:.3f}' for t in nv['times'])}")
    print(f"speed-up: {tn / tf:.1f}x   peak-memory ratio: {nv['delta_mb'] / max(f['delta_mb'], 1e-9):.1f}x")
    print(f"max relative difference: {max_rel:.2e}   max absolute difference: {max_abs:.2e}")
    ok = tn / tf >= 10 and nv["delta_mb"] / max(f["delta_mb"], 1e-9) >= 20 and max_rel <= 1e-5
    print("targets (>=10x time, >=20x memory, <=1e-5 rel):", "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
