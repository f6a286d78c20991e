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

from _common import ROOT, run_stage, stage_params

from lib import layout
from lib.analysis.health import health_stage
from lib.layout import RunPaths
from lib.parallel import share_cores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("model", choices=["asr", "st"])
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    p = stage_params(args.pair)
    share_cores(p.parallel.jobs)
    a = p.analysis
    if args.model == "asr":
        model_path, producer = RunPaths(ROOT, "asr", args.pair).model, "train_asr"
    else:  # the ST baseline that select_windows analyses
        model_path = RunPaths(ROOT, "baseline", args.pair, a.st_seed).model
        producer = f"train_baseline@{args.pair}-{a.st_seed} (analysis.st_seed must be one of the seeds run)"
    result = health_stage(  # a missing model or input: run_stage's one line
        model_path, ROOT / p.data.prepared_dir / args.pair, args.model, args.pair, ap=a, hp=p.health,
        details_path=layout.health_data(ROOT, args.pair, args.model),
        metrics_path=layout.health_metrics(ROOT, args.pair, args.model),
        plot_path=layout.health_plot(ROOT, args.pair, args.model),
        producer=producer, progress=not args.no_progress,
        windows_path=layout.windows_json(ROOT, args.pair) if args.model == "st" else None)
    print(json.dumps({"summary": result["summary"], "algorithm1_windows": result["algorithm1_windows"]}))


if __name__ == "__main__":
    run_stage(main)
