"""Report tables from small fixed metric files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lib.report.tables import (headline, load_scores, paper_comparison_markdown, per_seed_markdown, summary,
                               table2_markdown)


def _write(root: Path, folder: str, pair: str, seed: int, bleu: float, chrf: float) -> None:
    path = root / "metrics" / folder / pair / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bleu": bleu, "chrf": chrf}))


def test_table2_mean_std_and_flat_summary(tmp_path: Path) -> None:
    for seed, (b, c) in zip([1, 2, 3], [(20.0, 50.0), (22.0, 52.0), (24.0, 54.0)]):
        _write(tmp_path, "baseline", "en-de", seed, b, c)
        _write(tmp_path, "local", "en-de", seed, b - 1, c - 1)
    base = load_scores(tmp_path, "en-de", "baseline", [1, 2, 3])
    local = load_scores(tmp_path, "en-de", "local", [1, 2, 3])
    assert base.bleu_mean_std == pytest.approx((22.0, 2.0))  # sample std over seeds
    flat = summary([base, local])
    half = round(4.302653 * 2.0 / 3 ** 0.5, 2)  # t(0.975, df 2) * s / sqrt(n): the interval over seeds
    assert flat == {"en-de/baseline/bleu": 22.0, "en-de/baseline/bleu_ci95": half, "en-de/baseline/chrf": 52.0,
                    "en-de/baseline/chrf_ci95": half, "en-de/local/bleu": 21.0, "en-de/local/bleu_ci95": half,
                    "en-de/local/chrf": 51.0, "en-de/local/chrf_ci95": half}
    md = table2_markdown([base, local], {"en-de": [{"seed": 1, "p_value": 0.2}]})
    assert "| en-de | baseline | 22.00 [17.03, 26.97] | 2.00 | 52.00 [47.03, 56.97] | 3 | 22.53 |  |" in md
    assert "| en-de | local | 21.00 [16.03, 25.97] | 2.00 | 51.00 [46.03, 55.97] | 3 | 22.49 | 0.200 |" in md
    assert "test-set sampling only" in md


def test_missing_run_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="seed1.json"):
        load_scores(tmp_path, "en-de", "local", [1])


def _two_seeds_and_health(root: Path, local_delta: float, local_chrf: float, c_ii: float, windows: str) -> tuple:
    """en-de seeds 1-2 (baseline BLEU 20, 22; local = baseline + local_delta) and the ST health file;
    returns (the two systems' scores, the health file)."""
    for seed, b in zip([1, 2], [20.0, 22.0]):
        _write(root, "baseline", "en-de", seed, b, 50.0)
        _write(root, "local", "en-de", seed, b + local_delta, local_chrf)
    scores = [load_scores(root, "en-de", s, [1, 2]) for s in ("baseline", "local")]
    health = root / "metrics" / "health" / "en-de" / "st.json"
    health.parent.mkdir(parents=True)
    health.write_text(json.dumps({"summary": {"c_ii_mean": c_ii}, "algorithm1_windows": windows}))
    return scores, health


def test_paper_comparison_reads_health_and_scores(tmp_path: Path) -> None:
    scores, health = _two_seeds_and_health(tmp_path, -1.5, 49.0, 0.7412, "1 3 5 5 9")
    md = paper_comparison_markdown(tmp_path, scores, {"en-de": [{"p_value": 0.01}, {"p_value": 0.3}]})
    assert "| en-de | -1.50 [-1.50, -1.50] (-0.04) | 1 of 2 | 0.74 | 4 of 5 | +0.97 | 1 3 5 5 9 |" in md
    flat = headline(tmp_path, scores)
    assert flat == {"en-de/local_minus_baseline/bleu": -1.5, "en-de/local_minus_baseline/bleu_ci95": 0.0,
                    "en-de/st_c_ii": 0.741, "en-de/windows": "1 3 5 5 9", "en-de/windows_rho": 0.97}
    health.unlink()
    with pytest.raises(FileNotFoundError, match="health_st"):
        paper_comparison_markdown(tmp_path, scores, {})


def test_significance_reads_the_decoded_test_sets(tmp_path: Path) -> None:
    """The report's paired bootstrap reads data/decoded/<system>/<pair>/seed<k>/ (small outputs),
    never the run folders with the models, and tests each seed's local hypotheses against that seed's
    baseline hypotheses (not the references, not another seed's); refs that differ between the systems
    are refused."""
    from lib.decode.metrics import paired_bootstrap
    from lib.layout import RunPaths
    from lib.report.tables import significance

    refs = [f"das ist satz nummer {i}" for i in range(30)]

    def wrong_every(k: int) -> list[str]:
        return [r if i % k else "x" for i, r in enumerate(refs)]

    hyps = {(1, "baseline"): wrong_every(2), (1, "local"): wrong_every(3),
            (2, "baseline"): wrong_every(7), (2, "local"): wrong_every(3)}
    for (seed, system), h in hyps.items():
        run = RunPaths(tmp_path, system, "en-de", seed)
        run.decoded.mkdir(parents=True)
        run.hyps().write_text("".join(x + "\n" for x in h))
        run.refs().write_text("".join(r + "\n" for r in refs))
    got = significance(tmp_path, "en-de", [1, 2], n_samples=200)
    expected = [paired_bootstrap(hyps[(k, "baseline")], hyps[(k, "local")], refs, n_samples=200)["p_value"] for k in (1, 2)]
    assert [r["seed"] for r in got] == [1, 2] and [r["p_value"] for r in got] == expected
    # the fixture tells the right pairing from the wrong ones: against the refs, or the other seed's baseline
    against_refs = paired_bootstrap(refs, hyps[(1, "local")], refs, n_samples=200)["p_value"]
    other_seed = paired_bootstrap(hyps[(2, "baseline")], hyps[(1, "local")], refs, n_samples=200)["p_value"]
    assert expected[0] not in (against_refs, other_seed) and expected[1] != against_refs
    RunPaths(tmp_path, "local", "en-de", 1).refs().write_text("".join(r + "!\n" for r in refs))
    with pytest.raises(ValueError, match="not decoded on the same test set"):
        significance(tmp_path, "en-de", [1], n_samples=200)


def test_local_minus_baseline_pairs_by_seed(tmp_path: Path) -> None:
    """The interval is over per-seed differences: a steady -1 on seeds that spread by 4 BLEU is sure."""
    from lib.report.tables import local_minus_baseline

    for seed, b in zip([1, 2, 3], [18.0, 22.0, 26.0]):
        _write(tmp_path, "baseline", "en-de", seed, b, 50.0)
        _write(tmp_path, "local", "en-de", seed, b - 1.0 + 0.1 * (seed - 2), 50.0)
    base, local = (load_scores(tmp_path, "en-de", s, [1, 2, 3]) for s in ("baseline", "local"))
    gap = local_minus_baseline(base, local)
    assert gap.mean == pytest.approx(-1.0) and gap.hi < 0 and gap.sign() == -1
    assert gap.half == pytest.approx(4.302653 * 0.1 / 3 ** 0.5, rel=1e-5)
    with pytest.raises(ValueError, match="seeds"):
        local_minus_baseline(base, load_scores(tmp_path, "en-de", "local", [1, 2]))


# ----------------------------------------------------------------------------- mutation-audit additions


def test_table2_std_column_is_bleus_and_per_seed_differences_are_local_minus_baseline(tmp_path: Path) -> None:
    """BLEU and chrF spread differently, so the "BLEU std" column must be BLEU's (sample std 2.00, chrF's is
    5.00); the per-seed rows list BLEU / chrF per run and local − baseline per seed."""
    for seed, (b, c) in zip([1, 2, 3], [(20.0, 45.0), (22.0, 50.0), (24.0, 55.0)]):
        _write(tmp_path, "baseline", "en-de", seed, b, c)
    for seed, (b, c) in zip([1, 2, 3], [(21.0, 44.0), (21.5, 51.0), (25.0, 56.0)]):
        _write(tmp_path, "local", "en-de", seed, b, c)
    base = load_scores(tmp_path, "en-de", "baseline", [1, 2, 3])
    local = load_scores(tmp_path, "en-de", "local", [1, 2, 3])
    md = table2_markdown([base, local], {})
    assert "| en-de | baseline | 22.00 [17.03, 26.97] | 2.00 | 50.00 [37.58, 62.42] | 3 | 22.53 |  |" in md
    rows = per_seed_markdown([base, local]).splitlines()
    assert rows[0] == "| pair | system | seed 1: BLEU / chrF | seed 2: BLEU / chrF | seed 3: BLEU / chrF |"
    assert "| en-de | baseline | 20.00 / 45.00 | 22.00 / 50.00 | 24.00 / 55.00 |" in rows
    assert "| en-de | local − baseline (BLEU) | +1.00 | -0.50 | +1.00 |" in rows


def test_paper_comparison_counts_only_p_strictly_below_005(tmp_path: Path) -> None:
    scores, _ = _two_seeds_and_health(tmp_path, 1.0, 50.0, 0.5, "3 5")
    md = paper_comparison_markdown(tmp_path, scores, {"en-de": [{"p_value": 0.05}, {"p_value": 0.0499}]})
    assert "| 1 of 2 |" in md


@pytest.mark.parametrize("bleu, shown", [(None, "None"), ("85.6", "'85.6'"), (float("nan"), "nan")])
def test_a_score_that_is_no_number_names_the_file(tmp_path: Path, bleu, shown: str) -> None:
    """A metrics file that parses but holds no number under 'bleu': an InputError naming the file and the stage to
    rerun (the report stage's one line), not float()'s TypeError or a 'nan' deep in the statistics."""
    from lib.io import InputError

    path = tmp_path / "metrics/baseline/en-de/seed1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"bleu": bleu, "chrf": 50.0}))
    with pytest.raises(InputError, match=rf"seed1\.json: 'bleu' is {shown}, not a finite number .*train_baseline@en-de-1"):
        load_scores(tmp_path, "en-de", "baseline", [1])


def test_a_health_file_of_another_shape_names_the_file(tmp_path: Path) -> None:
    """metrics/health/<pair>/<model>.json with a 'summary' that is no mapping, or (for the ST model) no Algorithm 1
    windows: an InputError naming the file and the health stage, not an AttributeError or KeyError."""
    from lib.io import InputError
    from lib.report.tables import health_markdown, st_health

    for model in ("asr", "st"):
        path = tmp_path / f"metrics/health/en-de/{model}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"summary": {"c_ii_mean": 0.5}, "algorithm1_windows": "1 3"}))
    assert "| en-de | ST |" in health_markdown(tmp_path, ["en-de"])
    (tmp_path / "metrics/health/en-de/asr.json").write_text(json.dumps({"summary": []}))
    with pytest.raises(InputError, match=r"asr\.json: 'summary' is list, not a mapping .*rerun health_asr@en-de"):
        health_markdown(tmp_path, ["en-de"])
    (tmp_path / "metrics/health/en-de/st.json").write_text(json.dumps({"summary": {"c_ii_mean": 0.5}}))
    with pytest.raises(InputError, match=r"st\.json: no 'algorithm1_windows' .*health_st@en-de"):
        st_health(tmp_path, "en-de")
