"""Stages `train_asr` and `train_asr_shared`: ASR pretraining of the S2T Transformer, then WER on
tst-COMMON. Resumes from its checkpoints/last.pt when killed.

`asr.mode` (params.yaml) decides who trains:

- ``per_pair`` (the paper): ``train_asr@<pair>`` trains on the pair's English transcripts
  (runs/asr/<pair>/); ``train_asr_shared`` only writes placeholders.
- ``shared`` (the demo default): ``train_asr_shared`` trains one English ASR model on
  ``asr.shared_pair``'s data (runs/asr_shared/); ``train_asr@<pair>`` copies it to runs/asr/<pair>/
  and scores it on the pair's own tst-COMMON (decoding only).

With ``asr.fork_updates`` > 0 the run also keeps its training state that many updates before its
end (runs/asr_shared/fork.pt, copied to runs/asr/<pair>/fork.pt): train_asr_local
finishes that training with local attention. Otherwise fork.pt is a placeholder.

    python stages/train_asr.py en-de            (or: torchrun --nproc_per_node=N stages/train_asr.py en-de)
    python stages/train_asr.py --shared
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

from lib.parallel import share_cores
from lib.train.distributed import init_distributed
from lib.train.run import run
from lib.train.experiments import (adopt_shared_asr, asr_fork_at, spec_from_params, write_no_fork,
                                   write_unused_shared_asr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair", nargs="?", help="the pair (train_asr); omit with --shared")
    ap.add_argument("--shared", action="store_true", help="the shared English ASR model (train_asr_shared)")
    args = ap.parse_args()
    if args.shared == (args.pair is not None):
        ap.error("give a pair, or --shared")
    p = stage_params(args.pair)
    shared = p.asr.mode == "shared"
    if args.shared and not shared:
        print(json.dumps(write_unused_shared_asr(ROOT)))
        return
    if not args.shared and shared:
        share_cores(p.parallel.jobs)  # it decodes this pair's test set, beside other stages under `make repro`
        try:
            metrics = adopt_shared_asr(p, ROOT, args.pair)
        except (FileNotFoundError, ValueError) as e:
            sys.exit(f"error: {e}")
        print(json.dumps(metrics))
        return
    init_distributed(p.train_asr.processes, "train_asr.processes")
    spec = spec_from_params(p, ROOT, "asr_shared" if args.shared else "asr", args.pair)
    spec.fork_at = asr_fork_at(p)  # local.asr_pretraining: fork -> keep the state train_asr_local continues
    metrics = run(spec)
    if metrics:
        if spec.fork_at is None:
            write_no_fork(spec.paths)
        print(json.dumps(metrics))


if __name__ == "__main__":
    run_stage(main)
