"""Stage `train_multi`: one multilingual ST model over all `pairs` (Gong et al.: attention head selection
for multilingual ST; lib/train/multi.py) for one system of `multi.systems` and one seed; then BLEU and
chrF on every pair's tst-COMMON, the selections, and the head-sharing heatmaps. Resumable.

    python stages/train_multi.py group 1
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

from lib.train.distributed import init_distributed
from lib.train.multi import run_multi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("system", help="baseline | subset | group | baseline_h8")
    ap.add_argument("seed", type=int)
    args = ap.parse_args()
    p = stage_params()
    init_distributed(p.train_st.processes, "train_st.processes")
    try:
        metrics = run_multi(p, ROOT, args.system, args.seed)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    if metrics:
        print(json.dumps({k: metrics[k] for k in (*p.pairs, "avg_bleu", "selection_changed_fraction")}))


if __name__ == "__main__":
    run_stage(main)
