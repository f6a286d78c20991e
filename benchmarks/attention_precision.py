"""What the encoder's attention core costs and gains in fp32 under bf16 autocast
(``model.overrides.attention_fp32``; off by default: CPU autocast leaves the core in bf16).

    python benchmarks/attention_precision.py [--reps 5] [--rounds 3]

Prints, in one run:
1. accuracy: relative error (Frobenius norm, against float64) of the attention output and of the
   gradients dq, dk, dv for full attention (the explicit training path, autograd) and for local
   attention (w = 9, the hand-written backward), with the core in bf16 (the default under CPU
   autocast) and in fp32 (bf16 inputs, the output cast back to bf16);
2. speed: ms per training step of the demo model (forward + backward + Adam, 20 x 300 frames, the
   pipeline's default dropout), fp32 vs bf16 vs bf16 with the fp32 core, full attention in every
   layer (a baseline) and local attention in layers 4-12 (windows 1 1 5 3 5 1 7 1 1): ``--rounds``
   interleaved rounds over the three settings, each the median of ``--reps`` steps after two
   warm-up steps; the median of the rounds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lib.model.attention import build_attention  # noqa: E402
from lib.model.s2t_transformer import S2TTransformer, model_config  # noqa: E402
from train_throughput import step_time  # noqa: E402


def core_errors(spec: dict, fp32_core: bool, B: int = 4, H: int = 4, N: int = 100, dh: int = 32) -> list[float]:
    """Relative errors of out, dq, dk, dv of ``attend`` with bf16 inputs against float64."""
    torch.manual_seed(0)
    attn = build_attention(spec, H * dh, H, 0.0).eval()
    q0, k0, v0 = (2 * torch.randn(B, H, N, dh, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(B, N, dtype=torch.bool)
    mask[1, N - 20:] = True
    grad_out = torch.randn(B, H, N, dh, dtype=torch.float64)

    def run(dtype: torch.dtype, upcast: bool) -> list[torch.Tensor]:
        q, k, v = (t.to(dtype).detach().requires_grad_() for t in (q0, k0, v0))
        with torch.autocast("cpu", enabled=False):
            qq, kk, vv = (t.float() for t in (q, k, v)) if upcast else (q, k, v)
            out = attn.attend(qq, kk, vv, mask, need_weights=True)[0].to(dtype)
        out.backward(grad_out.to(dtype))
        return [out.detach().double(), q.grad.double(), k.grad.double(), v.grad.double()]

    ref = run(torch.float64, False)
    got = run(torch.bfloat16, fp32_core)
    return [float((a - r).norm() / r.norm()) for a, r in zip(got, ref)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("1. accuracy against float64 (relative error; B=4, H=4, N=100, dh=32, bf16 inputs)")
    print(f"{'core':<40} {'out':>9} {'dq':>9} {'dk':>9} {'dv':>9}")
    for name, spec in (("full (explicit, autograd)", {"type": "full"}), ("local w=9 (hand-written bwd)",
                                                                       {"type": "local", "window": 9})):
        for fp32_core in (False, True):
            errs = core_errors(spec, fp32_core)
            label = f"{name}, {'fp32' if fp32_core else 'bf16'} core"
            print(f"{label:<40} " + " ".join(f"{e:>9.2e}" for e in errs))

    print(f"2. training step of the demo model, ms (median over {args.rounds} interleaved rounds of the median of "
          f"{args.reps} steps; 20 x 300 frames x 15 tokens)")
    torch.manual_seed(0)
    B, T, L = 20, 300, 15
    windows = [1, 1, 5, 3, 5, 1, 7, 1, 1]
    specs = {"full (baseline)": None,
             "local 4-12": [{"type": "full"}] * 3 + [{"type": "local", "window": w} for w in windows]}
    print(f"{'model':<18} {'fp32':>8} {'bf16':>8} {'bf16+fp32 core':>15} {'bf16 speed-up':>14} {'with fp32 core':>15}")
    for name, enc in specs.items():
        configs = {"fp32": ("none", False), "bf16": ("bf16", False), "core": ("bf16", True)}
        setups = {}
        for label, (amp, core) in configs.items():
            cfg = model_config("demo", vocab_size=200, attention_fp32=core, encoder_attention=enc)
            g = torch.Generator().manual_seed(0)
            batch = (torch.randn(B, T, cfg.n_mels, generator=g), torch.full((B,), T),
                     torch.randint(4, 200, (B, L), generator=g), torch.randint(4, 200, (B, L), generator=g))
            setups[label] = (S2TTransformer(cfg).train(), batch, amp)
        times: dict[str, list[float]] = {label: [] for label in configs}
        for _ in range(args.rounds):  # interleaved rounds: a drifting machine hits every column alike
            for label, (model, batch, amp) in setups.items():
                times[label].append(step_time(model, batch, args.reps, amp))
        t = {label: statistics.median(v) for label, v in times.items()}
        print(f"{name:<18} {t['fp32'] * 1e3:>8.1f} {t['bf16'] * 1e3:>8.1f} {t['core'] * 1e3:>15.1f} "
              f"{t['fp32'] / t['bf16']:>13.2f}x {t['fp32'] / t['core']:>14.2f}x")

if __name__ == "__main__":
    main()
