"""Stage `train_asr`: ASR pretraining of the S2T Transformer on one pair's English transcripts,
then WER on tst-COMMON. Resumes from runs/asr/<pair>/checkpoints/last.pt when killed.

    python stages/train_asr.py en-de            (or: torchrun --nproc_per_node=N stages/train_asr.py en-de)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import ROOT, stage_params

from lib.decode.beam_search import BeamSearchConfig
from lib.train.loop import init_distributed
from lib.train.run import RunSpec, run


def decode_configs(p) -> tuple[BeamSearchConfig, BeamSearchConfig]:
    d = p.decode
    test = BeamSearchConfig(beam=d.beam, len_penalty=d.len_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    dev = BeamSearchConfig(beam=1, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    return test, dev


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    args = ap.parse_args()
    p = stage_params(args.pair)
    init_distributed()
    test_cfg, dev_cfg = decode_configs(p)
    spec = RunSpec(task="asr", pair=args.pair, prepared_dir=ROOT / p.data.prepared_dir / args.pair,
                   out_dir=ROOT / "runs" / "asr" / args.pair, metrics_path=ROOT / "metrics" / "asr" / f"{args.pair}.json",
                   train=p.train_asr, model_size=p.model.size, model_overrides=p.model.overrides,
                   decode=test_cfg, dev_decode=dev_cfg, decode_batch_frames=p.decode.batch_frames,
                   final_checkpoint=p.decode.final_checkpoint, max_dev_decode=p.decode.dev_sentences)
    metrics = run(spec)
    if metrics:
        print(json.dumps(metrics))


if __name__ == "__main__":
    main()
