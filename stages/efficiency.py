"""Stage `efficiency`: measured speed and memory of local vs full attention on this machine's CPU.

Runs benchmarks/encoder_efficiency.py (the attention op for w in `efficiency.op_windows`, and the
12 paper-size encoder layers: all-full vs the paper's En-De windows vs the pipeline's own windows
from data/windows/<efficiency.pair>/windows.json, skipped with a note when that file is absent)
for N in `efficiency.lengths`, and writes

    metrics/efficiency.json          flat: times, speedups, FLOP bounds, memory, target checks
    metrics/efficiency.md            the tables, for people (read by the `report` stage)
    plots/efficiency/time_vs_N.png   time against N, log-log

The `efficiency` section of params.yaml is optional (defaults in lib/report/efficiency.py:
EfficiencyParams); `efficiency.quick: true` runs the < 1 min smoke version.  Timings depend on
the machine and its load (printed and recorded): the stage is a measurement, not a pure function
of its inputs.

    python stages/efficiency.py [--quick]
"""
from __future__ import annotations

import argparse
import sys

from _common import ROOT, stage_params

from benchmarks.encoder_efficiency import run_benchmark
from lib.params import ParamError
from lib.report.efficiency import efficiency_params, markdown_report, write_outputs

METRICS = ROOT / "metrics" / "efficiency.json"
MARKDOWN = ROOT / "metrics" / "efficiency.md"
PLOT = ROOT / "plots" / "efficiency" / "time_vs_N.png"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run (overrides efficiency.quick)")
    args = ap.parse_args(argv)
    p = stage_params()
    try:
        e = efficiency_params(p.extra)
    except (ParamError, ValueError) as err:
        sys.exit(f"error: params.yaml: {err}")
    result = run_benchmark(ns=e.lengths, op_windows=e.op_windows, op_reps=e.op_reps,
                           encoder_reps=e.encoder_reps,
                           windows_json=ROOT / "data" / "windows" / e.pair / "windows.json",
                           quick=e.quick or args.quick, log=lambda s: print(s, flush=True))
    print()
    print(markdown_report(result))
    for path in write_outputs(result, metrics=METRICS, md=MARKDOWN, plot=PLOT):
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
