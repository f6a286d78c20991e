"""Diagonality, CCD, contribution loss and the window-size selection of Alastruey et al. (2022).

All functions take one contribution matrix ``C`` of shape (N, N) (row i = output token / query,
column j = input token / key), normally row-normalised (``Σ_j C_ij = 1``, as returned by
:func:`lib.analysis.contributions.contributions`).

Diagonality D(w) (Eq. 6)
------------------------
``D(w) = (1/N) Σ_i Σ_{j : |i−j| ≤ ⌊w/2⌋} C_ij``: the window of "size" w holds ⌊w/2⌋ tokens on
each side of the main diagonal (paper, footnote 2: "w = 1 represents the main diagonal and
w = 2N every possible diagonal"). For odd w this is the band of w tokens centred on the
diagonal, ``|i−j| ≤ (w−1)/2``; an even w covers the same band as w+1 (Eq. 6 uses ⌊w/2⌋, we
follow it literally), so D(2k) = D(2k+1). For w ≥ 2N−1 the band is the full matrix and, with
normalised rows, D = 1. w = 0 gives an empty band (D = 0).

CCD
---
The paper's CCD is "the area under the curve of D(w) within the range w ∈ [1, 2N]", a token-step
version of Shim et al.'s CAD (Appendix A), which integrates D(r) over r ∈ [0, 1] with the
trapezoidal rule. We keep both ingredients and normalise the w-axis to unit length, so CCD is
directly comparable to CAD and lies in [0, 1] for normalised C:

    CCD = 1/(2N−1) · Σ_{w=1}^{2N−1} (D(w) + D(w+1)) / 2          (method="trapezoid", default)

(the 2N−1 unit steps of w between 1 and 2N, each a trapezoid). ``method="mean"`` gives the
rectangle rule ``(1/2N) Σ_{w=1}^{2N} D(w)``. For N = 1 both are 1 (a 1×1 normalised matrix).
Reference values: identity matrix → D ≡ 1, CCD = 1; uniform matrix C_ij = 1/N →
D(w) = (N(2h+1) − h(h+1)) / N² with h = min(⌊w/2⌋, N−1) (band entries over N²), e.g. D(1) = 1/N.

Window selection (Algorithm 1) — readings and defaults
-------------------------------------------------------
As printed::

    counter ← 0 ; w ← 0
    while counter < N/10:
        for i ← 0, N:
            if mean(C_diag[i]) > t or mean(C_diag[−i]) > t:  w ← 2i + 1 ; counter ← 0
            else: counter ← counter + 1

``C_diag[i]`` is the i-th super-diagonal (numpy offset +i, keys after the query), ``C_diag[−i]``
the i-th sub-diagonal; ``mean`` is over its N − i entries. The prose fixes the control flow: "it
keeps adding tokens to the window length until it finds N·10% consecutive sub/superdiagonals
below the t threshold", so we stop as soon as ``counter`` reaches the patience (the printed
nested loops would otherwise scan every diagonal and never leave the while loop when the last
pass is near the end). Offsets run i = 0 … N−1 (there is no N-th diagonal).

* Threshold t = 0.01 (footnote 4: "minimum average value of the sub/superdiagonals ... We choose
  0.01"), an absolute share of a row's total, so C must be row-normalised: ``normalize_rows=True``
  renormalises inside (a no-op for already normalised C). Comparison is strict (``>``).
* Patience "N/10": the loop runs while ``counter < N/10`` (real division), i.e. it stops once
  ``counter ≥ N/10`` ⇔ ``counter ≥ ⌈N/10⌉``. So ``patience_rounding="ceil"`` is the literal reading;
  we also floor it at 1 (``min_patience``) so that very short sentences (N < 10 with "floor")
  still scan. "floor" and "round" are available.
* The main diagonal and the width rule. Table 1 (En-De) reports μ = 0.51 ± 1.56 (layer 3) and
  μ = 1.18 (layer 2): impossible if a passing main diagonal always yields w ≥ 1, and the main
  diagonal holds ~65% of every row (footnotes 1, 3), far above t. Moreover, layer 5 reports
  μ ± σ = 4.03 ± 0.28 (and En-It layer 4: 4.08 ± 0.65): if every per-sentence w were odd
  (2i+1, or 0), the least possible σ at μ = 4.03 is that of a 3/5 mix, 2·sqrt(p(1−p)) ≈ 1.0
  with p = 0.515 — far above 0.28. Every one of the 36 rows of Tables 1, 3, 4 is instead
  consistent with *even* per-sentence widths (checked in the tests). The single change that
  explains both facts is ``w ← 2i``: the number of off-diagonal tokens in the window (i on each
  side; a passing main diagonal gives 0, the figures hide it too), and the final
  ⌈μ+σ⌉-then-odd step adds the main diagonal back (footnote 5: made odd "so that the window can
  be centred around the diagonal"). E.g. layer 5: typical i = 2 → per-sentence 4, ⌈4.31⌉ = 5 →
  half-width 2, exactly what covers the typical sentence; under 2i+1 the typical sentence would
  score 5 and ⌈μ+σ⌉ would give 7, not the printed 5.
  Defaults: ``width_rule="2i"``, ``include_main_diagonal=True`` (the scan starts at C_diag[0] as
  printed; under "2i" this only matters in that a failing main diagonal counts as a failure).
  The printed rule is ``width_rule="2i+1"``; with it, ``include_main_diagonal=False`` (scan from
  i = 1, w stays 0 when no off-diagonal passes) is the reading that still allows μ < 1.

Window from lengths (footnote 5)
--------------------------------
``w = ⌈μ + σ⌉``, plus 1 if even. σ is the population standard deviation (``ddof=0``, numpy's
default; with the paper's 400 sentences the sample std differs by a factor 1.00125). With the
printed μ, σ this reproduces every printed w of Tables 1, 3 and 4, e.g. En-De (Table 1):

    layer  μ ± σ          ⌈μ+σ⌉ → w      layer  μ ± σ          ⌈μ+σ⌉ → w
    1      3.41 ± 13.15   17  → 17       7      11.37 ± 1.13   13 → 13
    2      1.18 ± 3.45     5  →  5       8       7.94 ± 1.16   10 → 11
    3      0.51 ± 1.56     3  →  3       9      12.56 ± 1.85   15 → 15
    4      2.25 ± 1.30     4  →  5       10     16.47 ± 2.40   19 → 19
    5      4.03 ± 0.28     5  →  5       11     13.28 ± 1.90   16 → 17
    6      7.03 ± 1.03     9  →  9       12     16.28 ± 3.86   21 → 21

(all 12 match the printed w; so do the 24 rows of En-Es/En-It, see tests). The sum is rounded
to 9 decimals before the ceiling so that float noise (e.g. 4.000000000001) cannot add a token.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

__all__ = [
    "ccd",
    "contribution_loss",
    "diagonal_means",
    "diagonal_sums",
    "diagonality",
    "diagonality_curve",
    "select_window",
    "window_from_lengths",
    "window_size",
    "window_table",
    "window_table_from_matrices",
]

def _check_square(c: Tensor) -> int:
    if c.dim() != 2 or c.shape[0] != c.shape[1]:
        raise ValueError(f"C must be a square (N, N) matrix, got shape {tuple(c.shape)}")
    if c.shape[0] == 0:
        raise ValueError("C is empty (N = 0)")
    return c.shape[0]


def _signed_offset_sums(c: Tensor) -> Tensor:
    """Sums of every diagonal, indexed by offset k = j − i + (N − 1) ∈ [0, 2N−2]. O(N²)."""
    n = _check_square(c)
    idx = torch.arange(n, device=c.device)
    offset = (idx.unsqueeze(0) - idx.unsqueeze(1) + (n - 1)).reshape(-1)  # j - i + N - 1
    out = torch.zeros(2 * n - 1, dtype=torch.float64, device=c.device)
    return out.index_add_(0, offset, c.to(torch.float64).reshape(-1))


def diagonal_sums(c: Tensor) -> Tensor:
    """``s[k] = Σ_{|i−j| = k} C_ij`` for k = 0 … N−1 (sub- plus super-diagonal), float64."""
    n = _check_square(c)
    signed = _signed_offset_sums(c)
    s = signed[n - 1:].clone()  # k = 0 (main) and super-diagonals
    s[1:] += signed[: n - 1].flip(0)  # sub-diagonals, k = 1 … N-1
    return s


def diagonal_means(c: Tensor) -> tuple[Tensor, Tensor]:
    """``(upper, lower)``, each of length N: ``upper[i] = mean(C_diag[i])`` (i-th super-diagonal,
    keys after the query), ``lower[i] = mean(C_diag[−i])`` (i-th sub-diagonal); index 0 is the main
    diagonal in both. Each mean is over the N − i entries of that diagonal. float64."""
    n = _check_square(c)
    signed = _signed_offset_sums(c)
    counts = (n - torch.arange(n, device=c.device)).to(torch.float64)
    upper = signed[n - 1:] / counts
    lower = signed[: n].flip(0) / counts
    return upper, lower


def diagonality_curve(c: Tensor) -> Tensor:
    """``D(w)`` for w = 1 … 2N (entry w−1), float64, O(N²) total via per-|i−j| diagonal sums."""
    n = _check_square(c)
    cum = torch.cumsum(diagonal_sums(c), 0) / n  # cum[h] = D for half-width h
    half = torch.clamp(torch.arange(1, 2 * n + 1, device=c.device) // 2, max=n - 1)
    return cum[half]


def diagonality(c: Tensor, w: int) -> float:
    """Eq. 6: ``D(w) = (1/N) Σ_i Σ_{|i−j| ≤ ⌊w/2⌋} C_ij`` (w tokens centred on the diagonal for odd
    w; see the module docstring). ``w`` ≥ 0; w = 0 gives 0."""
    n = _check_square(c)
    if w < 0:
        raise ValueError(f"window must be >= 0, got {w}")
    if w == 0:
        return 0.0
    half = min(w // 2, n - 1)
    return float(diagonal_sums(c)[: half + 1].sum() / n)


def contribution_loss(c: Tensor, w: int) -> float:
    """``CL(w) = 1 − D(w)``: share of the contributions outside the window (C row-normalised)."""
    return 1.0 - diagonality(c, w)


def ccd(c: Tensor, *, method: str = "trapezoid") -> float:
    """Cumulative contribution diagonality: area under D(w), w = 1 … 2N, with the w-axis scaled to
    unit length so that CCD ∈ [0, 1] for a row-normalised C.

    ``method="trapezoid"`` (default, the rule Shim et al.'s CAD uses; Appendix A):
    ``1/(2N−1) Σ_{w=1}^{2N−1} (D(w) + D(w+1))/2``; ``method="mean"``: ``(1/2N) Σ_{w=1}^{2N} D(w)``.
    N = 1 gives D(1) (= 1 when normalised) under both.
    """
    curve = diagonality_curve(c)
    if method == "mean":
        return float(curve.mean())
    if method == "trapezoid":
        if curve.numel() < 2:
            return float(curve[0])
        return float(((curve[:-1] + curve[1:]) / 2).mean())
    raise ValueError(f"method must be 'trapezoid' or 'mean', got {method!r}")


def _patience(n: int, fraction: float, rounding: str, minimum: int) -> int:
    x = n * fraction
    if rounding == "ceil":
        p = math.ceil(round(x, 9))
    elif rounding == "floor":
        p = math.floor(round(x, 9))
    elif rounding == "round":
        p = int(math.floor(x + 0.5))  # half up, not Python's banker's rounding
    else:
        raise ValueError(f"patience_rounding must be 'ceil', 'floor' or 'round', got {rounding!r}")
    return max(minimum, p)


def select_window(
    c: Tensor,
    threshold: float = 0.01,
    *,
    include_main_diagonal: bool = True,
    width_rule: str = "2i",
    patience: int | None = None,
    patience_fraction: float = 0.1,
    patience_rounding: str = "ceil",
    min_patience: int = 1,
    normalize_rows: bool = True,
) -> int:
    """Algorithm 1: the window size of one sentence (one layer's contribution matrix).

    Scans offsets i = start … N−1 (start = 0 if ``include_main_diagonal`` else 1). Offset i
    *passes* when ``mean(C_diag[i]) > t`` or ``mean(C_diag[−i]) > t`` (super- or sub-diagonal,
    either suffices); then ``w ← 2i`` (``width_rule="2i"``, default) or ``w ← 2i + 1``
    (``"2i+1"``, as printed) and the failure counter resets to 0; otherwise the counter grows by
    one. The scan stops when the counter reaches the patience (``⌈N/10⌉`` by default, at least
    ``min_patience``) or the diagonals run out. w starts at 0 (returned when nothing passes).

    Args:
        c: (N, N) contribution matrix.
        threshold: t, default 0.01 (footnote 4).
        include_main_diagonal: start at C_diag[0] (as printed) or at the first off-diagonal.
        width_rule: "2i" (default; reproduces Table 1's statistics, see the module docstring) or
            "2i+1" (as printed; combine with ``include_main_diagonal=False`` for μ < 1 to be possible).
        patience: explicit number of consecutive failures that stops the scan; overrides the next three.
        patience_fraction, patience_rounding, min_patience: patience = max(min_patience,
            rounding(N · fraction)); "ceil" is the literal ``while counter < N/10``.
        normalize_rows: renormalise rows to sum to 1 first (t is a share of the row total).

    Returns:
        The per-sentence window w (int ≥ 0).
    """
    n = _check_square(c)
    if width_rule not in ("2i", "2i+1"):
        raise ValueError(f"width_rule must be '2i' or '2i+1', got {width_rule!r}")
    c = c.to(torch.float64)
    if normalize_rows:
        s = c.sum(dim=1, keepdim=True)
        c = c / torch.where(s > 0, s, torch.ones_like(s))
    if patience is None:
        patience = _patience(n, patience_fraction, patience_rounding, min_patience)
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    upper, lower = diagonal_means(c)
    passes = ((upper > threshold) | (lower > threshold)).tolist()
    w, counter = 0, 0
    for i in range(0 if include_main_diagonal else 1, n):
        if passes[i]:
            w = 2 * i if width_rule == "2i" else 2 * i + 1
            counter = 0
        else:
            counter += 1
            if counter >= patience:
                break
    return w


def window_size(mu: float, sigma: float, *, make_odd: bool = True) -> int:
    """``w = ⌈μ + σ⌉``, plus one when even (footnote 5) if ``make_odd``. The sum is rounded to 9
    decimals first so float noise cannot push an integer sum up by one."""
    w = math.ceil(round(mu + sigma, 9))
    if make_odd and w % 2 == 0:
        w += 1
    return int(w)


def window_from_lengths(lengths: Sequence[int], *, ddof: int = 0, make_odd: bool = True) -> dict:
    """Layer window from the per-sentence windows of Algorithm 1: ``{"mu", "sigma", "window"}``
    with μ the mean, σ the standard deviation (population by default, ``ddof=0``; ``ddof=1`` for
    the sample std) and window = ⌈μ + σ⌉ made odd (:func:`window_size`)."""
    vals = [float(v) for v in lengths]
    if not vals:
        raise ValueError("no lengths given")
    if len(vals) - ddof <= 0:
        raise ValueError(f"need more than ddof={ddof} lengths, got {len(vals)}")
    mu = sum(vals) / len(vals)
    sigma = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - ddof))
    return {"mu": mu, "sigma": sigma, "window": window_size(mu, sigma, make_odd=make_odd)}


def _mean_std(vals: Sequence[float], ddof: int) -> tuple[float, float]:
    m = sum(vals) / len(vals)
    if len(vals) - ddof <= 0:
        return m, float("nan")
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - ddof))


def window_table(
    windows: Sequence[Sequence[int]],
    curves: Sequence[Sequence[Tensor]],
    *,
    full_layers: int = 3,
    ddof: int = 0,
    make_odd: bool = True,
) -> list[dict]:
    """Aggregate per layer the data of the paper's Table 1.

    Args:
        windows: ``windows[l][s]`` = Algorithm 1's window of sentence s at layer l (0-based l).
        curves: ``curves[l][s]`` = :func:`diagonality_curve` of the same matrix (length 2N_s), so
            the matrices themselves need not be kept: ``CL = 1 − curve[w − 1]``.
        full_layers: k, layers 1 … k keep full attention (paper: k = 3); the rest are local.
        ddof: std convention for both σ and the CL std (0 = population).
        make_odd: footnote 5's "+1 if even".

    Returns:
        One dict per layer: ``layer`` (1-based), ``mu``, ``sigma``, ``window``, ``cl_mean``,
        ``cl_std`` (CL of each sentence at the layer's window w^l, mean ± std over sentences),
        ``attention`` ("full" or "local"), ``n_sentences``.
    """
    if len(windows) != len(curves):
        raise ValueError(f"{len(windows)} layers of windows but {len(curves)} layers of curves")
    rows = []
    for layer, (ws, cs) in enumerate(zip(windows, curves), start=1):
        if len(ws) != len(cs):
            raise ValueError(f"layer {layer}: {len(ws)} windows but {len(cs)} curves")
        stats = window_from_lengths(ws, ddof=ddof, make_odd=make_odd)
        w = stats["window"]
        cls = [1.0 - (float(cur[min(w, cur.numel()) - 1]) if w > 0 else 0.0) for cur in cs]
        cl_mean, cl_std = _mean_std(cls, ddof)
        rows.append(
            {
                "layer": layer,
                "mu": stats["mu"],
                "sigma": stats["sigma"],
                "window": w,
                "cl_mean": cl_mean,
                "cl_std": cl_std,
                "attention": "full" if layer <= full_layers else "local",
                "n_sentences": len(ws),
            }
        )
    return rows


def window_table_from_matrices(
    matrices: Sequence[Sequence[Tensor]],
    threshold: float = 0.01,
    *,
    full_layers: int = 3,
    ddof: int = 0,
    make_odd: bool = True,
    **select_kwargs,
) -> list[dict]:
    """:func:`window_table` from ``matrices[l][s]`` (contribution matrices, layer l, sentence s),
    running :func:`select_window` (``threshold`` and ``select_kwargs``) and
    :func:`diagonality_curve` on each. The curves use C as given (pass normalised matrices)."""
    windows = [[select_window(c, threshold, **select_kwargs) for c in layer] for layer in matrices]
    curves = [[diagonality_curve(c) for c in layer] for layer in matrices]
    return window_table(windows, curves, full_layers=full_layers, ddof=ddof, make_odd=make_odd)
