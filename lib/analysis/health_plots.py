"""The attention-health figure of one model (lib.analysis.health): four panels on one PNG.

(a) raw attention within ±2 tokens / uniform expectation, per layer (rows) and head (columns);
(b) per layer: main-diagonal contribution share C_ii, ‖attention output‖ / ‖x‖ and the ±1/±2/±4
    raw-mass ratios; (c) the mean contribution at offsets 1..8 off the diagonal, one line per
    layer (what Algorithm 1 compares with t, drawn as a dashed line); (d) the inference band test:
    teacher-forced token accuracy with layers k+1..L made local with window w, full attention and
    Algorithm 1's windows as horizontal lines.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from lib.analysis.plots import save_figure  # noqa: E402

__all__ = ["plot_health"]


def plot_health(health: dict[str, Any], path: str | Path, *, title: str, threshold: float = 0.01,
                full_layers: int = 3) -> Path:
    layers = sorted(health["layers"])
    n = len(layers)
    x = np.arange(1, n + 1)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    fig.suptitle(title, fontsize=11)

    ax = axes[0, 0]
    heads = np.array([health["heads_band2"][k] for k in layers], dtype=float)  # (L, H)
    im = ax.imshow(heads, aspect="auto", cmap="magma", vmin=0, vmax=max(4.0, float(np.nanmax(heads))),
                   extent=(0.5, heads.shape[1] + 0.5, n + 0.5, 0.5))
    for (li, h), v in np.ndenumerate(heads):
        ax.text(h + 1, li + 1, f"{v:.1f}", ha="center", va="center", fontsize=7,
                color="white" if v < 2 else "black")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(1, heads.shape[1] + 1))
    ax.set_yticks(x)
    ax.set_title("(a) raw attention within ±2 / uniform")
    fig.colorbar(im, ax=ax, shrink=0.8)

    ax = axes[0, 1]
    rows = [health["layers"][k] for k in layers]
    ax.plot(x, [r["c_ii"] for r in rows], "k-o", label="C_ii (contribution share of the main diagonal)")
    ax.plot(x, [r["attn_ratio"] for r in rows], "-s", color="tab:gray", label="‖attention out‖ / ‖x‖")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("layer")
    ax.set_xticks(x)
    ax2 = ax.twinx()
    for k, color in (("band1", "tab:red"), ("band2", "tab:orange"), ("band4", "tab:green")):
        ax2.plot(x, [r[k] for r in rows], "--", color=color, label=f"±{k[4:]} mass / uniform")
    ax2.axhline(1.0, color="tab:orange", lw=0.6, ls=":")
    ax2.set_ylabel("raw attention mass / uniform")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper left")
    ax.set_title(f"(b) per layer; position share at layer 1 = {health['position_share']}")

    ax = axes[1, 0]
    cmap = plt.get_cmap("viridis")
    offsets = np.arange(1, len(rows[0]["profile"]) + 1)
    for li, r in enumerate(rows):
        prof = np.array([np.nan if v is None else v for v in r["profile"]], dtype=float)
        ax.plot(offsets, prof, "-", color=cmap(li / max(n - 1, 1)), lw=2 if li >= full_layers else 1,
                label=f"l{li + 1}" + (f" (w={health['algorithm1_windows'][li - full_layers]})"
                                      if health.get("algorithm1_windows") and li >= full_layers else ""))
    ax.axhline(threshold, color="red", ls="--", lw=1, label=f"t = {threshold}")
    ax.set_yscale("log")
    ax.set_xlabel("offset from the main diagonal (tokens)")
    ax.set_ylabel("mean contribution")
    ax.set_title("(c) off-diagonal contribution profile (Algorithm 1's input)")
    ax.legend(fontsize=6, ncol=2)

    ax = axes[1, 1]
    bt = health.get("band_test", {})
    ws = sorted(int(k[1:]) for k in bt if k.startswith("w"))
    if ws:
        ax.plot(ws, [bt[f"w{w}"]["acc"] for w in ws], "b-o", label=f"layers {full_layers + 1}-{n} local, window w")
        ax.axhline(bt["full"]["acc"], color="k", ls="-", lw=1, label=f"full attention ({bt['full']['acc']:.1f})")
        if "alg1" in bt:
            ax.axhline(bt["alg1"]["acc"], color="tab:red", ls="--", lw=1,
                       label=f"Algorithm 1's windows ({bt['alg1']['acc']:.1f})")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ws)
        ax.set_xticklabels([str(w) for w in ws])
        ax.legend(fontsize=8)
    ax.set_xlabel("window w (tokens) at inference, no retraining")
    ax.set_ylabel("teacher-forced dev token accuracy (%)")
    ax.set_title("(d) inference band test")
    fig.tight_layout()
    return save_figure(fig, path)
