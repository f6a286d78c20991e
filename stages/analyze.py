"""Stage `analyze`: layer-wise contribution analysis of one pair (paper Sec. 3, Figs. 2-3).

Contribution matrices (Kobayashi et al. 2021, adapted to Pre-LN: Eq. 3-5) of every encoder layer of
the ASR model (runs/asr/<pair>/model.pt) and of the ST baseline (runs/baseline/<pair>/seed<analysis.st_seed>/
model.pt) on `analysis.samples` seeded random sentences of `analysis.split`; CCD per layer (mean ± std)
to metrics/analysis/<pair>.json, per-sentence values, the figure sentence's matrices and D(w) curves and
the raw tensors of `analysis.transparency_samples` sentences to data/analysis/<pair>/, Figs. 2 and 3 to
plots/analysis/<pair>/.

    python stages/analyze.py en-de
    python stages/analyze.py en-de --st-model runs/asr/en-de/model.pt   (try-out: another model as "ST")
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import ROOT, run_stage, stage_params

from lib.parallel import share_cores
from lib.analysis.pipeline import PairPaths, analyze_pair


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("--asr-model", type=Path, help="override runs/asr/<pair>/model.pt (manual runs only)")
    ap.add_argument("--st-model", type=Path, help="override runs/baseline/<pair>/seed<k>/model.pt (manual runs only)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    p = stage_params(args.pair)
    share_cores(p.parallel.jobs)
    a = p.analysis
    paths = PairPaths.build(ROOT, args.pair, p.data.prepared_dir, a.st_seed,
                            asr_model=args.asr_model, st_model=args.st_model)
    metrics = analyze_pair(paths, a, progress=not args.no_progress)  # a missing input: run_stage's one line
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("asr", "st")}
                     | {m: {"ccd_mean": metrics[m]["ccd_mean"], "diag_share": metrics[m]["diag_share"]} for m in ("asr", "st")}))


if __name__ == "__main__":
    run_stage(main)
