"""What logging one update's curves costs, against the number of updates already logged: dvclive's
``Live`` (which re-reads every curve on every step, for DVC Studio) beside lib/train/live.py's
``TrainingLive`` (which does not when no Studio is configured), in one run.

Per history length it writes that many updates of the training loop's per-update metrics (train/loss,
train/lr, train/grad_norm, train/ctc), then times ``--steps`` more updates (set the step, log the
metrics, ``next_step``) with each class, resumed from the same history, and prints milliseconds per
update and their ratio. The lengths: the demo's ST run (720), its ASR model (6000), and the paper
profile's 50k-update runs.

    python benchmarks/live_logging.py [--histories 0 720 6000 50000] [--steps 20]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dvclive import Live  # noqa: E402

from lib.train.live import TrainingLive  # noqa: E402

METRICS = ("train/loss", "train/lr", "train/grad_norm", "train/ctc")


def _write_history(folder: Path, updates: int) -> None:
    live = TrainingLive(dir=str(folder), dvcyaml=False, save_dvc_exp=False, report=None)
    for step in range(1, updates + 1):
        live.step = step
        for i, name in enumerate(METRICS):
            live.log_metric(name, 1.0 / (step + i))
        live.next_step()


def ms_per_update(cls: type, history: Path, workdir: Path, steps: int, start: int) -> float:
    """Milliseconds per logged update of ``cls``, resumed from a copy of ``history``."""
    folder = workdir / cls.__name__
    shutil.rmtree(folder, ignore_errors=True)
    if history.exists():
        shutil.copytree(history, folder)
    live = cls(dir=str(folder), resume=start > 0, dvcyaml=False, save_dvc_exp=False, report=None)
    t0 = time.perf_counter()
    for step in range(start + 1, start + steps + 1):
        live.step = step
        for i, name in enumerate(METRICS):
            live.log_metric(name, 1.0 / (step + i))
        live.next_step()
    seconds = time.perf_counter() - t0
    live.end()
    return 1000 * seconds / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--histories", type=int, nargs="+", default=[0, 720, 6000, 50000])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    for var in ("DVC_STUDIO_TOKEN", "STUDIO_TOKEN"):
        os.environ.pop(var, None)
    print(f"{len(METRICS)} curves per update, {args.steps} updates timed per history; ms per update")
    print(f"{'updates logged':>15} {'dvclive Live':>13} {'TrainingLive':>13} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.chdir(work)  # no git / DVC repository around the logs
        for n in args.histories:
            history = work / f"history-{n}"
            if n:
                _write_history(history, n)
            plain = ms_per_update(Live, history, work, args.steps, n)
            ours = ms_per_update(TrainingLive, history, work, args.steps, n)
            print(f"{n:>15} {plain:>13.2f} {ours:>13.2f} {plain / ours:>6.1f}x", flush=True)
            shutil.rmtree(history, ignore_errors=True)


if __name__ == "__main__":
    main()
