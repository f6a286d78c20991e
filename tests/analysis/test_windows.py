"""Tests for lib.analysis.windows: D(w), CCD, CL, Algorithm 1 and the window rule of footnote 5."""
from __future__ import annotations

import math

import pytest
import torch

from lib.analysis.windows import (
    ccd,
    contribution_loss,
    diagonal_means,
    diagonal_sums,
    diagonality,
    diagonality_curve,
    select_window,
    window_from_lengths,
    window_size,
    window_table,
    window_table_from_matrices,
)
from lib.paper import WINDOW_TABLES


def toeplitz(n: int, values: dict[int, float], default: float = 0.0) -> torch.Tensor:
    """C[i, j] = values.get(j - i, default) (offset > 0: super-diagonal, keys after the query)."""
    c = torch.full((n, n), default, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            if (j - i) in values:
                c[i, j] = values[j - i]
    return c


def brute_d(c: torch.Tensor, w: int) -> float:
    n = c.shape[0]
    i = torch.arange(n)
    mask = (i[:, None] - i[None, :]).abs() <= w // 2
    return float((c * mask).sum() / n)


# --------------------------------------------------------------------------- diagonality / CCD


def test_identity_matrix():
    for n in (1, 2, 7):
        c = torch.eye(n, dtype=torch.float64)
        curve = diagonality_curve(c)
        assert curve.shape == (2 * n,)
        torch.testing.assert_close(curve, torch.ones(2 * n, dtype=torch.float64))
        assert diagonality(c, 1) == 1.0
        assert ccd(c) == pytest.approx(1.0)
        assert ccd(c, method="mean") == pytest.approx(1.0)
        assert contribution_loss(c, 1) == pytest.approx(0.0)


def test_uniform_matrix():
    n = 10
    c = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    curve = diagonality_curve(c)
    for w in range(1, 2 * n + 1):
        h = min(w // 2, n - 1)
        expected = (n * (2 * h + 1) - h * (h + 1)) / n**2  # band entries / N²
        assert curve[w - 1].item() == pytest.approx(expected)
        assert diagonality(c, w) == pytest.approx(expected)
    assert diagonality(c, 1) == pytest.approx(0.1)
    assert diagonality(c, 2 * n) == pytest.approx(1.0)
    assert diagonality(c, 2 * n - 1) == pytest.approx(1.0)
    trap = sum((curve[w] + curve[w + 1]).item() / 2 for w in range(2 * n - 1)) / (2 * n - 1)
    assert ccd(c) == pytest.approx(trap)
    assert 0.0 < ccd(c) < 1.0
    assert ccd(c) < ccd(torch.eye(n, dtype=torch.float64))


def test_banded_matrix():
    # main 0.5, first sub/super 0.25 each (rows 0 and N-1 miss one neighbour), nothing else
    n = 6
    c = toeplitz(n, {0: 0.5, 1: 0.25, -1: 0.25})
    assert diagonality(c, 1) == pytest.approx(0.5)
    expected3 = (n * 0.5 + 2 * (n - 1) * 0.25) / n
    assert diagonality(c, 2) == pytest.approx(expected3)  # ⌊2/2⌋ = 1 token each side
    assert diagonality(c, 3) == pytest.approx(expected3)
    assert diagonality(c, 12) == pytest.approx(expected3)
    assert diagonality(c, 0) == 0.0
    assert contribution_loss(c, 3) == pytest.approx(1 - expected3)
    # normalised version: D reaches 1 at w = 3
    cn = c / c.sum(1, keepdim=True)
    assert diagonality(cn, 3) == pytest.approx(1.0)
    curve = diagonality_curve(cn)
    assert ccd(cn) == pytest.approx(((curve[:-1] + curve[1:]) / 2).mean().item())


def test_two_by_two_ccd_by_hand():
    c = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(diagonality_curve(c), torch.tensor([0.75, 1.0, 1.0, 1.0], dtype=torch.float64))
    assert ccd(c) == pytest.approx((0.875 + 1 + 1) / 3)
    assert ccd(c, method="mean") == pytest.approx(3.75 / 4)
    with pytest.raises(ValueError):
        ccd(c, method="simpson")


def test_curve_matches_brute_force_random():
    g = torch.Generator().manual_seed(0)
    for n in (1, 3, 8, 33):
        c = torch.rand(n, n, generator=g, dtype=torch.float64)
        c = c / c.sum(1, keepdim=True)
        curve = diagonality_curve(c)
        for w in range(1, 2 * n + 1):
            assert curve[w - 1].item() == pytest.approx(brute_d(c, w), abs=1e-12)
            assert diagonality(c, w) == pytest.approx(brute_d(c, w), abs=1e-12)
        # even w covers the same band as w + 1; D is non-decreasing and ends at 1
        assert torch.equal(curve[1::2][: n - 1], curve[2::2][: n - 1])
        assert (curve[1:] >= curve[:-1] - 1e-15).all()
        assert curve[-1].item() == pytest.approx(1.0)
        assert 0.0 <= ccd(c) <= 1.0


def test_diagonal_sums_and_means():
    n = 5
    c = torch.arange(n * n, dtype=torch.float64).reshape(n, n)
    up, lo = diagonal_means(c)
    s = diagonal_sums(c)
    for k in range(n):
        assert up[k].item() == pytest.approx(torch.diagonal(c, k).mean().item())
        assert lo[k].item() == pytest.approx(torch.diagonal(c, -k).mean().item())
        expected = torch.diagonal(c, k).sum() + (torch.diagonal(c, -k).sum() if k else 0)
        assert s[k].item() == pytest.approx(expected.item())


# --------------------------------------------------------------------------- Algorithm 1


def test_select_window_counter_reset():
    # N = 20 -> patience ⌈2⌉ = 2. Offsets: 1 pass, 2 fail, 3 pass (reset), 4 fail, 5 fail -> stop.
    n, t = 20, 0.01
    c = toeplitz(n, {0: 0.5, 1: 0.1, -1: 0.1, 3: 0.05, 6: 0.05})  # offset 6 never reached
    assert select_window(c, t, normalize_rows=False) == 6
    assert select_window(c, t, normalize_rows=False, width_rule="2i+1") == 7
    # one failure only (offset 4) before a pass at 5: the counter resets and 5 counts
    c2 = toeplitz(n, {0: 0.5, 1: 0.1, 3: 0.05, 5: 0.05})
    assert select_window(c2, t, normalize_rows=False) == 10
    # a bigger patience reaches offset 6
    assert select_window(c, t, normalize_rows=False, patience=3) == 12


def test_select_window_stops_after_n_over_10_failures():
    n = 30  # patience 3
    c = toeplitz(n, {0: 0.5, 1: 0.2, 5: 0.2})  # offsets 2, 3, 4 fail -> stop before 5
    assert select_window(c, normalize_rows=False) == 2
    c = toeplitz(n, {0: 0.5, 1: 0.2, 4: 0.2})  # offsets 2, 3 fail, 4 passes
    assert select_window(c, normalize_rows=False) == 8
    # patience rounding: N = 25 -> N/10 = 2.5 ; ceil 3 (literal `counter < N/10`), floor 2, round 3
    c = toeplitz(25, {0: 0.5, 1: 0.2, 4: 0.2})  # offsets 2, 3 fail
    assert select_window(c, normalize_rows=False) == 8
    assert select_window(c, normalize_rows=False, patience_rounding="round") == 8
    assert select_window(c, normalize_rows=False, patience_rounding="floor") == 2
    # N = 5: floor(0.5) = 0 -> at least 1
    c = toeplitz(5, {0: 0.5, 1: 0.2, 3: 0.2})
    assert select_window(c, normalize_rows=False, patience_rounding="floor") == 2
    assert select_window(c, normalize_rows=False, patience_rounding="floor", min_patience=2) == 6


def test_select_window_sub_or_super_alone():
    n = 20
    t = 0.01
    sup = toeplitz(n, {0: 0.5, 2: 0.05})  # only the super-diagonal at offset 2
    sub = toeplitz(n, {0: 0.5, -2: 0.05})  # only the sub-diagonal
    both_low = toeplitz(n, {0: 0.5, 2: 0.009, -2: 0.009})  # each below t (their sum is not)
    assert select_window(sup, t, normalize_rows=False) == 4
    assert select_window(sub, t, normalize_rows=False) == 4
    assert select_window(both_low, t, normalize_rows=False) == 0
    # strict '>' : exactly t fails (binary-exact values so the mean is exactly t)
    assert select_window(toeplitz(n, {0: 0.5, 1: 0.25}), 0.25, normalize_rows=False) == 0
    assert select_window(toeplitz(n, {0: 0.5, 1: 0.25}), 0.2499, normalize_rows=False) == 2


def test_select_window_mean_over_diagonal_length():
    # one entry of 0.05 on the 3rd super-diagonal of a 10x10: mean 0.05/7 < 0.01; 0.08/7 > 0.01
    c = torch.zeros(10, 10, dtype=torch.float64)
    c.fill_diagonal_(0.5)
    c[0, 3] = 0.05
    assert select_window(c, normalize_rows=False, patience=5) == 0
    c[0, 3] = 0.08
    assert select_window(c, normalize_rows=False, patience=5) == 6
    assert select_window(c, normalize_rows=False) == 0  # N = 10: patience 1, offset 1 fails first


def test_select_window_main_diagonal_param():
    n = 20
    c = toeplitz(n, {0: 0.9})  # only the main diagonal passes
    assert select_window(c, normalize_rows=False, width_rule="2i+1", include_main_diagonal=True) == 1
    assert select_window(c, normalize_rows=False, width_rule="2i+1", include_main_diagonal=False) == 0
    assert select_window(c, normalize_rows=False, width_rule="2i", include_main_diagonal=True) == 0
    assert select_window(c, normalize_rows=False) == 0  # defaults
    # a failing main diagonal counts as a failure when included: N = 10 -> patience 1
    c = toeplitz(10, {0: 0.0, 1: 0.5})
    assert select_window(c, normalize_rows=False, include_main_diagonal=True) == 0
    assert select_window(c, normalize_rows=False, include_main_diagonal=False) == 2


def test_select_window_normalisation_and_edge_cases():
    n = 20
    c = toeplitz(n, {0: 0.5, 1: 0.1, -1: 0.1})
    assert select_window(c * 1000.0) == select_window(c) == 2  # rows renormalised inside
    assert select_window(c * 1000.0, normalize_rows=False, threshold=50.0) == 2
    assert select_window(torch.ones(1, 1)) == 0
    # short uniform sentence: every diagonal passes (1/20 > 0.01) -> the whole matrix
    assert select_window(torch.full((20, 20), 0.05)) == 38
    assert select_window(torch.full((20, 20), 0.05), width_rule="2i+1") == 39
    # long uniform sentence: 1/200 < 0.01, nothing off the diagonal passes
    assert select_window(torch.full((200, 200), 1 / 200)) == 0
    with pytest.raises(ValueError):
        select_window(c, width_rule="i")
    with pytest.raises(ValueError):
        select_window(torch.ones(2, 3))


# --------------------------------------------------------------------------- window rule


def test_window_made_odd():
    assert window_size(4.0, 0.0) == 5
    assert window_size(3.5, 0.5) == 5  # ⌈4⌉ = 4 -> 5, no spurious extra token
    assert window_size(4.1, 0.0) == 5
    assert window_size(5.0, 0.5) == 7
    assert window_size(0.0, 0.0) == 1
    assert window_size(4.0, 0.0, make_odd=False) == 4
    assert window_size(0.1 + 0.2, 2.7) == 3  # 3.0000000000000004 is 3


def test_window_from_lengths_examples():
    r = window_from_lengths([3, 5])
    assert (r["mu"], r["sigma"], r["window"]) == (4.0, 1.0, 5)
    r = window_from_lengths([3, 5], ddof=1)  # sample std sqrt(2): ⌈5.41⌉ = 6 -> 7
    assert r["sigma"] == pytest.approx(math.sqrt(2)) and r["window"] == 7
    assert window_from_lengths([4] * 10) == {"mu": 4.0, "sigma": 0.0, "window": 5}
    assert window_from_lengths([0, 0, 0])["window"] == 1
    r = window_from_lengths([0, 0, 0, 4])  # μ = 1, σ = √3 -> ⌈2.73⌉ = 3
    assert r["window"] == 3
    with pytest.raises(ValueError):
        window_from_lengths([])


@pytest.mark.parametrize("pair", sorted(WINDOW_TABLES))
def test_paper_tables_windows_reproduced(pair):
    """⌈μ + σ⌉-then-odd reproduces every printed w of Tables 1 (En-De), 3 (En-Es), 4 (En-It)."""
    for layer, mu, sigma, w, _, _ in WINDOW_TABLES[pair]:
        assert window_size(mu, sigma) == w, (pair, layer)


def _min_std_on_lattice(mu: float, lattice: list[int]) -> float:
    """Least std of any distribution on ``lattice`` with mean ``mu`` (two bracketing points)."""
    lo = max(v for v in lattice if v <= mu)
    hi = min(v for v in lattice if v >= mu)
    return math.sqrt((mu - lo) * (hi - mu))


def test_paper_tables_imply_even_per_sentence_widths():
    """Why width_rule="2i" is the default: the printed (μ, σ) are impossible if every per-sentence
    window were odd (2i+1, possibly 0), but all are possible with even widths (2i)."""
    odd = [0] + list(range(1, 200, 2))
    even = list(range(0, 200, 2))
    slack = 0.005 + 0.01  # printed rounding, and σ population vs sample
    odd_violations = []
    for pair, rows in WINDOW_TABLES.items():
        for layer, mu, sigma, *_ in rows:
            assert sigma + slack >= _min_std_on_lattice(mu, even), (pair, layer)
            if sigma + slack < _min_std_on_lattice(mu, odd):
                odd_violations.append((pair, layer))
    assert ("en-de", 5) in odd_violations and ("en-it", 4) in odd_violations
    # μ < 1 in En-De layer 3 rules out a main diagonal that always counts (w >= 1)
    assert WINDOW_TABLES["en-de"][2][1] < 1


def test_simulated_sentence_lengths_reproduce_layer_window():
    # 400 sentences of layer-5-like statistics under "2i": mostly i = 2 -> 4
    lengths = [4] * 394 + [6] * 6
    r = window_from_lengths(lengths)
    assert r["mu"] == pytest.approx(4.03) and r["sigma"] == pytest.approx(0.2431, abs=1e-3)
    assert r["window"] == 5


# --------------------------------------------------------------------------- table


def test_window_table():
    n = 20
    local = toeplitz(n, {0: 0.6, 1: 0.1, -1: 0.1, 2: 0.05, -2: 0.05})
    local = local / local.sum(1, keepdim=True)
    uniform = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    matrices = [[uniform, uniform], [local, local, local]]
    rows = window_table_from_matrices(matrices, 0.01, full_layers=1)
    assert [r["layer"] for r in rows] == [1, 2]
    assert [r["attention"] for r in rows] == ["full", "local"]
    assert rows[0]["window"] == 39 and rows[0]["mu"] == 38 and rows[0]["sigma"] == 0
    assert rows[0]["cl_mean"] == pytest.approx(0.0, abs=1e-12)
    assert rows[1]["mu"] == 4 and rows[1]["window"] == 5 and rows[1]["n_sentences"] == 3
    assert rows[1]["cl_mean"] == pytest.approx(0.0, abs=1e-12) and rows[1]["cl_std"] == pytest.approx(0.0)
    # CL at the layer's window, from stored curves (no matrices kept)
    curves = [[diagonality_curve(local), diagonality_curve(uniform)]]
    rows = window_table([[2, 0]], curves, full_layers=3)
    assert rows[0]["window"] == 3 and rows[0]["attention"] == "full"
    cls = [contribution_loss(local, 3), contribution_loss(uniform, 3)]
    assert rows[0]["cl_mean"] == pytest.approx(sum(cls) / 2)
    assert rows[0]["cl_std"] == pytest.approx(abs(cls[0] - cls[1]) / 2)


# --------------------------------------------------------------------------- mutation-audit additions


def test_window_size_float_noise_above_an_integer():
    """2.4000000000000004 + 0.6 = 3.0000000000000004 in floats: ⌈μ+σ⌉ is 3 (odd, kept), not 4 -> 5."""
    mu = 24 * 0.1
    assert mu + 0.6 > 3.0  # the noise is really there
    assert window_size(mu, 0.6) == 3
    assert window_size(4.6000000000000005, 0.4) == 5  # 5.000000000000001 is 5, not 6 -> 7


def test_select_window_default_patience_is_the_ceiling_of_n_over_10():
    """N = 11: the literal ``while counter < N/10`` stops at ⌈1.1⌉ = 2 consecutive failures. Offset 1
    fails, offset 2 passes (0.1 / (0.9 + 0.1) per row on the super-diagonal), so the default scan
    reaches it: w = 2·2 = 4. Patience 1 (floor / round of 1.1) stops at offset 1 with w = 0."""
    n = 11
    c = toeplitz(n, {0: 0.9, 2: 0.1})
    assert select_window(c) == 4
    assert select_window(c, patience=2) == 4
    assert select_window(c, patience_rounding="round") == 0
    assert select_window(c, patience_rounding="floor") == 0


def test_window_table_sample_std_applies_to_sigma_and_the_cl_std():
    n = 20
    local = toeplitz(n, {0: 0.6, 1: 0.1, -1: 0.1, 2: 0.05, -2: 0.05})
    local = local / local.sum(1, keepdim=True)
    uniform = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    rows = window_table([[2, 0]], [[diagonality_curve(local), diagonality_curve(uniform)]], ddof=1)
    # μ 1, σ = √2 (sample std): ⌈2.41⌉ = 3; CL std over two sentences = |a − b| / √2
    assert rows[0]["sigma"] == pytest.approx(math.sqrt(2)) and rows[0]["window"] == 3
    cls = [contribution_loss(local, 3), contribution_loss(uniform, 3)]
    assert rows[0]["cl_std"] == pytest.approx(abs(cls[0] - cls[1]) / math.sqrt(2))


def test_window_from_lengths_needs_more_lengths_than_ddof():
    assert window_from_lengths([4], ddof=0) == {"mu": 4.0, "sigma": 0.0, "window": 5}
    with pytest.raises(ValueError, match="need more than ddof=1 lengths, got 1"):
        window_from_lengths([4], ddof=1)


def test_floor_patience_is_not_pushed_down_by_float_noise():
    """0.29 · 100 = 28.999999999999996 in floats: the floor is 29 consecutive failures, not 28. Offsets
    2..29 fail (28 of them) and offset 30 passes, so patience 29 reaches it and 28 stops before it."""
    c = toeplitz(100, {0: 0.5, 1: 0.2, 30: 0.05})
    assert 0.29 * 100 < 29
    assert select_window(c, normalize_rows=False, patience_fraction=0.29, patience_rounding="floor") == 60
    assert select_window(c, normalize_rows=False, patience=28) == 2
