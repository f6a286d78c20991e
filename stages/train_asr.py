"""Stage `train_asr`: ASR pretraining of the S2T Transformer on one pair's English transcripts,
then WER on tst-COMMON. Resumes from runs/asr/<pair>/checkpoints/last.pt when killed.

    python stages/train_asr.py en-de            (or: torchrun --nproc_per_node=N stages/train_asr.py en-de)
"""
from __future__ import annotations

import argparse
import json

from _common import ROOT, stage_params

from lib.train.loop import init_distributed
from lib.train.run import run, spec_from_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    args = ap.parse_args()
    p = stage_params(args.pair)
    init_distributed()
    metrics = run(spec_from_params(p, ROOT, "asr", args.pair))
    if metrics:
        print(json.dumps(metrics))


if __name__ == "__main__":
    main()
