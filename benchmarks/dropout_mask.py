"""The CPU dropout of lib/model/dropout.py: the mask built as torch bool tensors (the code before
2026-11-26: ``keep.to(dtype) * scale``) against the numpy-built mask of today
(``scaled_keep_mask``, bit-identical), fp32 and bf16, at the demo's training shapes.

    python benchmarks/dropout_mask.py [--rounds 5] [--reps 30]

Rows: the FFN activation (20 x 75 x 512), the attention weights (20 x 4 x 75 x 75) and the residual
stream (20 x 75 x 128) of an encoder layer of a demo batch (6000 frames -> 75 encoder tokens after
subsampling). Each cell: ms for the mask alone and for the whole forward (mask, multiply), the
median over interleaved rounds of the mean of ``--reps`` calls; the random bits (SFC64) are drawn
in both, so the difference is what building the mask costs. The last line checks bit-identity.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.model.dropout import keep_mask, scaled_keep_mask  # noqa: E402


def torch_bool_mask(shape, p, seed, dtype):
    """The mask as built before: a torch bool keep-mask, converted to ``dtype``, times the scale."""
    keep, scale = keep_mask(shape, p, seed)
    return keep.to(dtype) * scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--p", type=float, default=0.1)
    args = ap.parse_args()
    shapes = {"FFN activation": (20, 75, 512), "attention weights": (20, 4, 75, 75), "residual": (20, 75, 128)}
    builders = {"torch bool": torch_bool_mask, "numpy": scaled_keep_mask}
    dtypes = (torch.float32, torch.bfloat16)
    xs = {(s, d): torch.randn(shape).to(d) for s, shape in shapes.items() for d in dtypes}
    times: dict[tuple, list[float]] = {}
    for r in range(args.rounds + 1):  # round 0: warm-up
        for s, shape in shapes.items():
            for d in dtypes:
                for b, build in builders.items():
                    t0 = time.perf_counter()
                    for i in range(args.reps):
                        build(shape, args.p, i, d)
                    t1 = time.perf_counter()
                    for i in range(args.reps):
                        xs[s, d] * build(shape, args.p, i, d)
                    t2 = time.perf_counter()
                    if r:
                        times.setdefault((s, d, b, "mask"), []).append((t1 - t0) / args.reps)
                        times.setdefault((s, d, b, "op"), []).append((t2 - t1) / args.reps)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per call, median of {args.rounds} "
          f"interleaved rounds of {args.reps} calls; p = {args.p}")
    print(f"{'shape':<32} {'dtype':<9} {'mask: bool':>11} {'numpy':>7} {'ratio':>6}   "
          f"{'dropout: bool':>14} {'numpy':>7} {'ratio':>6}")
    for s, shape in shapes.items():
        for d in dtypes:
            m = {(b, k): 1e3 * statistics.median(times[s, d, b, k]) for b in builders for k in ("mask", "op")}
            print(f"{s + ' ' + 'x'.join(map(str, shape)):<32} {str(d).replace('torch.', ''):<9} "
                  f"{m['torch bool', 'mask']:>11.3f} {m['numpy', 'mask']:>7.3f} "
                  f"{m['torch bool', 'mask'] / m['numpy', 'mask']:>5.2f}x   "
                  f"{m['torch bool', 'op']:>14.3f} {m['numpy', 'op']:>7.3f} {m['torch bool', 'op'] / m['numpy', 'op']:>5.2f}x")
    same = all(torch.equal(torch_bool_mask(shape, args.p, 7, d).view(-1).view(torch.uint8),
                           scaled_keep_mask(shape, args.p, 7, d).view(-1).view(torch.uint8))
               for shape in shapes.values() for d in dtypes)
    print(f"masks bit-identical: {same}")


if __name__ == "__main__":
    main()
