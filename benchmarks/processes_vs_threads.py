"""Two CPU cores for one training run: one process with 2 threads (how the shared ASR model trains)
against 2 processes with 1 thread each, each on half of every update's frames (data parallel, as
`torchrun --nproc_per_node=2` on CPU would split it), fp32 and bf16, on the pipeline's ASR batches.

Every update covers the same frames in both layouts: the one-process rows train on batches of
`train_asr.max_frames`, the two-process rows on batches of half that size, one per process, run at
the same time (update k of process r is batch 2k + r). Each process trains its own model, so this is
the ceiling of data parallelism: the gradient all-reduce that DDP adds per update (gloo, the model's
fp32 gradient, 2 processes) is timed on its own and printed beside it. Rounds alternate the layouts
(this host drifts by 10-20 % within minutes); medians of the rounds' mean ms per update, after
`--warmup` updates that build oneDNN's kernels for their shapes. bf16 batches are padded as a bf16
run pads them (`pad_*: auto`).

    python benchmarks/processes_vs_threads.py [--updates 30] [--warmup 20] [--rounds 3] [--amp none bf16]

The question it answers (issue 12, "thread settings"): what a second core buys a training run on
this CPU, and so what data parallelism over processes could still buy the one stage that trains
alone (the shared ASR model); the per-pair and per-seed stages already run one process per core
(`parallel.jobs`, README "Runs side by side").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _real_batches import training_update  # noqa: E402
from lib.data.dataset import first_batches  # noqa: E402
from lib.params import load_params  # noqa: E402


def train_updates(amp: str, threads: int, part: str, updates: int, warmup: int) -> dict[str, float]:
    """In this process: mean ms per update over ``updates`` updates after ``warmup``. ``part``:
    ``all`` (batches of max_frames) or ``0`` / ``1`` (every other batch of max_frames / 2)."""
    torch.set_num_threads(threads)
    p = load_params(ROOT / "params.yaml")
    ds, max_frames, pad, step, model = training_update("asr", p.asr.shared_pair, amp)
    n = warmup + updates
    if part == "all":
        batches = first_batches(ds, max_frames, n, seed=1, pad_frames_to=pad[0], pad_tokens_to=pad[1])
    else:
        halves = first_batches(ds, max_frames // 2, 2 * n, seed=1, pad_frames_to=pad[0], pad_tokens_to=pad[1])
        batches = halves[int(part)::2]
    for b in batches[:warmup]:
        step(b)
    t0, c0 = time.perf_counter(), time.process_time()
    for b in batches[warmup:]:
        step(b)
    wall = time.perf_counter() - t0
    return {"ms": 1e3 * wall / updates, "cores": (time.process_time() - c0) / wall,
            "params": sum(x.numel() for x in model.parameters())}


def allreduce_ms(numel: int, repeats: int = 20) -> float:
    """Under torchrun (2 processes, gloo): ms per all-reduce of ``numel`` fp32 values (rank 0 prints)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    grad = torch.randn(numel)
    for _ in range(3):
        dist.all_reduce(grad)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(grad)
    ms = 1e3 * (time.perf_counter() - t0) / repeats
    dist.destroy_process_group()
    return ms


def _cmd(*args: str) -> list[str]:
    return [sys.executable, __file__, *args]


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(proc.args)} failed:\n{err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--amp", nargs="+", default=["none", "bf16"], choices=["none", "bf16"])
    ap.add_argument("--child", nargs=3, metavar=("AMP", "THREADS", "PART"), help=argparse.SUPPRESS)
    ap.add_argument("--allreduce", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        amp, threads, part = args.child
        print(json.dumps(train_updates(amp, int(threads), part, args.updates, args.warmup)))
        return
    if args.allreduce:
        ms = allreduce_ms(args.allreduce)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps({"ms": ms}))
        return

    steps = ["--updates", str(args.updates), "--warmup", str(args.warmup)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ms: dict[tuple[str, str], list[float]] = {}
    params = 0
    for _ in range(args.rounds):
        for amp in args.amp:
            one = _result(subprocess.Popen(_cmd("--child", amp, "2", "all", *steps), cwd=ROOT, text=True,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            ms.setdefault((amp, "1 x 2 threads"), []).append(one["ms"])
            params = one["params"]
            solo = _result(subprocess.Popen(_cmd("--child", amp, "1", "all", *steps), cwd=ROOT, text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env))
            ms.setdefault((amp, "1 x 1 thread"), []).append(solo["ms"])
            pair = [subprocess.Popen(_cmd("--child", amp, "1", part, *steps), cwd=ROOT, text=True, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE) for part in ("0", "1")]
            # the update takes as long as the slower process
            ms.setdefault((amp, "2 x 1 thread"), []).append(max(_result(proc)["ms"] for proc in pair))
    ar = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                         __file__, "--allreduce", str(params)], cwd=ROOT, env=env, capture_output=True, text=True)
    if ar.returncode != 0:
        raise SystemExit(f"the all-reduce timing failed:\n{ar.stderr[-2000:]}")
    reduce_ms = json.loads(ar.stdout.strip().splitlines()[-1])["ms"]

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; ASR batches of the shared pair, {args.updates} updates "
          f"after {args.warmup} warm-up ones per process, medians of {args.rounds} rounds (ms per update, equal frames)")
    print(f"gloo all-reduce of the {params:,} fp32 gradient values, 2 processes: {reduce_ms:.1f} ms per update\n")
    print("| precision | 1 process x 2 threads | 1 process x 1 thread | 2 processes x 1 thread, half batches "
          "| 2 processes + all-reduce | speed-up of 2 processes (+ all-reduce) over 1 x 2 threads |")
    print("|---|---|---|---|---|---|")
    for amp in args.amp:
        two, one, split = (statistics.median(ms[amp, k]) for k in ("1 x 2 threads", "1 x 1 thread", "2 x 1 thread"))
        print(f"| {'fp32' if amp == 'none' else amp} | {two:.1f} | {one:.1f} | {split:.1f} | {split + reduce_ms:.1f} "
              f"| {two / split:.2f}x ({two / (split + reduce_ms):.2f}x) |")
    for amp in args.amp:
        print(f"rounds, {'fp32' if amp == 'none' else amp}: "
              + "; ".join(f"{k}: {', '.join(f'{v:.0f}' for v in ms[amp, k])}"
                          for k in ("1 x 2 threads", "1 x 1 thread", "2 x 1 thread")))


if __name__ == "__main__":
    main()
