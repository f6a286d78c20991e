"""The attention core in eval on CPU: ``F.scaled_dot_product_attention`` against the explicit path
(q k^T, softmax, weights v), fp32 and bf16, at the demo's decoding shapes.

    python benchmarks/attention_core.py [--rounds 5] [--reps 20]

Why: ``lib.model.attention.explicit_on_cpu`` takes the explicit path in eval on CPU for one query
row (an incremental decoding step) and in bf16. Rows: an encoder layer over a decoding batch (50
segments, 4 heads, N = 100 / 200 encoder tokens, d_head 32), and one beam-search step of the
decoder (250 hypotheses = 50 segments x beam 5; cross-attention over S = 150 encoder tokens,
self-attention over 30 target tokens). Each cell: the median over interleaved rounds of the mean
time of ``--reps`` calls (this host's speed drifts by 10-20 % over minutes).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def sdpa(q, k, v, bias):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def explicit(q, k, v, bias):
    return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * q.size(-1) ** -0.5 + bias, -1), v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    shapes = {  # name: (batch, heads, query rows, keys, d_head)
        "encoder layer, N=100": (50, 4, 100, 100, 32),
        "encoder layer, N=200": (50, 4, 200, 200, 32),
        "decoder step, cross S=150": (250, 4, 1, 150, 32),
        "decoder step, self t=30": (250, 4, 1, 30, 32),
    }
    cells = [(name, dtype, f) for name in shapes for dtype in (torch.float32, torch.bfloat16) for f in (sdpa, explicit)]
    inputs = {}
    for name, (B, H, L, S, dh) in shapes.items():
        q, k, v = torch.randn(B, H, L, dh), torch.randn(B, H, S, dh), torch.randn(B, H, S, dh)
        bias = torch.zeros(B, 1, 1, S)
        bias[: B // 2, ..., S - S // 5:] = torch.finfo(torch.float32).min / 2  # padding in half the rows
        for dtype in (torch.float32, torch.bfloat16):
            inputs[name, dtype] = [t.to(dtype) for t in (q, k, v, bias)]
    times: dict[tuple, list[float]] = {c: [] for c in cells}
    with torch.inference_mode():
        for name, dtype, f in cells:  # warm-up
            f(*inputs[name, dtype])
        for _ in range(args.rounds):
            for name, dtype, f in cells:
                t0 = time.perf_counter()
                for _ in range(args.reps):
                    f(*inputs[name, dtype])
                times[name, dtype, f].append((time.perf_counter() - t0) / args.reps)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per call, median of {args.rounds} "
          f"interleaved rounds of {args.reps} calls")
    print(f"{'shape':<28} {'fp32 SDPA':>10} {'fp32 expl.':>11} {'bf16 SDPA':>10} {'bf16 expl.':>11}   the pipeline's path")
    for name in shapes:
        ms = {(d, f): 1e3 * statistics.median(times[name, d, f]) for d in (torch.float32, torch.bfloat16)
              for f in (sdpa, explicit)}
        L = shapes[name][2]
        chosen = "explicit (one row)" if L == 1 else "fp32 SDPA, bf16 explicit"
        print(f"{name:<28} {ms[torch.float32, sdpa]:>10.3f} {ms[torch.float32, explicit]:>11.3f} "
              f"{ms[torch.bfloat16, sdpa]:>10.3f} {ms[torch.bfloat16, explicit]:>11.3f}   {chosen}")


if __name__ == "__main__":
    main()
