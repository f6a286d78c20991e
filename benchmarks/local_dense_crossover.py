"""Where a local-attention layer is cheaper as a dense band-masked score matrix than through the
blocked sliding-window kernel, on this CPU, fp32 and bf16 autocast: the measurement behind
``lib.model.local_attention.DENSE_BAND_MAX_LEN`` (the rule LocalAttention follows in training and
decoding; analysis keeps the blocked kernel).

    python benchmarks/local_dense_crossover.py [--threads 1] [--rounds 3] [--reps 20]

One local-attention module of the demo model (d = 256, 4 heads), training mode with the demo's
attention dropout (0.1), forward + backward of the module (projections included) on B x N inputs with
B = 800 // N (about one demo ST batch of positions) and 20 % padding in the first sequence. Each
cell: the median over ``--rounds`` interleaved rounds of the median of ``--reps`` steps after three
warm-up steps. Printed per (N, w, precision): ms blocked, ms dense, blocked / dense (> 1: dense is
cheaper) and the path the rule takes. One thread by default: how the pipeline trains its per-pair
and per-seed runs on 2 cores (``parallel.jobs: auto``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import lib.model.local_attention as la  # noqa: E402
from lib.model.attention import build_attention  # noqa: E402

D_MODEL, HEADS = 256, 4


def step_ms(module, x: torch.Tensor, mask: torch.Tensor, amp: str, dense: bool, reps: int) -> float:
    """Median ms of forward + backward of ``module`` with the path forced (``dense``)."""
    real = la.dense_band_is_cheaper
    la.dense_band_is_cheaper = lambda n, dtype, device: dense
    try:
        times = []
        for i in range(reps + 3):
            xx = x.detach().requires_grad_()
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
                out = module(xx, mask).out
            out.float().sum().backward()
            if i >= 3:
                times.append(time.perf_counter() - t0)
    finally:
        la.dense_band_is_cheaper = real
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--lengths", type=int, nargs="+", default=[50, 100, 150, 200, 300, 400])
    ap.add_argument("--windows", type=int, nargs="+", default=[3, 9, 21])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); rule: dense for 16-bit on CPU when "
          f"N <= DENSE_BAND_MAX_LEN = {la.DENSE_BAND_MAX_LEN}")
    print("| N | w | precision | blocked ms | dense ms | blocked / dense | rule takes |")
    print("|---|---|---|---|---|---|---|")
    for n in args.lengths:
        b = max(1, 800 // n)
        for w in args.windows:
            for amp in ("fp32", "bf16"):
                torch.manual_seed(0)
                x = torch.randn(b, n, D_MODEL)
                mask = torch.zeros(b, n, dtype=torch.bool)
                mask[0, n - n // 5:] = True
                module = build_attention({"type": "local", "window": w}, D_MODEL, HEADS, 0.1).train()
                blocked, dense = [], []
                for _ in range(args.rounds):
                    blocked.append(step_ms(module, x, mask, amp, False, args.reps))
                    dense.append(step_ms(module, x, mask, amp, True, args.reps))
                tb, td = statistics.median(blocked), statistics.median(dense)
                dtype = torch.bfloat16 if amp == "bf16" else torch.float32
                rule = "dense" if la.dense_band_is_cheaper(n, dtype, torch.device("cpu")) else "blocked"
                print(f"| {n} | {w} | {amp} | {tb:.2f} | {td:.2f} | {tb / td:.2f} | {rule} |", flush=True)


if __name__ == "__main__":
    main()
