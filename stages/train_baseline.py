"""Stage `train_baseline`: the ST baseline (full attention) for one pair and seed, encoder initialised
from that pair's ASR model; then BLEU and chrF on tst-COMMON. Resumable like train_asr.

    python stages/train_baseline.py en-de 1
"""
from __future__ import annotations

import argparse
import json

from _common import ROOT, run_stage, stage_params

from lib.train.distributed import init_distributed
from lib.train.run import run
from lib.train.experiments import spec_from_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("seed", type=int)
    args = ap.parse_args()
    p = stage_params(args.pair)
    init_distributed(p.train_st.processes, "train_st.processes")
    metrics = run(spec_from_params(p, ROOT, "baseline", args.pair, args.seed))
    if metrics:
        print(json.dumps(metrics))


if __name__ == "__main__":
    run_stage(main)
