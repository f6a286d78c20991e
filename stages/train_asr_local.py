"""Stage `train_asr_local`: the ASR model that `train_local` starts from, for one pair.

`local.asr_pretraining` (params.yaml) decides what it is:

- ``shared`` (default; one reading of the paper, docs/paper-vs-demo.md): the baseline's ASR model. runs/asr/<pair>/model.pt, its test
  decoded test set and curves are copied to runs/asr_local/<pair>/ (and its data/decoded/, plots/train/) and its metrics to
  metrics/asr_local/<pair>.json with ``"asr_pretraining": "shared"``. Takes a second; DVC's cache
  stores the identical model once.
- ``fork`` (the demo default, not in the paper): the baseline's ASR training itself, continued from
  its state ``asr.fork_updates`` updates before the end (runs/asr/<pair>/fork.pt, written by
  train_asr) to its last update with the local-attention spec of `train_local`: same data, batches,
  schedule, optimizer state and precision, so the two ASR models differ in the attention of those
  last updates only (lib.train.experiments.asr_fork_spec_from_params). Resumable like `train_asr`.
- ``local``: ASR pretraining with the local-attention spec of `train_local` (layers
  1..analysis.full_layers full, the others with the select_windows / `local.windows` windows), the
  `train_asr` hyperparameters otherwise, resumable like `train_asr`. Then both the ASR encoder and
  the ST fine-tuning use local attention, and the ST comparison differs from the baseline in the
  attention of both stages.

With ``fork`` and ``local.fork: shared`` (needs ``asr.mode: shared``) there is one fork for every
pair: ``train_asr_local_shared`` (``--shared``) finishes the shared English ASR training
(runs/asr_shared/fork.pt) once, with per layer the widest window of all pairs' select_windows
windows (lib.model.spec.widest_spec), into runs/asr_local_shared/; ``train_asr_local@<pair>`` then
copies it and scores it on the pair's own tst-COMMON, as train_asr does for the shared ASR model.
Each pair's ST run narrows the windows to its own. Otherwise ``--shared`` writes placeholders.

    python stages/train_asr_local.py en-de
    python stages/train_asr_local.py --shared
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

from lib.io import atomic_write_json
from lib.layout import RunPaths
from lib.parallel import share_cores
from lib.params import Params
from lib.train.distributed import init_distributed
from lib.train.run import load_fork_state, run
from lib.train.experiments import (adopt_shared_asr, asr_fork_at, asr_fork_spec_from_params,
                                   local_encoder_attention, share_asr_run, shared_fork_attention,
                                   shared_fork_spec_from_params, spec_from_params, uses_shared_fork,
                                   write_unused_shared_asr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair", nargs="?", help="the pair (train_asr_local); omit with --shared")
    ap.add_argument("--shared", action="store_true",
                    help="the one fork of local.fork: shared (train_asr_local_shared)")
    args = ap.parse_args()
    if args.shared == (args.pair is not None):
        ap.error("give a pair, or --shared")
    p = stage_params(args.pair)
    if args.shared:
        shared_fork(p)
    elif uses_shared_fork(p):
        # it decodes this pair's test set beside other stages under `make repro`: with torch's default
        # (every core) beside a 1-thread ST run it took 68-104 s instead of a few (measured, 2 cores)
        share_cores(p.parallel.jobs)
        try:
            metrics = adopt_shared_asr(p, ROOT, args.pair, source="asr_local_shared", system="asr_local")
        except (FileNotFoundError, ValueError) as e:
            sys.exit(f"error: {e}")
        print(json.dumps(metrics))
    else:
        own_asr_model(p, args.pair)


def shared_fork(p: Params) -> None:
    """train_asr_local_shared: the one fork of ``local.fork: shared``, or placeholders."""
    if not uses_shared_fork(p):
        why = (f"local.asr_pretraining is {p.local.asr_pretraining}, local.fork is {p.local.fork}: "
               f"each pair's train_asr_local makes its own model")
        print(json.dumps(write_unused_shared_asr(ROOT, "asr_local_shared", why, {"local_fork": "unused"})))
        return
    try:
        attention = shared_fork_attention(p, ROOT)
    except ValueError as e:
        sys.exit(f"error: {e}")
    init_distributed(p.train_asr.processes, "train_asr.processes")
    spec = shared_fork_spec_from_params(p, ROOT, attention)
    try:  # a clear error for a missing fork state or a placeholder, before any work
        load_fork_state(spec.start_from)
    except ValueError as e:
        sys.exit(f"error: {e}")
    metrics = run(spec)
    if metrics:
        metrics = {**metrics, "asr_pretraining": "fork", "fork": "shared", "forked_at": asr_fork_at(p),
                   "trained_on": p.asr.shared_pair, "windows": [s.get("window", 0) for s in attention]}
        atomic_write_json(spec.paths.metrics, metrics)
        print(json.dumps(metrics))


def own_asr_model(p: Params, pair: str) -> None:
    """train_asr_local@<pair> for ``shared``, ``local`` and a per-pair ``fork``."""
    dst = RunPaths(ROOT, "asr_local", pair)
    if p.local.asr_pretraining == "shared":
        metrics = share_asr_run(RunPaths(ROOT, "asr", pair), dst)  # a missing model: run_stage's one line
        print(json.dumps(metrics))
        return
    try:
        spec_layers = local_encoder_attention(p, ROOT, pair)
    except ValueError as e:
        sys.exit(f"error: {e}")
    init_distributed(p.train_asr.processes, "train_asr.processes")
    if p.local.asr_pretraining == "fork":
        spec = asr_fork_spec_from_params(p, ROOT, pair, spec_layers)
        try:  # a clear error for a missing fork state or a placeholder, before any work
            load_fork_state(spec.start_from)
        except ValueError as e:
            sys.exit(f"error: {e}")
    else:
        spec = spec_from_params(p, ROOT, "asr_local", pair, encoder_attention=spec_layers)
    metrics = run(spec)
    if metrics:
        metrics = {**metrics, "asr_pretraining": p.local.asr_pretraining}
        if p.local.asr_pretraining == "fork":
            metrics.update(forked_at=asr_fork_at(p), trained_on=spec.prepared_dir.name)
        atomic_write_json(dst.metrics, metrics)
        print(json.dumps({**metrics, "windows": [s.get("window", 0) for s in spec_layers]}))


if __name__ == "__main__":
    run_stage(main)
