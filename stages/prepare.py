"""Stage `prepare`: fbank features, manifests and SentencePiece models for one language pair,
read from the corpus root in params (`data.mustc_root`: the demo corpus or a real MuST-C copy).

    python stages/prepare.py en-de
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _common import ROOT, run_stage, stage_params

from lib.data.reader import CorpusError
from lib.data.prepare import prepare_pair
from lib.data.store import InsufficientSpaceError
from lib.params import ParamError
from lib.pool import WorkerDied


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    args = ap.parse_args()
    p = stage_params(args.pair)
    root = Path(p.data.mustc_root)
    root = root if root.is_absolute() else ROOT / root
    try:
        report = prepare_pair(root, args.pair, ROOT / p.data.prepared_dir / args.pair, p.prepare)
    except (CorpusError, ParamError, InsufficientSpaceError, WorkerDied) as e:
        sys.exit(f"error: {e}")
    print(json.dumps(report))


if __name__ == "__main__":
    run_stage(main)
