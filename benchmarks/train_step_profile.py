"""Where a training step's time goes, fp32 against bf16 autocast: torch.profiler's self CPU time per
operator (ms per update) on the pipeline's real batches, the two precisions side by side, each in
its own process (as the pipeline runs, and because oneDNN's per-shape bf16 kernels built in one
process would flatter the other). The ASR batches (`train_asr`) or the ST batches (`train_st`) of the
prepared en-de data, the demo model with params.yaml's `model.overrides`, fused Adam; bf16 batches
padded as a bf16 run pads them (`pad_*: auto`). The first `--warmup` batches build the kernels of
their shapes and are not profiled.

    python benchmarks/train_step_profile.py [--task asr] [--updates 20] [--warmup 40] [--threads 2] [--top 25]

Where the bf16 step loses what its matmuls win is the question it answers (issue 12's leads).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _real_batches import training_update  # noqa: E402
from lib.data.dataset import first_batches  # noqa: E402


def one(task: str, amp: str, updates: int, warmup: int, threads: int) -> dict:
    """In this process: ms per update of each operator's self CPU time, and of the whole update."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    ds, max_frames, pad, step, _ = training_update(task, "en-de", amp)
    batches = first_batches(ds, max_frames, warmup + updates, seed=1, pad_frames_to=pad[0], pad_tokens_to=pad[1])
    for b in batches[:warmup]:
        step(b)
    seconds = 0.0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches[warmup:]:
            t0 = time.perf_counter()
            step(b)
            seconds += time.perf_counter() - t0
    n = len(batches) - warmup
    ops = {e.key: {"ms": e.self_cpu_time_total / 1e3 / n, "calls": e.count / n} for e in prof.key_averages()}
    return {"step_ms": 1e3 * seconds / n, "ops": ops, "updates": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["asr", "st"], default="asr")
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--amp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.amp:
        print(json.dumps(one(args.task, args.amp, args.updates, args.warmup, args.threads)))
        return
    res = {}
    for amp in ("none", "bf16"):
        out = subprocess.run([sys.executable, __file__, "--amp", amp, "--task", args.task, "--updates", str(args.updates),
                              "--warmup", str(args.warmup), "--threads", str(args.threads)],
                             cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"the {amp} process failed:\n{out.stderr[-2000:]}")
        res[amp] = json.loads(out.stdout.strip().splitlines()[-1])
    f, b = res["none"], res["bf16"]
    print(f"torch {torch.__version__}, {args.threads} thread(s); {args.task.upper()} batches of en-de, {f['updates']} "
          f"profiled updates after {args.warmup} warm-up ones, one process per precision")
    print(f"\nstep (wall, profiler on): fp32 {f['step_ms']:.1f} ms, bf16 {b['step_ms']:.1f} ms, "
          f"{f['step_ms'] / b['step_ms']:.2f}x\n")
    print("| operator (self CPU time) | fp32 ms / update | bf16 ms / update | fp32 / bf16 | calls / update fp32, bf16 |")
    print("|---|---|---|---|---|")
    names = sorted(set(f["ops"]) | set(b["ops"]), key=lambda k: -b["ops"].get(k, {"ms": 0})["ms"])
    for k in names[:args.top]:
        x, y = f["ops"].get(k, {"ms": 0.0, "calls": 0}), b["ops"].get(k, {"ms": 0.0, "calls": 0})
        ratio = f"{x['ms'] / y['ms']:.2f}x" if y["ms"] > 0 else ""
        print(f"| {k} | {x['ms']:.2f} | {y['ms']:.2f} | {ratio} | {x['calls']:.0f}, {y['calls']:.0f} |")


if __name__ == "__main__":
    main()
