"""Report tables from small fixed metric files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lib.report.tables import headline, load_scores, paper_comparison_markdown, summary, table2_markdown


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


def test_paper_comparison_reads_health_and_scores(tmp_path: Path) -> None:
    for seed, b in zip([1, 2], [20.0, 22.0]):
        _write(tmp_path, "baseline", "en-de", seed, b, 50.0)
        _write(tmp_path, "local", "en-de", seed, b - 1.5, 49.0)
    scores = [load_scores(tmp_path, "en-de", s, [1, 2]) for s in ("baseline", "local")]
    health = tmp_path / "metrics" / "health" / "en-de" / "st.json"
    health.parent.mkdir(parents=True)
    health.write_text(json.dumps({"summary": {"c_ii_mean": 0.7412}, "algorithm1_windows": "1 3 5 5 9"}))
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
    never the run folders with the models; refs that differ between the systems are refused."""
    from lib.layout import RunPaths
    from lib.report.tables import significance

    refs = [f"das ist satz nummer {i}" for i in range(30)]
    for system, hyps in (("baseline", refs), ("local", [r if i % 3 else "x" for i, r in enumerate(refs)])):
        run = RunPaths(tmp_path, system, "en-de", 1)
        run.decoded.mkdir(parents=True)
        run.hyps().write_text("".join(h + "\n" for h in hyps))
        run.refs().write_text("".join(r + "\n" for r in refs))
    (res,) = significance(tmp_path, "en-de", [1], n_samples=200)
    assert res["seed"] == 1 and res["p_value"] < 0.05
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
