"""Run `dvc repro` (extra arguments passed through) and report the wall time of every stage.

    python scripts/time_repro.py            # the whole default pipeline
    python scripts/time_repro.py train_baseline   # one stage (matrix) and what it needs
    python scripts/time_repro.py --fresh -f       # every stage, every model trained from scratch

``--fresh`` first removes every run's resume state (runs/**/checkpoints): without it a forced
training stage whose last.pt matches its config resumes at its final update and only decodes, so
`-f` alone does not time the training.

Prints a table at the end and writes it to reports/repro_timing.json (not a DVC metric: wall times
vary run to run). Stage output is streamed unchanged, so progress bars stay visible.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE_START = re.compile(r"Running stage '([^']+)'")


def main() -> None:
    args = sys.argv[1:]
    if "--fresh" in args:
        args = [a for a in args if a != "--fresh"]
        stale = sorted(d for d in (ROOT / "runs").rglob("checkpoints") if d.is_dir())
        for d in stale:
            shutil.rmtree(d)
        print(f"--fresh: removed {len(stale)} checkpoints folders under runs/", flush=True)
    cmd = ["dvc", "repro", *args]
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    durations: dict[str, float] = {}
    current, started = None, t0
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        m = STAGE_START.search(line)
        if m:
            now = time.perf_counter()
            if current is not None:
                durations[current] = round(now - started, 1)
            current, started = m.group(1), now
    rc = proc.wait()
    end = time.perf_counter()
    if current is not None:
        durations[current] = round(end - started, 1)
    groups: dict[str, float] = {}
    for stage, sec in durations.items():
        groups[stage.split("@")[0]] = round(groups.get(stage.split("@")[0], 0.0) + sec, 1)
    result = {"command": " ".join(cmd), "returncode": rc, "total_seconds": round(end - t0, 1),
              "cpu_count": os.cpu_count(), "loadavg_start": load0, "loadavg_end": os.getloadavg(),
              "by_stage_group": groups, "by_stage": durations}
    out = ROOT / "reports" / "repro_timing.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\nstage group            seconds")
    for g, sec in groups.items():
        print(f"{g:<22} {sec:>8.1f}")
    print(f"{'total':<22} {result['total_seconds']:>8.1f}   ({result['total_seconds'] / 60:.1f} min), rc={rc}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
