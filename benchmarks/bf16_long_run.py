"""What a short probe cannot see: bf16 training steps over a longer run, and fp32 steps after bf16
ones in the same process. Each row runs in its own fresh process on the same new (never repeated)
training batches of the prepared en-de data (demo model with params.yaml's `model.overrides`,
fused Adam, SpecAugment off) and prints the mean ms per update of each block of `--block` updates
after the first (warm-up) one:

- `fp32`, `bf16`: one precision per process, as a training stage runs;
- `bf16, kernel cache 1024`: oneDNN's default cache of per-shape kernels (lib/precision.py raises it
  to 16384 at import; `ONEDNN_PRIMITIVE_CACHE_CAPACITY` set in the child's environment);
- `fp32 after bf16`: the same process first runs the bf16 row's updates, then times fp32 ones
  (what a probe that interleaves both precisions in one process measures for fp32).

    python benchmarks/bf16_long_run.py [--task st] [--updates 96] [--block 16]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROWS = {"fp32": ("none",), "bf16": ("bf16",), "bf16, kernel cache 1024": ("bf16",),
        "fp32 after bf16": ("bf16", "none")}


def one_row(task: str, row: str, updates: int) -> list[float]:
    """In this process: seconds per update of the row's last precision, first (warm-up) update dropped."""
    from lib.data.dataset import SpeechDataset, first_batches
    from lib.model.s2t_transformer import model_config
    from lib.params import load_params
    from lib.precision import time_training_steps

    p = load_params(ROOT / "params.yaml")
    cfg = p.train_asr if task == "asr" else p.train_st
    ds = SpeechDataset(ROOT / p.data.prepared_dir / "en-de", "train", task, max_frames=cfg.max_frames_train)
    mcfg = model_config(p.model.size, vocab_size=ds.vocab_size,
                        ctc_vocab_size=ds.vocab_size if cfg.ctc_weight > 0 else None, **p.model.overrides)
    batches = first_batches(ds, cfg.max_frames, 2 * (updates + 1), seed=1)
    times: list[float] = []
    for k, amp in enumerate(ROWS[row]):  # "fp32 after bf16": the fp32 part uses batches bf16 never saw
        # the probe's own step (lib.precision): a fresh model, fused Adam
        times = time_training_steps(mcfg.to_dict(), batches[k * (updates + 1):(k + 1) * (updates + 1)], amp,
                                    cfg.ctc_weight)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="st", choices=["asr", "st"])
    ap.add_argument("--updates", type=int, default=96)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--row", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(json.dumps(one_row(args.task, args.row, args.updates)))
        return
    print(f"{args.task.upper()} training updates on new en-de batches, one process per row; mean ms per update "
          f"in blocks of {args.block} (after one warm-up update)")
    first = None
    for row in ROWS:
        env = dict(os.environ)
        if row == "bf16, kernel cache 1024":
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "1024"
        out = subprocess.run([sys.executable, __file__, "--row", row, "--task", args.task, "--updates",
                              str(args.updates)], cwd=ROOT, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{row} failed:\n{out.stderr[-2000:]}")
        t = json.loads(out.stdout.strip().splitlines()[-1])
        blocks = [t[i:i + args.block] for i in range(0, len(t), args.block)]
        mean = 1e3 * statistics.fmean(t)
        first = first or mean
        print(f"  {row:<24} " + " ".join(f"{1e3 * statistics.fmean(b):6.1f}" for b in blocks)
              + f"   all {mean:6.1f} ms ({first / mean:.2f}x of fp32)")


if __name__ == "__main__":
    main()
