"""Stage `corpus_stats`: numbers and histograms of one prepared pair (durations, encoder length
N after subsampling, target length), for comparison with the paper's MuST-C figures.

    python stages/corpus_stats.py en-de
"""
from __future__ import annotations

import argparse
import json

from _common import ROOT, run_stage, stage_params

from lib import layout
from lib.io import InputError, atomic_write_json, read_json
from lib.report.corpus_stats import corpus_stats, plot_histograms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    args = ap.parse_args()
    p = stage_params(args.pair)
    prepared = ROOT / p.data.prepared_dir / args.pair
    stats, arrays = corpus_stats(prepared, list(p.prepare.splits))
    report = read_json(prepared / "report.json", f"prepare@{args.pair}", keys=("splits",))
    if not isinstance(report["splits"], dict) or not all(isinstance(r, dict) for r in report["splits"].values()):
        raise InputError(f"{prepared / 'report.json'}: 'splits' is not a mapping of split reports (written by "
                         f"the prepare@{args.pair} stage); rerun prepare@{args.pair}")
    stats["dropped"] = {split: r.get("dropped", {}) for split, r in report["splits"].items()}
    plot_histograms(arrays, layout.corpus_plots(ROOT, args.pair), title=f"{args.pair} ({p.data.mustc_root})")
    atomic_write_json(layout.corpus_metrics(ROOT, args.pair), stats)
    print(json.dumps(stats))


if __name__ == "__main__":
    run_stage(main)
