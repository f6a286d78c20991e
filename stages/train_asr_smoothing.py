"""Stage `train_asr_smoothing`: ASR pretraining with the attention smoothing of one system of
``smoothing.defs`` (only for systems listed in ``smoothing.asr_systems``), for one pair, with the
``train_asr`` hyperparameters; train_smoothing then starts that system's ST encoder from it instead of
the baseline's ASR model (Maekaku et al.'s A6: a predicted γ starts at 0.5, strong smoothing for an encoder
that never saw any). Resumable like train_asr.

    python stages/train_asr_smoothing.py rec en-de
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

import lib.model.attention.smoothing  # noqa: F401 (registers the `smooth` attention variant this stage trains)
import lib.params.smoothing  # noqa: F401 (parses the params' smoothing section, which this stage reads)
from lib.train.distributed import init_distributed
from lib.train.run import run
from lib.train.experiments import smoothing_spec_from_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("system", help="a name from smoothing.defs")
    ap.add_argument("pair")
    args = ap.parse_args()
    p = stage_params(args.pair)
    try:
        spec = smoothing_spec_from_params(p, ROOT, args.system, args.pair)
    except ValueError as e:
        sys.exit(f"error: {e}")
    init_distributed(p.train_asr.processes, "train_asr.processes")
    metrics = run(spec)
    if metrics:
        print(json.dumps(metrics))


if __name__ == "__main__":
    run_stage(main)
