"""Stage `select_windows`: per-layer local-attention windows of one pair (paper Sec. 4, Alg. 1, Table 1,
Figs. 1 and 4).

Algorithm 1 on the contribution matrices of the ST baseline (runs/baseline/<pair>/seed<analysis.st_seed>/
model.pt) for `analysis.window_samples` seeded random sentences of `analysis.window_split`, streaming
(per sentence only the window and D(w) curve are kept); w = ⌈μ+σ⌉ made odd per layer, contribution
loss CL at w; layers 1..`analysis.full_layers` keep full attention. Writes data/windows/<pair>/
windows.json (with `encoder_attention`, the per-layer specs the local-attention training reads),
table1.md/.csv (Table 1 for people), per_sentence.json and diagonal_profile.json; metrics/windows/
<pair>.json (Table 1, flat); Figs. 1 and 4 to plots/analysis/<pair>/.

    python stages/select_windows.py en-de
"""
from __future__ import annotations

import argparse
from pathlib import Path

from _common import ROOT, run_stage, stage_params

from lib.parallel import share_cores
from lib.analysis.pipeline import PairPaths, select_windows_pair, table_markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("--st-model", type=Path, help="override runs/baseline/<pair>/seed<k>/model.pt (manual runs only)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    p = stage_params(args.pair)
    share_cores(p.parallel.jobs)
    a = p.analysis
    paths = PairPaths.build(ROOT, args.pair, p.data.prepared_dir, a.st_seed, st_model=args.st_model)
    result = select_windows_pair(paths, a, progress=not args.no_progress)  # a missing input: run_stage's one line
    print(table_markdown(result["table"], args.pair, result))


if __name__ == "__main__":
    run_stage(main)
