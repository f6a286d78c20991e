"""What moved in head selection (lib.train.multi.movement_metrics) and whether seeds agree
(lib.report.multi.selection_agreement against chance H / H'; sharing_agreement, which ignores which
copy of a tiled ASR head a task picked, against its exact chance level)."""
from __future__ import annotations

import itertools
import random

import pytest

from lib.report.multi import (chance_agreement, chance_partition_shares, chance_sharing_agreement,
                              partition_shares, selection_agreement, sharing_agreement)
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


def _tasks_sel(per_task_layers: list) -> dict:
    """selection.json-like ``final``/``init`` for one side: per task, per layer, the selected candidates."""
    return {"encoder": {"selected": per_task_layers}}


def test_sharing_agreement_ignores_which_copy_was_picked() -> None:
    # H = 2, H' = 4: slot 0 = {0, 2}, slot 1 = {1, 3}; three tasks, one layer
    a = _tasks_sel([[[0, 1]], [[0, 3]], [[2, 1]]])
    b = _tasks_sel([[[2, 3]], [[2, 1]], [[0, 3]]])  # a with both slots' copies swapped: same sharing
    c = _tasks_sel([[[0, 1]], [[0, 1]], [[0, 1]]])  # every task shares every head
    runs = [{"final": a, "init": c}, {"final": b, "init": c}]
    assert selection_agreement(runs, "final") == 0.0
    assert sharing_agreement(runs, 4, "final") == 1.0
    assert sharing_agreement([{"final": a}, {"final": c}], 4, "final") == 0.0
    assert sharing_agreement(runs[:1], 4) is None
    shares = partition_shares([{"final": a}], 4, ["de", "es", "it"], "final")
    assert shares == {"de es | it": 0.5, "de it | es": 0.5}


def _pattern_agreement_by_brute_force(n_heads: int, candidates: int, n_tasks: int, strategy: str) -> float:
    """P(two independent uniform draws have the same sharing of slot 0, up to relabelling its copies),
    by enumerating every pair of draws and testing relabellings directly."""
    slot = list(range(0, candidates, n_heads))
    if strategy == "group":
        per_task = [[c] for c in slot]
    else:
        per_task = [[c for c in sub if c in slot] for sub in itertools.combinations(range(candidates), n_heads)]
    draws = list(itertools.product(per_task, repeat=n_tasks))

    def same(x, y) -> bool:  # noqa: ANN001
        for perm in itertools.permutations(slot):
            relabel = dict(zip(slot, perm))
            if all(sorted(relabel[c] for c in xs) == sorted(ys) for xs, ys in zip(x, y)):
                return True
        return False

    return sum(same(x, y) for x in draws for y in draws) / len(draws) ** 2


@pytest.mark.parametrize("n_heads, candidates, n_tasks, strategy", [
    (4, 8, 3, "group"), (2, 6, 2, "group"), (2, 4, 2, "subset"), (2, 6, 2, "subset")])
def test_chance_sharing_agreement_is_exact(n_heads, candidates, n_tasks, strategy) -> None:  # noqa: ANN001
    exact = chance_sharing_agreement(n_heads, candidates, n_tasks, strategy)
    assert exact == pytest.approx(_pattern_agreement_by_brute_force(n_heads, candidates, n_tasks, strategy))
    shares = chance_partition_shares(n_heads, candidates, [f"t{i}" for i in range(n_tasks)], strategy)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_chance_levels_of_the_default_group_setting() -> None:
    # group, 2 copies per slot, 3 languages: four equally likely sharings
    assert chance_sharing_agreement(4, 8, 3, "group") == pytest.approx(0.25)
    assert chance_partition_shares(4, 8, ["de", "es", "it"], "group") == pytest.approx(
        {"de es it": 0.25, "de es | it": 0.25, "de it | es": 0.25, "es it | de": 0.25})
    with pytest.raises(ValueError, match="strategy"):
        chance_sharing_agreement(4, 8, 3, "baseline")
