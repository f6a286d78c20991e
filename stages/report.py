"""Stage `report`: Table 2 (BLEU/chrF mean ± std over seeds, baseline vs local, paired bootstrap),
Table 1 per pair, attention health, the efficiency table and the figures, in one Markdown report
(reports/report.md), plus the small flat metrics/summary.json (lib/report/document.py).

    python stages/report.py
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

from lib import layout
from lib.io import atomic_write_json, atomic_write_text
from lib.report.document import build_report


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    p = stage_params()
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
