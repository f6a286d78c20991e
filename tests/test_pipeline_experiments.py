"""End-to-end: what a user does with experiments on the tiny demo pipeline (tests/test_pipeline.py's
repository, a copy of its own): an experiment and its metrics diff, and the README's per-seed recipe over
DVC's queue and run-cache.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dvc_repo import TINY, git_commit, tiny_repo_copy
from tests.dvc_repo import run as _run


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    return tiny_repo_copy(tmp_path_factory)


@pytest.mark.slow
def test_exp_run_then_metrics_diff_shows_the_change(tiny_repo: Path) -> None:
    """What a user does (a trial, then its attention-health metrics side by side):
    commit the results, run an experiment with one param changed, diff metrics. A health-check
    param reruns the health stages and the report only; no model is retrained."""
    git_commit(tiny_repo, "results")
    out = _run(["dvc", "exp", "run", "-S", "health.samples=2"], tiny_repo).stdout
    ran = sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage"))
    assert ran == sorted([f"health_{m}@{p}" for m in ("asr", "st") for p in TINY["pairs"]] + ["report"]), out
    diff = json.loads(_run(["dvc", "metrics", "diff", "--json"], tiny_repo).stdout)
    # only the headline is a declared metric: the health files changed on disk, the diff shows summary.json
    assert set(diff) <= {"metrics/summary.json"}, diff
    health = json.loads((tiny_repo / "metrics/health/en-de/asr.json").read_text())
    assert health["sentences"] == 2


@pytest.mark.slow
def test_parallel_seed_recipe_gathers_from_the_run_cache(tiny_repo: Path) -> None:
    """The README's per-seed recipe, with seeds [1, 2, 3]: seed 1 first (the analysed baseline and its
    windows), committed, every other seed as a queued experiment, run side by side by two queue workers
    (each in a workspace of its own, from the commit, both writing to the one DVC cache and run-cache):
    they train their seed's runs and nothing upstream; then one `dvc exp run` over all seeds restores
    every run from DVC's run-cache and reruns only the report. On one pair of the two: what is tested is
    the queue and the run-cache, which a second pair would only repeat."""
    one_pair = ["-S", "pairs=[en-de]"]
    _run(["dvc", "exp", "run", "-S", "seeds=[1]", *one_pair], tiny_repo)
    git_commit(tiny_repo, "seed 1, its analysis and windows")
    for seed in (2, 3):
        _run(["dvc", "exp", "run", "--queue", "-S", f"seeds=[1,{seed}]", *one_pair, "-n", f"seed{seed}"], tiny_repo)
    _run(["dvc", "exp", "run", "--run-all", "-j", "2"], tiny_repo)
    status = _run(["dvc", "queue", "status"], tiny_repo).stdout
    assert status.count("Success") == 2 and "Failed" not in status, status
    for seed in (2, 3):
        log = _run(["dvc", "queue", "logs", f"seed{seed}"], tiny_repo).stdout
        ran = sorted(line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage"))
        # prepare_multi and the shared fork read every pair's folder, of which a queued workspace of one
        # pair holds one: they run again here because of the pair left out, not because of the queue
        assert ran == sorted([f"train_baseline@en-de-{seed}", f"train_local@en-de-{seed}", "report", "prepare_multi",
                              "train_asr_local_shared"]), log
    out = _run(["dvc", "exp", "run", "-S", "seeds=[1,2,3]", *one_pair], tiny_repo).stdout
    ran = sorted(line for line in out.splitlines() if line.startswith("Running stage"))
    assert ran == ["Running stage 'report':"], out
    for system in ("baseline", "local"):
        for seed in (2, 3):
            assert f"Stage 'train_{system}@en-de-{seed}' is cached - skipping run" in out, out
            m = json.loads((tiny_repo / "metrics" / system / "en-de" / f"seed{seed}.json").read_text())
            assert 0 <= m["bleu"] <= 100
    report = (tiny_repo / "reports/report.md").read_text()
    assert "seeds [1, 2, 3]" in report and "| en-de | local |" in report
    assert "| 3 |" in report.split("## Table 2")[1].split("##")[0]  # three seeds per row of Table 2
    assert "Running stage" not in _run(["dvc", "repro"], tiny_repo).stdout
