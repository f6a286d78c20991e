"""End-to-end: one run of the tiny demo pipeline (tests/test_pipeline.py's repository, a copy of its own)
in two processes through `dvc repro`. A file of its own, so that pytest-xdist (one file per worker) can run
it beside the other end-to-end files.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.dvc_repo import TRAIN_TINY, VENV_BIN, tiny_repo_copy
from tests.dvc_repo import run as _run


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    return tiny_repo_copy(tmp_path_factory)


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
