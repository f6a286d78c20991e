"""Stage `train_asr_local`: the ASR model that `train_local` starts from, for one pair.

`local.asr_pretraining` (params.yaml) decides what it is:

- ``shared`` (default, as in the paper): the baseline's ASR model. runs/asr/<pair>/model.pt, its test
  decoded test set and curves are copied to runs/asr_local/<pair>/ (and its data/decoded/, plots/train/) and its metrics to
  metrics/asr_local/<pair>.json with ``"asr_pretraining": "shared"``. Takes a second; DVC's cache
  stores the identical model once.
- ``fork`` (the demo default, not in the paper): the baseline's ASR training itself, continued from
  its state ``asr.fork_updates`` updates before the end (runs/asr/<pair>/fork.pt, written by
  train_asr) to its last update with the local-attention spec of `train_local`: same data, batches,
  schedule, optimizer state and precision, so the two ASR models differ in the attention of those
  last updates only (lib.train.run.asr_fork_spec_from_params). Resumable like `train_asr`.
- ``local``: ASR pretraining with the local-attention spec of `train_local` (layers
  1..analysis.full_layers full, the others with the select_windows / `local.windows` windows), the
  `train_asr` hyperparameters otherwise, resumable like `train_asr`. Then both the ASR encoder and
  the ST fine-tuning use local attention, and the ST comparison differs from the baseline in the
  attention of both stages.

    python stages/train_asr_local.py en-de
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

from lib.io import atomic_write_json
from lib.layout import RunPaths
from lib.train.loop import init_distributed
from lib.train.run import (asr_fork_at, asr_fork_spec_from_params, load_fork_state, local_encoder_attention, run,
                           share_asr_run, spec_from_params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    args = ap.parse_args()
    p = stage_params(args.pair)
    dst = RunPaths(ROOT, "asr_local", args.pair)
    if p.local.asr_pretraining == "shared":
        try:
            metrics = share_asr_run(RunPaths(ROOT, "asr", args.pair), dst)
        except FileNotFoundError as e:
            sys.exit(f"error: {e}")
        print(json.dumps(metrics))
        return
    try:
        spec_layers = local_encoder_attention(p, ROOT, args.pair)
    except ValueError as e:
        sys.exit(f"error: {e}")
    init_distributed()
    if p.local.asr_pretraining == "fork":
        spec = asr_fork_spec_from_params(p, ROOT, args.pair, spec_layers)
        try:  # a clear error for a missing fork state or a placeholder, before any work
            load_fork_state(spec.start_from)
        except ValueError as e:
            sys.exit(f"error: {e}")
    else:
        spec = spec_from_params(p, ROOT, "asr_local", args.pair, encoder_attention=spec_layers)
    metrics = run(spec)
    if metrics:
        metrics = {**metrics, "asr_pretraining": p.local.asr_pretraining}
        if p.local.asr_pretraining == "fork":
            metrics.update(forked_at=asr_fork_at(p),
                           trained_on=spec.prepared_dir.name)
        atomic_write_json(dst.metrics, metrics)
        print(json.dumps({**metrics, "windows": [s.get("window", 0) for s in spec_layers]}))


if __name__ == "__main__":
    run_stage(main)
