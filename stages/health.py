"""Stages `health_asr` and `health_st`: the attention-health check of one pair's ASR model or ST
baseline (lib/analysis/health.py): position share of the encoder input, attention output scale,
raw attention mass near the diagonal per layer and head, C_ii and the off-diagonal contribution
profile per layer, Algorithm 1's windows, and the inference band test (teacher-forced dev NLL and
token accuracy with layers k+1..L made local, no retraining). The ASR check is cheap and runs
before any ST training, so `dvc repro health_asr` tells whether a change lets locality emerge;
it computes Algorithm 1 on its own sentences. The ST check uses select_windows' windows.

    python stages/health.py en-de asr
    python stages/health.py en-de st

Writes metrics/health/<pair>/<model>.json (flat, for `dvc metrics diff`), data/health/<pair>/
<model>.json (everything, per head and per offset) and plots/health/<pair>/<model>.png.
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, stage_params

from lib.analysis.health import health_params, health_stage
from lib.analysis.pipeline import analysis_params
from lib.params import ParamError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("model", choices=["asr", "st"])
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    p = stage_params(args.pair)
    try:
        a, h = analysis_params(p), health_params(p)
    except ParamError as e:
        sys.exit(f"error: params.yaml: {e}")
    if args.model == "asr":
        model_path, producer = ROOT / "runs" / "asr" / args.pair / "model.pt", "train_asr"
    else:
        if a.st_seed not in p.seeds:
            sys.exit(f"error: analysis.st_seed={a.st_seed} is not in params.yaml 'seeds' {p.seeds}")
        model_path, producer = ROOT / "runs" / "st" / args.pair / f"seed{a.st_seed}" / "model.pt", "train_st"
    try:
        result = health_stage(
            model_path, ROOT / p.data.prepared_dir / args.pair, args.model, args.pair, ap=a, hp=h,
            details_path=ROOT / "data" / "health" / args.pair / f"{args.model}.json",
            metrics_path=ROOT / "metrics" / "health" / args.pair / f"{args.model}.json",
            plot_path=ROOT / "plots" / "health" / args.pair / f"{args.model}.png",
            producer=producer, progress=not args.no_progress,
            windows_path=ROOT / "data" / "windows" / args.pair / "windows.json" if args.model == "st" else None)
    except FileNotFoundError as e:
        sys.exit(f"error: {e}")
    print(json.dumps({"summary": result["summary"], "algorithm1_windows": result["algorithm1_windows"]}))


if __name__ == "__main__":
    main()
