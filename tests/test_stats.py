"""lib/stats.py: torch-free statistics (Student's t quantile, intervals over seeds, mean/std, Spearman)."""
from __future__ import annotations

import math
import sys

import pytest

from lib.stats import Interval, mean_ci, mean_std, paired_interval, spearman, t_quantile

T_975_DF2 = 4.302652729  # Student's t, 97.5 % quantile, 2 degrees of freedom (tables)


def test_t_quantile_matches_tables() -> None:
    for p, df, t in ((0.975, 1, 12.7062047), (0.975, 2, T_975_DF2), (0.975, 4, 2.776445105),
                     (0.975, 10, 2.228138852), (0.975, 30, 2.042272456), (0.9, 5, 1.475884049)):
        assert t_quantile(p, df) == pytest.approx(t, abs=1e-6)
    with pytest.raises(ValueError, match="0.5 < p < 1"):
        t_quantile(0.4, 3)


def test_mean_ci_by_hand() -> None:
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(T_975_DF2 * 1.0 / math.sqrt(3))
    m, h = mean_ci([4.0])
    assert m == 4.0 and math.isnan(h)


def test_spearman_hand_cases() -> None:
    """Spearman by hand: perfect agreement, reversal, a constant side, and ties given average ranks
    (one tie case where min ranks would give a different value)."""
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [5, 5, 5]) == 0.0
    # ties get average ranks: y ranks (1.5, 1.5, 3) against x ranks (1, 2, 3)
    assert spearman([1, 2, 3], [7, 7, 9]) == pytest.approx(0.8660254, abs=1e-6)
    # a tie that min ranks (1, 2, 2, 4) would get wrong: average ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4)
    # give sxy = 4.5, sxx = 5, syy = 4.5, r = 4.5 / sqrt(22.5) = 0.9487 (min ranks: 4.5 / sqrt(23.75) = 0.9234)
    assert spearman([1, 2, 3, 4], [3, 5, 5, 9]) == pytest.approx(4.5 / 22.5 ** 0.5, abs=1e-9)
    assert spearman([1, 2, 3, 4], [3, 5, 5, 9]) == pytest.approx(0.9487, abs=1e-4)
    with pytest.raises(ValueError, match="equal-length"):
        spearman([1, 2], [1])


def test_mean_std_and_paired_interval_by_hand() -> None:
    assert mean_std([20.0, 22.0, 24.0]) == pytest.approx((22.0, 2.0))  # sample std (n - 1)
    assert mean_std([5.0]) == (5.0, 0.0)
    d = paired_interval([3.0, 5.0, 7.0], [1.0, 2.0, 3.0])  # differences 2, 3, 4
    assert d.mean == pytest.approx(3.0) and d.hi - d.mean == pytest.approx(t_quantile(0.975, 2) / 3 ** 0.5)


def test_stats_imports_no_torch() -> None:
    import subprocess

    code = "import lib.stats, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_interval_sign_needs_the_whole_interval_off_zero() -> None:
    """An interval that touches 0 ([0, 2] or [-2, 0]) holds 0: no sign."""
    assert Interval(1.0, 1.0, 3).sign() == 0
    assert Interval(-1.0, 1.0, 3).sign() == 0
    assert Interval(1.0, 0.5, 3).sign() == 1
    assert Interval(-1.0, 0.5, 3).sign() == -1
    assert Interval(1.0, math.nan, 1).sign() == 0
