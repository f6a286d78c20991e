"""Stage `train_local`: ST with local attention in the upper encoder layers (the paper's Section 4),
for one pair and seed. Same data, hyperparameters (`train_st`), decoding and metrics as `train_baseline`, so the
comparison differs in the attention only. The per-layer windows come from `select_windows`
(data/windows/<pair>/windows.json) unless `local.windows` overrides them. The encoder starts from
runs/asr_local/<pair>/model.pt, written by `train_asr_local`: the baseline's ASR model
(`local.asr_pretraining: shared`, the paper), the baseline's ASR training finished with local attention
(`fork`, the demo default) or one pretrained with local attention from scratch (`local`).

    python stages/train_local.py en-de 1
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

from lib.train.distributed import init_distributed
from lib.train.run import run
from lib.train.experiments import local_encoder_attention, spec_from_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("seed", type=int)
    args = ap.parse_args()
    p = stage_params(args.pair)
    try:
        spec_layers = local_encoder_attention(p, ROOT, args.pair)
    except ValueError as e:
        sys.exit(f"error: {e}")
    init_distributed(p.train_st.processes, "train_st.processes")
    spec = spec_from_params(p, ROOT, "local", args.pair, args.seed, encoder_attention=spec_layers)
    metrics = run(spec)
    if metrics:
        metrics_out = {**metrics, "windows": [s.get("window", 0) for s in spec_layers]}
        print(json.dumps(metrics_out))


if __name__ == "__main__":
    run_stage(main)
