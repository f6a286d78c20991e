"""Stage `band_test` (opt-in: `controls.band_seeds`): the inference band test of every window
configuration on the ST baseline of one pair and seed (lib.analysis.health.band_test_table): layers
k+1..L switched, without retraining, to local attention with one window w in every layer (w = 1 and
`health.band_windows`), with the local system's windows (Algorithm 1's from select_windows, or
`local.windows`), with the uniform control (their mean rounded to an odd width) and with the shuffled
control (`controls.shuffle_seed`), next to full attention. Teacher-forced NLL and token accuracy on
every sentence of `health.band_split`, and the share of the w = 1 -> full accuracy gap each recovers.

    python stages/band_test.py en-de 2

Writes metrics/variants/band_test/<pair>/seed<k>.json and its figure plots/variants/band_test/<pair>/seed<k>.png.
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import ROOT, run_stage, stage_params

from lib import layout
from lib.analysis.health import band_test_stage
from lib.layout import RunPaths
from lib.parallel import share_cores
from lib.analysis.band_plot import plot_band_test
from lib.train.experiments import local_encoder_attention


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("seed", type=int)
    args = ap.parse_args()
    p = stage_params(args.pair)
    share_cores(p.parallel.jobs)
    try:
        local = local_encoder_attention(p, ROOT, args.pair)
        result = band_test_stage(
            RunPaths(ROOT, "baseline", args.pair, args.seed).model, ROOT / p.data.prepared_dir / args.pair,
            args.pair, args.seed, algorithm1=[s["window"] for s in local if s["type"] == "local"],
            full_layers=p.analysis.full_layers, hp=p.health, shuffle_seed=p.controls.shuffle_seed,
            metrics_path=layout.band_test_metrics(ROOT, args.pair, args.seed),
            producer=f"train_baseline@{args.pair}-{args.seed}",
            windows_from="local.windows" if p.local.windows else "select_windows")
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    plot_band_test(result, layout.band_test_plot(ROOT, args.pair, args.seed))
    print(json.dumps({name: {k: row[k] for k in ("mean_window", "acc", "gap_recovered")}
                      for name, row in result["rows"].items()}))


if __name__ == "__main__":
    run_stage(main)
