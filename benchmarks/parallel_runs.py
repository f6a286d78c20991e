"""Training runs one after the other (every core each) vs side by side (cores / runs threads each):
what `make repro` (scripts/repro.py, `parallel.jobs`) does with the 30 ST runs and the ASR forks.

Each run is its own process training ``--updates`` updates on the pipeline's real batches (the
prepared ``--pair`` training data, the demo model with params.yaml's ``model.overrides``,
fused Adam; bf16 on batches padded as ``pad_*: auto`` pads them). Runs differ in their batches
(seeds 1, 2, ...), as the pipeline's seeds do. Prints per task and precision the wall time of the
runs one after the other and side by side, the ratio, and the side-by-side bf16 against the
one-after-the-other fp32 (the pipeline before `parallel.jobs`, trained in fp32).

    python benchmarks/parallel_runs.py [--updates 120] [--runs 2] [--tasks st asr] [--pair en-de]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one_run(task: str, pair: str, amp: str, threads: int, seed: int, updates: int) -> dict[str, float]:
    """In this process: ``updates`` training updates with ``threads`` threads; wall seconds."""
    import torch

    from lib.data.dataset import SpeechDataset, first_batches
    from lib.model.s2t_transformer import S2TTransformer, model_config
    from lib.params import load_params
    from lib.precision import BF16_PAD_TO, autocast
    from lib.train.loop import Criterion

    torch.set_num_threads(threads)
    p = load_params(ROOT / "params.yaml")
    cfg = p.train_asr if task == "asr" else p.train_st
    ds = SpeechDataset(ROOT / p.data.prepared_dir / pair, "train", task, max_frames=cfg.max_frames_train)
    mcfg = model_config(p.model.size, vocab_size=ds.vocab_size,
                        ctc_vocab_size=ds.vocab_size if cfg.ctc_weight > 0 else None, **p.model.overrides)
    pad = BF16_PAD_TO if amp == "bf16" else (1, 1)
    batches = first_batches(ds, cfg.max_frames, updates, seed=seed, pad_frames_to=pad[0], pad_tokens_to=pad[1])
    torch.manual_seed(seed)
    model = S2TTransformer(mcfg).train()
    crit = Criterion(model, cfg.label_smoothing, cfg.ctc_weight)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    t0 = time.perf_counter()
    for b in batches:
        with autocast(torch.device("cpu"), amp):
            loss, _ = crit(b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"s": time.perf_counter() - t0}


def _cmd(task: str, pair: str, amp: str, threads: int, seed: int, updates: int) -> list[str]:
    return [sys.executable, __file__, "--child", json.dumps([task, pair, amp, threads, seed, updates])]


def wall(cmds: list[list[str]], side_by_side: bool) -> float:
    """Wall seconds to run ``cmds`` one after the other or all at once."""
    t0 = time.perf_counter()
    if side_by_side:
        procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
        for proc in procs:
            if proc.wait() != 0:
                raise SystemExit(proc.stderr.read().decode()[-2000:])
    else:
        for c in cmds:
            out = subprocess.run(c, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if out.returncode != 0:
                raise SystemExit(out.stderr.decode()[-2000:])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=120)
    ap.add_argument("--runs", type=int, default=0, help="runs side by side (default: the cores)")
    ap.add_argument("--tasks", nargs="+", default=["st", "asr"], choices=["st", "asr"])
    ap.add_argument("--pair", default="en-de")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_run(*json.loads(args.child))))
        return
    from lib.parallel import available_cores

    cores = available_cores()
    runs = args.runs or cores
    threads = max(1, cores // runs)
    print(f"{cores} cores; {runs} runs of {args.updates} updates each ({args.pair}, seeds 1..{runs}): one after the "
          f"other with {cores} threads each vs side by side with {threads} each; one process per run")
    print("| task | precision | one after the other (s) | side by side (s) | speed-up |")
    print("|---|---|---|---|---|")
    for task in args.tasks:
        res = {}
        for amp in ("none", "bf16"):
            seq = wall([_cmd(task, args.pair, amp, cores, s, args.updates) for s in range(1, runs + 1)], False)
            par = wall([_cmd(task, args.pair, amp, threads, s, args.updates) for s in range(1, runs + 1)], True)
            res[amp] = (seq, par)
            print(f"| {task.upper()} | {'fp32' if amp == 'none' else 'bf16'} | {seq:.1f} | {par:.1f} | "
                  f"**{seq / par:.2f}×** |", flush=True)
        print(f"| {task.upper()} | bf16 side by side vs fp32 one after the other | {res['none'][0]:.1f} | "
              f"{res['bf16'][1]:.1f} | **{res['none'][0] / res['bf16'][1]:.2f}×** |", flush=True)


if __name__ == "__main__":
    from lib.cli import run_tool

    run_tool(main)
