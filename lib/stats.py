"""Statistics without torch (the report stage and the scripts import this and must not load torch):
``mean_std``, ``spearman`` (windows against depth), and seed-level intervals.

Seed-level statistics: every Δ the report, the docs and the draws tables give is headed by the
t-interval over training seeds (or over ASR draws), paired by seed where two systems share them.

Why seeds and not sentences: a training seed changes the data order, the dropout masks and the
decoder's initialisation, so two runs of one system differ by 1.5-2.6 BLEU on the demo. sacreBLEU's
paired bootstrap resamples the *test sentences* of one pair of runs: it measures how sure we are of
that pair's difference on other test sets, not whether another seed would reproduce it. A Δ between
systems is therefore the mean over seeds of the per-seed difference with its 95 % t-interval
(df = seeds − 1); the per-sentence bootstrap stays a secondary column, labelled for what it measures.

Student's t quantile without scipy: the regularized incomplete beta function by its continued
fraction (Lentz's method), the CDF from it, the quantile by bisection.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Interval", "ci_cell", "interval", "mean_ci", "paired_interval", "t_quantile"]


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: int) -> float:
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (0.5 < p < 1), to ~1e-10."""
    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile: need 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2.0


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """(mean, half-width of the two-sided t-interval at ``level``): mean ± t_{(1+level)/2, n−1} · s / √n with
    s the sample std. The half-width is NaN for a single value (no interval)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_ci: no values")
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return m, math.nan
    return m, t_quantile((1.0 + level) / 2.0, len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))


def ci_cell(m: float, h: float, digits: int = 2) -> str:
    """``+m [m − h, m + h]``: a mean difference with its interval (``+m`` alone when h is NaN)."""
    f = f"{{:+.{digits}f}}"
    return f.format(m) + ("" if math.isnan(h) else f" [{f.format(m - h)}, {f.format(m + h)}]")


@dataclass(frozen=True)
class Interval:
    """A mean with the half-width of its two-sided 95 % t-interval over ``n`` values (NaN for n = 1)."""

    mean: float
    half: float
    n: int

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half

    @property
    def defined(self) -> bool:
        return not math.isnan(self.half)

    def sign(self) -> int:
        """+1 / -1 when the whole interval lies above / below 0, else 0 (it holds 0, or there is none)."""
        if not self.defined:
            return 0
        return 1 if self.lo > 0 else -1 if self.hi < 0 else 0

    def cell(self, digits: int = 2) -> str:
        """``+m [lo, hi]`` (``+m`` alone without an interval)."""
        return ci_cell(self.mean, self.half, digits)

    def as_dict(self, digits: int = 2) -> dict:
        """``{"mean", "ci95_lo", "ci95_hi", "n"}`` rounded (lo / hi are None without an interval)."""
        return {"mean": round(self.mean, digits), "ci95_lo": round(self.lo, digits) if self.defined else None,
                "ci95_hi": round(self.hi, digits) if self.defined else None, "n": self.n}


def interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """:func:`mean_ci` as an :class:`Interval`."""
    m, h = mean_ci(values, level)
    return Interval(m, h, len(values))


def paired_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
    """a − b paired by position (the same seed, or the same draw): the interval of the differences."""
    if len(a) != len(b):
        raise ValueError(f"paired_interval: {len(a)} values against {len(b)}: pair them by seed")
    return interval([x - y for x, y in zip(a, b)], level)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1) over seeds; 0 for a single seed."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); 0 when either side is constant. Of a
    model's Algorithm 1 windows against their layer index: whether the windows grow with depth."""
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"spearman: need two equal-length sequences of >= 2 values, got {len(x)} and {len(y)}")
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return 0.0 if sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5
