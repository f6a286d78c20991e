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


def test_multi_section_deltas_and_bilingual_reference_from_the_files(tmp_path) -> None:  # noqa: ANN001
    """multi_section on hand-made run outputs: Δ avg BLEU is the system minus the multilingual baseline of
    the same seed, and the bilingual reference row averages only the seeds the multilingual runs used."""
    import json

    from lib.layout import RunPaths
    from lib.params.multi import MultiParams
    from lib.report.multi import multi_section

    pairs = ["en-de", "en-es"]
    avg = {("baseline", 1): 10.0, ("baseline", 2): 12.0, ("baseline_h8", 1): 11.0, ("baseline_h8", 2): 15.0}
    for (system, seed), a in avg.items():
        run = RunPaths(tmp_path, "multi", None, seed, variant=system)
        run.metrics.parent.mkdir(parents=True, exist_ok=True)
        run.metrics.write_text(json.dumps({"en-de": {"bleu": a - 1}, "en-es": {"bleu": a + 1}, "avg_bleu": a,
                                           "avg_chrf": a + 20, "params": 1000, "updates": 30}))
        run.decoded.mkdir(parents=True, exist_ok=True)
        (run.decoded / "timing.json").write_text(json.dumps({"decode_sents_per_s": 4.0 * seed}))
    for pair, bleus in (("en-de", (20.0, 22.0, 60.0)), ("en-es", (30.0, 31.0, 90.0))):
        for seed, b in enumerate(bleus, start=1):
            path = RunPaths(tmp_path, "baseline", pair, seed).metrics
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"bleu": b}))
    from lib import layout

    for name in ("head_sharing_none.png", "other.png"):  # a system without selection: its placeholder is not shown
        folder = layout.multi_plots(tmp_path, "baseline", 1)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"\x89PNG\r\n\x1a\n")
    md, flat = multi_section(tmp_path, MultiParams(systems=["baseline", "baseline_h8"], seeds=[1, 2]), pairs, [1, 2, 3])
    assert "head_sharing_none" not in md and "baseline seed 1 other" in md
    # per seed +1, +3: mean +2.00, t(1) · 1.414 / √2 = 12.71
    assert flat["multi/baseline_h8/delta_avg_bleu"] == 2.0 and flat["multi/baseline_h8/delta_avg_bleu_ci95"] == 12.71
    assert flat["multi/baseline_h8/avg_bleu"] == 13.0 and flat["multi/baseline_h8/avg_bleu_std"] == 2.83
    assert flat["multi/baseline_h8/en-es/bleu"] == 14.0 and flat["multi/baseline/avg_chrf"] == 31.0
    assert "multi/baseline/delta_avg_bleu" not in flat
    row = next(line for line in md.splitlines() if line.startswith("| baseline_h8 "))
    assert row == ("| baseline_h8 (H' heads, no selection) | 12.00 ± 2.83 | 14.00 ± 2.83 | 13.00 ± 2.83 | 33.00 | "
                   "+2.00 [-10.71, +14.71] | +0.5 | 1,000 | 6.0 | – | – |")
    # seeds 1 and 2 of the bilingual baselines (seed 3 trained no multilingual run)
    assert "| bilingual baselines (reference; one model per pair, same seeds) | 21.00 | 30.50 |" in md
