"""Rank statistics without torch (the report stage imports this and must not load torch)."""
from __future__ import annotations

import statistics
from typing import Sequence


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
