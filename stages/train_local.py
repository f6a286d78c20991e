"""Stage `train_local`: ST with local attention in the upper encoder layers (the paper's Section 4),
for one pair and seed. Same data, hyperparameters, ASR initialisation, decoding and metrics as
`train_st`, so the comparison differs in the attention only. The per-layer windows come from
`select_windows` (data/windows/<pair>/windows.json) unless `local.windows` overrides them.

    python stages/train_local.py en-de 1
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from _common import ROOT, stage_params
from train_asr import decode_configs

from lib.analysis.pipeline import analysis_params
from lib.model.s2t_transformer import model_config
from lib.model.spec import local_attention_spec, validate_spec
from lib.train.loop import init_distributed
from lib.train.run import RunSpec, run


def encoder_attention(p, pair: str) -> list[dict]:
    n_layers = model_config(p.model.size, **p.model.overrides).encoder_layers
    if p.local.windows:
        full_layers = analysis_params(p).full_layers
        return local_attention_spec(n_layers, full_layers, p.local.windows, key="local.windows")
    path = ROOT / "data" / "windows" / pair / "windows.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing; it is written by the select_windows stage (or set local.windows)")
    spec = json.loads(path.read_text(encoding="utf-8"))["encoder_attention"]
    return validate_spec(spec, n_layers, key=f"{path}: encoder_attention")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("seed", type=int)
    args = ap.parse_args()
    p = stage_params(args.pair)
    try:
        spec_layers = encoder_attention(p, args.pair)
    except ValueError as e:
        sys.exit(f"error: {e}")
    init_distributed()
    test_cfg, dev_cfg = decode_configs(p)
    spec = RunSpec(task="st", pair=args.pair, prepared_dir=ROOT / p.data.prepared_dir / args.pair,
                   out_dir=ROOT / "runs" / "local" / args.pair / f"seed{args.seed}",
                   metrics_path=ROOT / "metrics" / "local" / args.pair / f"seed{args.seed}.json",
                   train=dataclasses.replace(p.train_st, seed=args.seed), model_size=p.model.size,
                   model_overrides=p.model.overrides, encoder_attention=spec_layers,
                   init_encoder=ROOT / "runs" / "asr" / args.pair / "model.pt",
                   decode=test_cfg, dev_decode=dev_cfg, decode_batch_frames=p.decode.batch_frames,
                   final_checkpoint=p.decode.final_checkpoint, max_dev_decode=p.decode.dev_sentences)
    metrics = run(spec)
    if metrics:
        metrics_out = {**metrics, "windows": [s.get("window", 0) for s in spec_layers]}
        print(json.dumps(metrics_out))


if __name__ == "__main__":
    main()
