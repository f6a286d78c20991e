"""Stage `report`: Table 2 (BLEU/chrF mean ± std over seeds, baseline vs local, paired bootstrap),
Table 1 per pair, attention health, the efficiency table and the figures, in one Markdown report
(reports/report.md), plus the small flat metrics/summary.json (lib/report/document.py).

    python stages/report.py
    python stages/report.py --archive reports/controls    # keep an opt-in experiment's report

``--archive DIR`` writes DIR/report.md and DIR/summary.json instead, with the figures of the experiment's
own stages (plots/variants/) copied beside them and the default stages' figures left out (the main report
shows those): a report that stays readable in git after the workspace moves on.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _common import ROOT, run_stage, stage_params

from lib import layout
from lib.io import atomic_write_json, atomic_write_text
from lib.report.document import build_report
from lib.report.figures import Figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archive", type=Path, metavar="DIR", help="write DIR/report.md and DIR/summary.json instead")
    args = ap.parse_args()
    p = stage_params()
    if args.archive is not None:
        out = (args.archive if args.archive.is_absolute() else Path.cwd() / args.archive).resolve()
        try:
            markdown, flat = build_report(p, ROOT, Figures(ROOT, out, archive=True))
        except (FileNotFoundError, ValueError) as e:
            sys.exit(f"error: {e}")
        atomic_write_json(out / "summary.json", flat)
        atomic_write_text(out / "report.md", markdown)
        print(f"wrote {out / 'report.md'}")
        return
    # An output (cache: false, so git keeps it): never empty, so that a fresh clone has it too.
    atomic_write_text(ROOT / layout.SMOOTHING_PLOTS / "README.md",
                      "Figures of the smoothing experiments (<pair>.png), written by the `report` stage when "
                      "`smoothing.systems` lists systems.\n")
    try:
        markdown, flat = build_report(p, ROOT)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    atomic_write_json(ROOT / layout.SUMMARY, flat)
    atomic_write_text(ROOT / layout.REPORT, markdown)
    print(json.dumps(flat))


if __name__ == "__main__":
    run_stage(main)
