"""Where one whole ST run's time goes, fp32 against bf16, side by side: the pipeline's own en-de
baseline run (params.yaml's `train_st`, the pair's ASR model, `decode`), trained from scratch into a
temporary folder (the workspace's runs/ are not touched), each precision in its own process under
cProfile, as `train_baseline` runs it (one thread by default: `parallel.jobs: auto` on 2 cores).

    python benchmarks/st_run_breakdown.py [--pair en-de] [--seed 1] [--threads 1] [--updates N]
    python benchmarks/st_run_breakdown.py --system asr_shared --threads 2 --updates 400

``--system asr_shared``: the shared English ASR model's run instead (params.yaml's `train_asr`, CTC
included, trained from scratch; two threads, as it trains alone in the pipeline). With ``--updates
400`` it stops at its first dev evaluation (`eval_every: 400`), so the run's share of evaluation is
the full run's (6 evaluations in 2400 updates), its warm-up whole, and the rest of its schedule left out.

Printed per precision: seconds of the run by part (forward, of which dropout; backward; optimizer
step and gradient clipping; batching; checkpoints; the dev evaluation; dvclive logging; the rest of
the training loop; set-up before it; decoding tst-COMMON; the process's imports and start-up), and
the fp32 / bf16 ratio of each part. It answers issue 12's question of why a whole ST run gains less
than one training step in `train_throughput.py`: the parts that do not get faster in bf16. cProfile
adds a little to every Python call (the dropout wrapper and the module calls most), so the parts
are cProfile's cumulative seconds, and their sum is the profiled run, a few % over a plain run.
Needs the pipeline's outputs for the pair (`data/prepared/<pair>`, `runs/asr/<pair>/model.pt`).
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T_START = time.perf_counter()  # before the heavy imports: the start-up part counts them

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (part, file suffix, function name): cProfile's cumulative seconds of that function
PARTS = [
    ("forward (model + loss)", "lib/train/loop.py", "forward"),
    ("  of which dropout", "lib/model/dropout.py", "dropout"),
    ("backward", "torch/_tensor.py", "backward"),
    ("optimizer step", "torch/amp/grad_scaler.py", "step"),
    ("gradient clipping", "torch/nn/utils/clip_grad.py", "_no_grad_wrapper"),
    ("batching (collate)", "lib/data/dataset.py", "collate"),
    ("checkpoints", "lib/train/loop.py", "_save_checkpoint"),
    ("dev evaluation", "lib/train/loop.py", "_dev_metrics"),
    ("dvclive logging", "dvclive/live.py", "next_step"),
    ("dvclive logging", "dvclive/live.py", "log_metric"),
    ("optimizer creation", "lib/train/loop.py", "make_optimizer"),
]


def _cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    """Cumulative seconds of every function ``name`` in a file ending with ``suffix``, counted
    once per top-level call (recursive calls are inside their caller's time)."""
    return sum(v[3] for (path, _, fn), v in stats.stats.items() if fn == name and path.endswith(suffix))


def one_run(amp: str, pair: str, seed: int, threads: int, updates: int | None, out: Path,
            system: str = "baseline") -> dict:
    """In this process: train and decode one baseline run (or ``system``'s) under cProfile; its parts in seconds."""
    from lib.params import load_params
    from lib.layout import RunPaths
    from lib.train.run import run, spec_from_params

    p = load_params(ROOT / "params.yaml")
    spec = spec_from_params(p, ROOT, system, pair, seed)
    train = dataclasses.replace(spec.train, amp=amp, **({"max_updates": updates, "eval_every": updates}
                                                        if updates else {}))
    paths = RunPaths(out, system) if system == "asr_shared" else RunPaths(out, system, pair, seed)
    spec = dataclasses.replace(spec, paths=paths, train=train, threads=threads,
                               **({"fork_at": None} if updates and (spec.fork_at or 0) > updates else {}))
    t_imports = time.perf_counter() - T_START
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    metrics = run(spec, progress=False)
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    timing = json.loads(spec.paths.timing.read_text())
    parts: dict[str, float] = {}
    for label, suffix, name in PARTS:
        parts[label] = parts.get(label, 0.0) + _cumulative(stats, suffix, name)
    named = sum(v for k, v in parts.items() if not k.startswith("  "))
    parts["rest of the training loop"] = timing["train_seconds"] - named
    parts["set-up (data, model, ASR init)"] = wall - timing["train_seconds"] - timing["decode_seconds"]
    parts["decoding tst-COMMON (beam 5)"] = timing["decode_seconds"]
    parts["imports and start-up"] = t_imports
    return {"amp": amp, "parts": parts, "total": wall + t_imports, "train_seconds": timing["train_seconds"],
            "bleu": metrics.get("bleu"), "wer": metrics.get("wer"), "precision": metrics.get("precision"), "updates": metrics.get("updates")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="en-de")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--updates", type=int, help="fewer updates than train_st.max_updates (a quick look)")
    ap.add_argument("--system", choices=["baseline", "asr_shared"], default="baseline")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child: none | bf16
    args = ap.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory(prefix="st_run_breakdown_") as tmp:
            print(json.dumps(one_run(args.one, args.pair, args.seed, args.threads, args.updates, Path(tmp),
                                     args.system)))
        return
    # warm the file cache first, so that neither process pays a cold import of torch the other does not
    subprocess.run([sys.executable, "-c", "import torch, dvclive, sentencepiece, sacrebleu"], check=True)
    results = {}
    for amp in ("none", "bf16"):  # one fresh process each, as the pipeline runs them
        cmd = [sys.executable, __file__, "--one", amp, "--pair", args.pair, "--seed", str(args.seed),
               "--threads", str(args.threads), "--system", args.system] + (["--updates", str(args.updates)] if args.updates else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"error: the {amp} run failed:\n{done.stderr[-3000:]}")
        results[amp] = json.loads(done.stdout.strip().splitlines()[-1])
    a, b = results["none"], results["bf16"]
    what = ("the shared ASR model's run (CTC included" if args.system == "asr_shared" else f"one {args.pair} baseline run (seed {args.seed}")
    print(f"{what}, {a['updates']} updates, {args.threads} thread(s)), seconds under cProfile; "
          + (f"WER fp32 {a['wer']}, bf16 {b['wer']}" if args.system == "asr_shared" else f"BLEU fp32 {a['bleu']}, bf16 {b['bleu']}"))
    print(f"| part | fp32 s | bf16 s | fp32 / bf16 | share of the bf16 run |")
    print("|---|---|---|---|---|")
    for k in a["parts"]:
        x, y = a["parts"][k], b["parts"][k]
        ratio = f"{x / y:.2f}×" if y > 0.05 else "–"
        print(f"| {k} | {x:.1f} | {y:.1f} | {ratio} | {y / b['total']:.0%} |")
    print(f"| **whole run** | **{a['total']:.1f}** | **{b['total']:.1f}** | **{a['total'] / b['total']:.2f}×** | 100% |")
    fb = ("forward (model + loss)", "backward")
    fx, fy = sum(a["parts"][k] for k in fb), sum(b["parts"][k] for k in fb)
    print(f"\nforward + backward: {fx:.1f} → {fy:.1f} s ({fx / fy:.2f}×); everything else: "
          f"{a['total'] - fx:.1f} → {b['total'] - fy:.1f} s ({(a['total'] - fx) / (b['total'] - fy):.2f}×)")


if __name__ == "__main__":
    main()
