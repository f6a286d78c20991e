"""Figures of the contribution analysis (Alastruey et al. 2022, Figs. 1-4) as PNG files.

* :func:`plot_diagonality` — Fig. 2: D(w, l) against w for one sentence and one layer, the area
  under the curve (CCD) shaded.
* :func:`plot_ccd_layers` — Fig. 3: CCD across layers, ASR dashed and ST solid, ± std band.
* :func:`plot_contribution_grid` — Fig. 4: every layer's contribution matrix of one sentence,
  main diagonal hidden (footnote 3), the local-attention window drawn on the local layers.
* :func:`plot_spectrogram_contributions` — Fig. 1: the sentence's log-mel spectrogram over one
  layer's contribution matrix with its window, sharing the time axis (4 frames per token).

Matrices are drawn with the query (output token i) on the vertical axis, top to bottom, and the
key (input token j) on the horizontal axis. The main diagonal holds most of the contribution
(the paper: ~65 %), so it is hidden and each matrix's colour scale stops at the 99th percentile
of its off-diagonal entries. Files are written under a temporary name and renamed, without
matplotlib's version stamp (stable bytes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # no display on CI or servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = [
    "plot_ccd_layers",
    "plot_contribution_grid",
    "plot_diagonality",
    "plot_spectrogram_contributions",
    "save_figure",
]

SUBSAMPLING = 4  # input frames per encoder token (two stride-2 convolutions)
_CMAP = "viridis"
_WINDOW_COLOR = "red"


def save_figure(fig: plt.Figure, path: str | Path, dpi: int = 100) -> Path:
    """``savefig`` to a temporary name in the same folder, then rename; closes ``fig``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, dpi=dpi, metadata={"Software": None})
        tmp.replace(path)
    finally:
        plt.close(fig)
        if tmp.exists():
            tmp.unlink()
    return path


def plot_diagonality(curve: Sequence[float], ccd_value: float, path: str | Path, *, title: str = "") -> Path:
    """Fig. 2: ``curve[w-1] = D(w)`` for w = 1 … 2N, area under it (the CCD) shaded."""
    d = np.asarray(curve, dtype=np.float64)
    w = np.arange(1, d.size + 1)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.fill_between(w, 0, d, color="tab:blue", alpha=0.25, step=None, label=f"CCD = {ccd_value:.3f}")
    ax.plot(w, d, color="tab:blue", lw=1.8, label="D(w)")
    ax.set_xlim(1, max(2, d.size))
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("window size w (tokens)")
    ax.set_ylabel("D(w)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_ccd_layers(stats: Mapping[str, tuple[Sequence[float], Sequence[float]]], path: str | Path, *,
                    title: str = "") -> Path:
    """Fig. 3: ``stats[model] = (mean per layer, std per layer)``; "asr" dashed, "st" solid."""
    styles = {"asr": dict(ls="--", color="tab:orange", label="ASR", zorder=3),
              "st": dict(ls="-", color="tab:blue", label="ST", zorder=2)}
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, (mean, std) in stats.items():
        mean, std = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
        layers = np.arange(1, mean.size + 1)
        st = styles.get(name, dict(ls=":", label=name))
        ax.plot(layers, mean, marker="o", ms=4, lw=1.8, **st)
        ax.fill_between(layers, mean - std, mean + std, color=st.get("color"), alpha=0.15, lw=0, zorder=1)
    n = max(len(m) for m, _ in stats.values())
    ax.set_xticks(np.arange(1, n + 1))
    ax.set_xlabel("encoder layer")
    ax.set_ylabel("CCD")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path)


def _hide_diagonal(c: np.ndarray) -> tuple[np.ma.MaskedArray, float]:
    """Masked copy with the main diagonal hidden, and a robust vmax (99th pct of the rest)."""
    c = np.asarray(c, dtype=np.float64)
    mask = np.eye(c.shape[0], dtype=bool)
    off = c[~mask]
    vmax = float(np.percentile(off, 99)) if off.size else 1.0
    if not vmax > 0:
        vmax = float(off.max()) if off.size and off.max() > 0 else 1.0
    return np.ma.masked_array(c, mask=mask), vmax


def _draw_window(ax: plt.Axes, n: int, window: int) -> None:
    """Band edges of a centred window of ``window`` tokens: |i - j| = (w - 1)/2 + 1/2."""
    h = (window - 1) / 2 + 0.5
    i = np.array([-0.5, n - 0.5])
    for sign in (-1, 1):
        ax.plot(i + sign * h, i, color=_WINDOW_COLOR, lw=0.9)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(n - 0.5, -0.5)


def _imshow_matrix(ax: plt.Axes, c: np.ndarray) -> None:
    masked, vmax = _hide_diagonal(c)
    base = plt.get_cmap(_CMAP)
    cmap = base.with_extremes(bad=base(0.0))  # the hidden diagonal blends into the background
    ax.imshow(masked, cmap=cmap, vmin=0.0, vmax=vmax, interpolation="nearest", aspect="equal")


def plot_contribution_grid(matrices: Sequence[np.ndarray], windows: Sequence[int | None], path: str | Path, *,
                           title: str = "", ncols: int = 4) -> Path:
    """Fig. 4: one panel per layer; ``windows[l]`` (odd int) drawn on local layers, None = full."""
    if len(matrices) != len(windows):
        raise ValueError(f"{len(matrices)} matrices but {len(windows)} windows")
    n_layers = len(matrices)
    ncols = min(ncols, n_layers)
    nrows = -(-n_layers // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols, 2.75 * nrows + 0.4), squeeze=False)
    for li, ax in enumerate(axes.flat):
        if li >= n_layers:
            ax.axis("off")
            continue
        c = np.asarray(matrices[li])
        _imshow_matrix(ax, c)
        w = windows[li]
        if w is not None:
            _draw_window(ax, c.shape[0], int(w))
        ax.set_title(f"layer {li + 1}" + (f" (w={w})" if w is not None else " (full)"), fontsize=9)
        ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_spectrogram_contributions(fbank: np.ndarray, matrix: np.ndarray, window: int | None, path: str | Path, *,
                                   title: str = "") -> Path:
    """Fig. 1: log-mel spectrogram ``fbank`` (T, n_mels) above the contribution matrix (N, N) of one
    layer, on a common time axis in tokens (frame t sits at token t / 4); ``window`` drawn if given."""
    fbank = np.asarray(fbank, dtype=np.float64)
    c = np.asarray(matrix)
    n = c.shape[0]
    fig, (ax_s, ax_c) = plt.subplots(2, 1, figsize=(5.5, 7.2), sharex=True,
                                     gridspec_kw={"height_ratios": [1, 4]})
    t = fbank.shape[0]
    ax_s.imshow(fbank.T, origin="lower", aspect="auto", cmap="magma", interpolation="nearest",
                extent=(-0.5, t / SUBSAMPLING - 0.5, 0, fbank.shape[1]))
    ax_s.set_ylabel("mel bin")
    ax_s.set_title(title, fontsize=9)
    _imshow_matrix(ax_c, c)
    if window is not None:
        _draw_window(ax_c, n, int(window))
    ax_c.set_aspect("auto")
    ax_c.set_xlim(-0.5, n - 0.5)
    ax_c.set_xlabel("input token j (4 frames each)")
    ax_c.set_ylabel("output token i")
    fig.tight_layout()
    return save_figure(fig, path)
