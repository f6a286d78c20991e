"""Stage `train_st`: the ST baseline for one pair and seed, encoder initialised from that pair's
ASR model, fresh decoder; then BLEU and chrF on tst-COMMON. Resumable like train_asr.

    python stages/train_st.py en-de 1
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from _common import ROOT, stage_params
from train_asr import decode_configs

from lib.train.loop import init_distributed
from lib.train.run import RunSpec, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("seed", type=int)
    args = ap.parse_args()
    p = stage_params(args.pair)
    init_distributed()
    test_cfg, dev_cfg = decode_configs(p)
    spec = RunSpec(task="st", pair=args.pair, prepared_dir=ROOT / p.data.prepared_dir / args.pair,
                   out_dir=ROOT / "runs" / "st" / args.pair / f"seed{args.seed}",
                   metrics_path=ROOT / "metrics" / "st" / args.pair / f"seed{args.seed}.json",
                   train=dataclasses.replace(p.train_st, seed=args.seed), model_size=p.model.size,
                   model_overrides=p.model.overrides, init_encoder=ROOT / "runs" / "asr" / args.pair / "model.pt",
                   decode=test_cfg, dev_decode=dev_cfg, decode_batch_frames=p.decode.batch_frames,
                   final_checkpoint=p.decode.final_checkpoint, max_dev_decode=p.decode.dev_sentences)
    metrics = run(spec)
    if metrics:
        print(json.dumps(metrics))


if __name__ == "__main__":
    main()
