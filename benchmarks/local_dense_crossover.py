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

Then the whole training step (forward + backward + fused Adam) of the demo model with local attention
in layers 4-12 (windows 1 1 9 9 9 3 13 3 5, en-de's default selection) against the same model with
full attention (a baseline), 10 x 448 frames (N = 112) x 30 tokens, fp32 and bf16, the local model
once with the rule and once with the blocked kernel forced: ms per step, medians of ``--rounds``
interleaved rounds of ``--reps`` steps.
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
from lib.model.s2t_transformer import S2TTransformer, model_config  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from train_throughput import step_time  # noqa: E402

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
    whole_step(args.rounds, max(5, args.reps // 4))


def whole_step(rounds: int, reps: int) -> None:
    """ms per training step of the demo model: full attention vs local in layers 4-12, rule vs blocked."""
    windows = [1, 1, 9, 9, 9, 3, 13, 3, 5]
    local = [{"type": "full"}] * 3 + [{"type": "local", "window": w} for w in windows]
    B, T, L = 10, 448, 30
    setups = {}
    for amp in ("none", "bf16"):
        for name, enc, forced in (("full attention", None, None), ("local 4-12, rule", local, None),
                                  ("local 4-12, blocked", local, False)):
            torch.manual_seed(0)
            cfg = model_config("demo", vocab_size=384, encoder_attention=enc, scale_embedding=False,
                               subsampler_norm="layernorm")
            g = torch.Generator().manual_seed(0)
            batch = (torch.randn(B, T, cfg.n_mels, generator=g), torch.full((B,), T),
                     torch.randint(4, 384, (B, L), generator=g), torch.randint(4, 384, (B, L), generator=g))
            setups[(name, amp)] = (S2TTransformer(cfg).train(), batch, forced)
    times: dict = {k: [] for k in setups}
    real = la.dense_band_is_cheaper
    for _ in range(rounds):
        for (name, amp), (model, batch, forced) in setups.items():
            if forced is not None:
                la.dense_band_is_cheaper = lambda n, dtype, device: forced
            try:
                times[(name, amp)].append(1e3 * step_time(model, batch, reps, amp))
            finally:
                la.dense_band_is_cheaper = real
    print(f"\nwhole training step of the demo model, {B} x {T} frames x {L} tokens, ms (median of {rounds} rounds)")
    print("| model | fp32 | bf16 | fp32 / bf16 |")
    print("|---|---|---|---|")
    for name in ("full attention", "local 4-12, rule", "local 4-12, blocked"):
        f, b = statistics.median(times[(name, "none")]), statistics.median(times[(name, "bf16")])
        print(f"| {name} | {f:.1f} | {b:.1f} | {f / b:.2f}× |")


if __name__ == "__main__":
    main()
