"""Stage `prepare_multi`: the joint target vocabulary of the multilingual ST model (Gong et al.;
lib/data/multilingual.py): one SentencePiece model over the train translations of every pair in
`pairs`, with the target-language tags as single pieces (ids 4, 5, ...), and tasks.json (task id =
index of the pair in `pairs`). Always part of the pipeline (it takes seconds); only the opt-in
`train_multi` stage reads it.

    python stages/prepare_multi.py
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from _common import ROOT, run_stage, stage_params

import lib.params.multi  # noqa: F401 (parses the params' multi section, which this stage reads)
from lib import layout
from lib.data.multilingual import prepare_joint_vocab
from lib.data.vocab import SentencePieceError


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    p = stage_params()
    t0 = time.perf_counter()
    try:
        tasks = prepare_joint_vocab(ROOT / p.data.prepared_dir, p.pairs, ROOT / layout.PREPARED_MULTI,
                                    p.multi.vocab_size)
    except SentencePieceError as e:
        sys.exit(f"error: multi.vocab_size = {p.multi.vocab_size}: {e.reason}")
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(json.dumps({**tasks, "seconds": round(time.perf_counter() - t0, 2)}))


if __name__ == "__main__":
    run_stage(main)
