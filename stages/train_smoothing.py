"""Stage `train_smoothing`: ST with attention-weight smoothing (Maekaku et al.; docs/variants.md) for one
system of ``smoothing.defs``, one pair and one seed. Same data, ASR initialisation (unless the system is in
``smoothing.asr_systems``), ``train_st`` hyperparameters, decoding and metrics as `train_baseline` with
that seed, so the comparison differs in the attention only. After decoding it measures how peaky the
encoder self-attention is (lib/analysis/peakiness.py: per-layer diagonal weight and row entropy on the
first 100 tst-COMMON sentences) for this model and for the baseline of the same seed, and adds both
to the run's metrics (``attn_diag``, ``attn_entropy``, ``baseline_attn_diag``, ...).

    python stages/train_smoothing.py rec en-de 1
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

import lib.model.attention.smoothing  # noqa: F401 (registers the `smooth` attention variant this stage trains)
import lib.params.smoothing  # noqa: F401 (parses the params' smoothing section, which this stage reads)
from lib.model.checkpoint import load_model
from lib.analysis.peakiness import PEAKINESS_SENTENCES, attention_peakiness
from lib.data.dataset import SpeechDataset
from lib.io import atomic_write_json
from lib.layout import TEST_SPLIT, RunPaths
from lib.train.distributed import init_distributed
from lib.train.run import auto_device, run
from lib.train.experiments import smoothing_spec_from_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("system", help="a name from smoothing.defs")
    ap.add_argument("pair")
    ap.add_argument("seed", type=int)
    args = ap.parse_args()
    p = stage_params(args.pair)
    try:
        spec = smoothing_spec_from_params(p, ROOT, args.system, args.pair, args.seed)
    except ValueError as e:
        sys.exit(f"error: {e}")
    baseline = RunPaths(ROOT, "baseline", args.pair, args.seed).model
    if not baseline.is_file():  # checked before training: the comparison needs it
        sys.exit(f"error: {baseline}: missing; it is written by the train_baseline@{args.pair}-{args.seed} stage")
    init_distributed(p.train_st.processes, "train_st.processes")
    metrics = run(spec)
    if not metrics:  # not rank 0
        return
    device = auto_device()
    test_ds = SpeechDataset(spec.prepared_dir, TEST_SPLIT, "st")
    ours = attention_peakiness(load_model(spec.paths.model)[0].to(device), test_ds, PEAKINESS_SENTENCES, device)
    base = attention_peakiness(load_model(baseline)[0].to(device), test_ds, PEAKINESS_SENTENCES, device)
    metrics = {**metrics, "system": args.system, "definition": p.smoothing.defs[args.system], **ours,
               **{f"baseline_{k}": base[k] for k in ("attn_diag", "attn_entropy")}}
    atomic_write_json(spec.paths.metrics, metrics)
    print(json.dumps({k: metrics[k] for k in ("bleu", "chrf", "attn_diag", "baseline_attn_diag")}))


if __name__ == "__main__":
    run_stage(main)
