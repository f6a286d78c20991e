"""Stage `train_asr_control`: a control's own ASR fork (params.yaml `controls.asr_systems`), so that the
control retrains under the same ASR fork rule as `local`: the shared English ASR training
(runs/asr_shared/fork.pt, `asr.fork_updates` updates before its end) finished with the control's windows,
per layer the widest of every pair's control windows, as `train_asr_local_shared` finishes it with
Algorithm 1's (lib.train.experiments.control_fork_spec_from_params). Each pair's `train_control` run then
starts from it and narrows the windows to its own. Resumable like train_asr.

    python stages/train_asr_control.py local_uniform
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

from lib.io import atomic_write_json
from lib.model.spec import CONTROL_SYSTEMS
from lib.train.distributed import init_distributed
from lib.train.run import load_fork_state, run
from lib.train.experiments import asr_fork_at, control_fork_attention, control_fork_spec_from_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("system", choices=CONTROL_SYSTEMS)
    args = ap.parse_args()
    p = stage_params()
    if args.system not in p.controls.asr_systems:
        sys.exit(f"error: controls.asr_systems {p.controls.asr_systems} does not list {args.system!r}")
    try:
        attention = control_fork_attention(p, ROOT, args.system)
    except ValueError as e:
        sys.exit(f"error: {e}")
    init_distributed(p.train_asr.processes, "train_asr.processes")
    spec = control_fork_spec_from_params(p, ROOT, args.system, attention)
    try:  # a clear error for a missing fork state or a placeholder, before any work
        load_fork_state(spec.start_from)
    except ValueError as e:
        sys.exit(f"error: {e}")
    metrics = run(spec)
    if metrics:
        metrics = {**metrics, "system": args.system, "forked_at": asr_fork_at(p), "trained_on": p.asr.shared_pair,
                   "windows": [s.get("window", 0) for s in attention]}
        atomic_write_json(spec.paths.metrics, metrics)
        print(json.dumps(metrics))


if __name__ == "__main__":
    run_stage(main)
