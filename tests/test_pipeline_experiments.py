"""End-to-end: what a user does with experiments on the tiny demo pipeline (tests/test_pipeline.py's
repository, a copy of its own): an experiment and its metrics diff, the README's per-seed recipe over
DVC's queue and run-cache, and one run in two processes.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.dvc_repo import TINY, TRAIN_TINY, VENV_BIN, git_commit, tiny_repo_copy
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
    windows), every other seed as a queued experiment, run side by side by two queue workers (each in
    a workspace of its own, both writing to the one DVC cache and run-cache), then one `dvc exp run`
    over all seeds restores every run from DVC's run-cache and reruns only the report. One pair (each
    queued workspace also reruns the per-pair stages whose outputs DVC does not cache): what is tested is
    the queue and the run-cache, which a second pair would only repeat."""
    pairs = ["-S", "pairs=[en-de]"]  # of TINY["pairs"]
    _run(["dvc", "exp", "run", "-S", "seeds=[1]", *pairs], tiny_repo)
    for seed in (2, 3):
        _run(["dvc", "exp", "run", "--queue", "-S", f"seeds=[1,{seed}]", *pairs, "-n", f"seed{seed}"], tiny_repo)
    _run(["dvc", "exp", "run", "--run-all", "-j", "2"], tiny_repo)
    status = _run(["dvc", "queue", "status"], tiny_repo).stdout
    assert status.count("Success") == 2 and "Failed" not in status, status
    out = _run(["dvc", "exp", "run", "-S", "seeds=[1,2,3]", *pairs], tiny_repo).stdout
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


@pytest.mark.slow
def test_a_run_in_two_gloo_processes_through_dvc(tiny_repo: Path, tmp_path: Path) -> None:
    """train_st.processes: 2 (docs/gpu.md): `dvc repro` runs the stage's plain command, the stage starts
    torchrun itself (two gloo processes on a CPU), dvc.lock records the count like any param, and the
    update is the one process's with the same update_freq (one batch per process against two
    accumulated; dropout off, since every process has its own dropout stream), in float64 (amp: fp64),
    where only the order of the sums may differ. A finished run of another count is not silently moved
    aside: the stage stops with one line naming the remedy."""
    import torch

    repo = tmp_path / "repo"  # a copy: the other tests share the workspace
    shutil.copytree(tiny_repo, repo, symlinks=True)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["model"]["overrides"].update({"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0})
    params["train_st"].update({"update_freq": 2, "processes": 1, "amp": "fp64"})
    stage, run_dir = "train_baseline@en-de-1", repo / "runs/baseline/en-de/seed1"

    def repro(processes: int) -> dict:
        params["train_st"]["processes"] = processes
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        out = _run(["dvc", "repro", stage], repo)
        assert f"Running stage '{stage}'" in out.stdout
        assert ("train_st.processes = 2: starting torchrun --standalone --nproc_per_node=2" in out.stdout + out.stderr) == (processes == 2)
        model = torch.load(run_dir / "model.pt", weights_only=True)["model"]
        assert json.loads((repo / "metrics/baseline/en-de/seed1.json").read_text())["precision"] == "fp64"
        assert all(t.dtype == torch.float64 for t in model.values() if t.is_floating_point())
        return model

    single = repro(1)
    params["train_st"]["processes"] = 2
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["dvc", "repro", stage], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "was made by 1 process and this run has 2" in proc.stdout + proc.stderr
    assert "train_*.processes: 1" in proc.stdout + proc.stderr and (run_dir / "checkpoints/last.pt").is_file()

    shutil.rmtree(run_dir / "checkpoints")  # the remedy the message names: train afresh with 2
    two = repro(2)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert lock["stages"][stage]["params"]["params.yaml"]["train_st"]["processes"] == 2
    assert "changed" not in _run(["dvc", "status", stage], repo).stdout
    metrics = json.loads((repo / "metrics/baseline/en-de/seed1.json").read_text())
    assert metrics["updates"] == TRAIN_TINY["max_updates"]
    assert list(single) == list(two)
    worst = max(float((single[k] - two[k]).abs().max()) for k in single)
    snapshots = sorted((run_dir / "checkpoints/snapshots").glob("update_*.pt"))
    assert len(snapshots) >= 2
    first, last = (torch.load(f, weights_only=True)["model"] for f in (snapshots[0], snapshots[-1]))
    moved = max(float((first[k] - last[k]).abs().max()) for k in first)
    assert moved > 1e-4  # an update moves the weights by far more than the tolerance below
    assert worst < 1e-12, f"two processes and one differ by up to {worst:g}"
