"""Stage `corpus`: write the synthetic demo corpus of one language pair in MuST-C v1 layout.

    python stages/corpus.py en-de data/mustc-demo
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _common import run_stage, stage_params

from lib.corpus.demo import write_pair
from lib.pool import WorkerDied


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("out_dir", type=Path, help="MuST-C root to write <out_dir>/<pair> into")
    args = ap.parse_args()
    p = stage_params(args.pair)
    c = p.corpus
    try:
        summary = write_pair(args.out_dir, args.pair, c.splits, c.seed, c.segments_per_talk,
                             c.n_speakers, c.pause_seconds, c.noise_level, workers=c.workers,
                             progress=True, sentences_per_segment=c.sentences_per_segment,
                             sentence_pause_seconds=c.sentence_pause_seconds, rate_jitter=c.rate_jitter,
                             word_gap=c.word_gap, reverb_rt60=c.reverb_rt60)
    except (ValueError, WorkerDied) as e:
        sys.exit(f"error: {e}")
    print(json.dumps(summary))


if __name__ == "__main__":
    run_stage(main)
