"""Stage `train_control`: a control for Algorithm 1 (params.yaml `controls.systems`), for one pair and
seed: ST with local attention in layers k+1..L like `train_local`, but with the local system's windows
(select_windows' Algorithm 1, or `local.windows`) replaced by a simpler choice of the same budget
(lib.model.spec):

- ``local_uniform``: every local layer at one window, the mean of Algorithm 1's windows rounded to the
  nearest odd width (ties up);
- ``local_shuffled``: Algorithm 1's windows permuted across the local layers with `controls.shuffle_seed`.

Everything else is `train_local`'s: the same `train_st` settings and seed, decoding and metrics. The
ASR model (lib.train.experiments.control_asr_model): with the control in `controls.asr_systems`, its own fork
(stage `train_asr_control`: local's fork rule with the control's windows), so that the comparison with
`local` differs in the windows only; otherwise the local system's runs/asr_local/<pair>/model.pt, which
costs no ASR updates but was finished with Algorithm 1's windows (with `local.fork: shared` the widest
of all pairs'), so the control's ST run pays for a mismatch that `local` does not.

    python stages/train_control.py local_uniform en-de 1
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

from lib.io import atomic_write_json
from lib.layout import RunPaths
from lib.model.spec import CONTROL_SYSTEMS, control_attention_spec
from lib.train.distributed import init_distributed
from lib.train.run import run
from lib.train.experiments import control_asr_model, local_encoder_attention, spec_from_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("system", choices=CONTROL_SYSTEMS)
    ap.add_argument("pair")
    ap.add_argument("seed", type=int)
    args = ap.parse_args()
    p = stage_params(args.pair)
    try:
        local = local_encoder_attention(p, ROOT, args.pair)
        spec_layers = control_attention_spec(local, args.system, shuffle_seed=p.controls.shuffle_seed,
                                             key=f"{args.system} of {args.pair}'s local windows")
    except ValueError as e:
        sys.exit(f"error: {e}")
    init_distributed(p.train_st.processes, "train_st.processes")
    spec = spec_from_params(p, ROOT, "local", args.pair, args.seed, encoder_attention=spec_layers)
    spec.paths = RunPaths(ROOT, "controls", args.pair, args.seed, variant=args.system)
    spec.init_encoder = control_asr_model(p, ROOT, args.system, args.pair)
    metrics = run(spec)
    if metrics:
        windows = [s.get("window", 0) for s in spec_layers]
        metrics = {**metrics, "system": args.system, "windows": windows,
                   "asr_model": "own fork" if args.system in p.controls.asr_systems else "local's",
                   "algorithm1_windows": [s.get("window", 0) for s in local]}
        atomic_write_json(spec.paths.metrics, metrics)
        print(json.dumps({k: metrics[k] for k in ("bleu", "chrf", "windows")}))


if __name__ == "__main__":
    run_stage(main)
