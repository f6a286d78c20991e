"""Stage `train_local`: ST with local attention in the upper encoder layers (the paper's Section 4),
for one pair and seed. Same data, hyperparameters, ASR initialisation, decoding and metrics as
`train_st`, so the comparison differs in the attention only. The per-layer windows come from
`select_windows` (data/windows/<pair>/windows.json) unless `local.windows` overrides them.

    python stages/train_local.py en-de 1
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, stage_params

from lib.analysis.pipeline import analysis_params
from lib.model.s2t_transformer import model_config
from lib.model.spec import local_attention_spec, validate_spec
from lib.train.loop import init_distributed
from lib.train.run import run, spec_from_params


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
    spec = spec_from_params(p, ROOT, "local", args.pair, args.seed, encoder_attention=spec_layers)
    metrics = run(spec)
    if metrics:
        metrics_out = {**metrics, "windows": [s.get("window", 0) for s in spec_layers]}
        print(json.dumps(metrics_out))


if __name__ == "__main__":
    main()
