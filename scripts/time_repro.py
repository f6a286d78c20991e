"""Run `scripts/repro.py` (= `make repro`: `dvc repro` with independent stages side by side; extra
arguments passed through, e.g. `-j 1`) and report the wall time of every stage.

    python scripts/time_repro.py            # the whole default pipeline
    python scripts/time_repro.py train_baseline   # one stage (matrix) and what it needs
    python scripts/time_repro.py --fresh -f       # every stage, every model trained from scratch

``--fresh`` first removes every pipeline run's resume state (runs/**/checkpoints, except inside the
scratch folders of scripts/asr_draws.py and scripts/st_length.py, which hold their own runs): without
it a forced training stage whose last.pt matches its config resumes at its final update and only
decodes, so `-f` alone does not time the training.

Prints a table at the end and writes it to reports/repro_timing.json (not a DVC metric: wall times
vary run to run): per stage its start and end, per stage group the wall time while any of its
stages ran (with stages side by side the groups overlap, so they can sum to more than the total).
Paths in it are relative to the repository, so a timing file names no machine's folders.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pipeline_checkpoints(runs: Path) -> list[Path]:
    """The checkpoints folders of the pipeline's runs under ``runs``: every one, except those inside a
    scratch workdir of another script (a folder whose .gitignore is ``*``, as scripts/asr_draws.py and
    scripts/st_length.py write; their draws are runs of their own, resumed by those scripts)."""
    scratch = [g.parent for g in runs.rglob(".gitignore") if g.read_text(encoding="utf-8").strip() == "*"]
    return sorted(d for d in runs.rglob("checkpoints")
                  if d.is_dir() and not any(d.is_relative_to(s) for s in scratch))


def main() -> None:
    from _venv import ensure_project_venv

    ensure_project_venv(ROOT)  # so that scripts/repro.py runs under .venv too (sys.executable)
    import argparse

    import repro

    ap = repro.build_parser(prog="time_repro.py")
    ap.description = (__doc__ + "\nEvery option but --fresh is scripts/repro.py's (below); --timing is this "
                      "script's to set.\n\n" + (repro.__doc__ or ""))
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--fresh", action="store_true",
                    help="first remove every pipeline run's checkpoints (runs/**/checkpoints, the scratch draws "
                         "of scripts/asr_draws.py and scripts/st_length.py kept), so that -f times the training")
    args = sys.argv[1:]
    parsed = ap.parse_args(args)  # a bad argument stops here, before any file is touched
    if parsed.timing is not None:
        ap.error("--timing: this script writes reports/repro_timing.json itself")
    if parsed.dry or parsed.replay is not None or parsed.estimate:  # nothing runs: leave every file alone
        if parsed.fresh:
            ap.error("--fresh: nothing runs with --dry, --replay or --estimate, so nothing is removed")
        sys.exit(subprocess.call([sys.executable, str(ROOT / "scripts" / "repro.py"), *args], cwd=ROOT))
    problem = repro.unknown_targets(ROOT, parsed.targets)
    if problem:
        sys.exit(f"error: {problem}")
    if parsed.fresh:
        args = [a for a in args if a != "--fresh"]
        stale = pipeline_checkpoints(ROOT / "runs")
        for d in stale:
            shutil.rmtree(d)
        print(f"--fresh: removed {len(stale)} checkpoints folders under runs/", flush=True)
    rel = Path("reports") / "repro_timing.json"  # relative to ROOT, the working directory of scripts/repro.py
    out = ROOT / rel
    out.unlink(missing_ok=True)  # (a stale file must not pass for this run's timing)
    cmd = [sys.executable, str(ROOT / "scripts" / "repro.py"), *args, "--timing", rel.as_posix()]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    while True:  # Ctrl-C reaches scripts/repro.py too, which stops its stages: wait for it, never kill it
        try:
            rc = proc.wait()
            break
        except KeyboardInterrupt:
            continue
    end = time.perf_counter()
    if not out.is_file():  # nothing ran (up to date, or a bad argument)
        sys.exit(rc)
    result = json.loads(out.read_text(encoding="utf-8"))
    result.update({"total_seconds": round(end - t0, 1), "loadavg_start": load0, "loadavg_end": os.getloadavg()})
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    print("\nstage group            seconds (wall time while any of its stages ran; groups overlap)")
    for g, sec in result["by_stage_group"].items():
        print(f"{g:<22} {sec:>8.1f}")
    print(f"{'total':<22} {result['total_seconds']:>8.1f}   ({result['total_seconds'] / 60:.1f} min, "
          f"{result['jobs']} at a time), rc={rc}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
