"""The band-test figure of one ST model (stage band_test, lib.analysis.health.band_test_table):
teacher-forced token accuracy (left) and NLL per target token (right) against the mean window width
of layers k+1..L. One window in every local layer (w = 1, 3, ...) is the line; Algorithm 1's
windows are the star, the uniform control (their mean rounded to an odd width) the square and the
shuffled control (the same windows in another layer order, so the same mean) the triangle; full
attention is the dashed horizontal line. No torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lib.analysis.plots import save_figure  # noqa: E402

__all__ = ["plot_band_test"]

MARKERS = {"alg1": ("*", "C3", "Algorithm 1", 14), "uniform": ("s", "C2", "uniform (rounded mean)", 8),
           "shuffled": ("^", "C4", "shuffled Algorithm 1", 9)}


def plot_band_test(result: dict[str, Any], path: str | Path) -> Path:
    """``result``: what band_test_stage writes (``rows`` name -> windows, mean_window, acc, nll)."""
    rows = result["rows"]
    same = sorted((r["mean_window"], r) for name, r in rows.items() if name.startswith("w"))
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6))
    for ax, key, label in ((axes[0], "acc", "token accuracy (%)"), (axes[1], "nll", "NLL per token (nats)")):
        ax.plot([m for m, _ in same], [r[key] for _, r in same], "-o", color="C0", ms=4,
                label="one window in every local layer")
        for name, (marker, color, text, size) in MARKERS.items():
            if name in rows:
                r = rows[name]
                ax.plot([r["mean_window"]], [r[key]], marker, color=color, ms=size, ls="none",
                        label=f"{text}: {' '.join(map(str, r['windows']))}" if name != "uniform" else
                        f"{text}: w = {r['windows'][0]}")
        ax.axhline(rows["full"][key], color="k", ls="--", lw=1, label="full attention")
        ax.set_xscale("log", base=2)
        ticks = sorted({m for m, _ in same} | {rows["alg1"]["mean_window"]} if "alg1" in rows else {m for m, _ in same})
        ax.set_xticks(ticks, [f"{t:g}" if t == int(t) else f"{t:.1f}" for t in ticks], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("mean window width, layers k+1..L (log scale)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7, loc="lower right")
    gap = rows["alg1"].get("gap_recovered")
    fig.suptitle(f"{result['pair']}, ST baseline seed {result['seed']}: inference band test on "
                 f"{result['band_split']} ({result['sentences']} sentences, no retraining)"
                 + ("" if gap is None else f"; Algorithm 1 recovers {gap:.0%} of the w = 1 → full gap"), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)
