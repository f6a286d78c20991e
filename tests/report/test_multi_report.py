"""What moved in head selection (lib.train.multi.movement_metrics) and whether seeds agree
(lib.report.multi.selection_agreement against chance H / H')."""
from __future__ import annotations

import itertools
import random

import pytest

from lib.report.multi import chance_agreement, selection_agreement
from lib.train.multi import movement_metrics


def _sel(selected: list, logits: list) -> dict:
    return {"encoder": {"layers": [1, 2], "selected": selected, "head_logits": logits}}


def test_movement_metrics_by_hand() -> None:
    init = _sel([[[0, 1], [2, 3]]], [[[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]])
    final = _sel([[[1, 0], [2, 1]]], [[[0.5, -0.5, 0.0, 0.0], [1.0, 3.0, 1.0, 1.0]]])
    m = movement_metrics(init, final)
    assert m["selection_changed_fraction"] == 0.5  # layer 1: same set in another order; layer 2 changed
    assert m["head_logits_mean_abs_change"] == pytest.approx(3.0 / 8)
    assert m["movement"] == {"encoder": {"changed": 0.5, "mean_abs_dphi": pytest.approx(3.0 / 8)}}


def test_selection_agreement_and_its_chance_level() -> None:
    same = {"init": _sel([[[0, 1], [2, 3]]], [[[0] * 4] * 2]), "final": _sel([[[0, 1], [2, 3]]], [[[0] * 4] * 2])}
    other = {"init": _sel([[[2, 3], [0, 1]]], [[[0] * 4] * 2]), "final": _sel([[[0, 2], [2, 3]]], [[[0] * 4] * 2])}
    assert selection_agreement([same, other], "final") == pytest.approx((0.5 + 1.0) / 2)
    assert selection_agreement([same, other], "init") == 0.0
    assert selection_agreement([same]) is None
    assert chance_agreement(4, 8) == 0.5
    # independent uniformly random subsets of H of H' share H / H' of their heads on average
    rng = random.Random(0)
    runs = [{"final": _sel([[sorted(rng.sample(range(8), 4)) for _ in range(2)] for _ in range(3)], [])}
            for _ in range(40)]
    assert selection_agreement(runs) == pytest.approx(chance_agreement(4, 8), abs=0.03)
    assert len(list(itertools.combinations(runs, 2))) == 780
