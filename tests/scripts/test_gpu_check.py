"""scripts/gpu_check.sh, the one-call GPU check, exercised on a CPU: it parses, names only paths that exist,
refuses bad settings at once, stops at once when torch sees no CUDA device, and, told to go on
(GPU_CHECK_CPU=1), runs the parts it is given with the command lines it gives the benchmarks (which
parse them and exit 0 without a card), in a tree that arrives without .git."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the script runs for real")


def _run(args: list[str], env: dict[str, str], cwd: Path, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    # python3 on PATH is this interpreter, as on the GPU machine (its own python3 with torch)
    bin_dir = Path(sys.executable).parent
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_") and k != "OUT"}
    full_env = {**base, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(script), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=300)


def test_the_shell_scripts_parse() -> None:
    for script in ("gpu_check.sh", "gpu_wheels.sh"):
        done = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_every_file_the_check_runs_exists() -> None:
    named = set(re.findall(r"\b((?:tests|benchmarks)/[\w/]+\.py)\b", SCRIPT.read_text()))
    assert {"benchmarks/gpu.py", "benchmarks/gpu_loop.py", "tests/test_paper_profile.py"} <= named
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []


@pytest.mark.parametrize("env, message", [
    ({"GPU_CHECK_SECONDS": "9m"}, "GPU_CHECK_SECONDS must be a whole number"),
    ({"GPU_CHECK_PARTS": "tests benchmark"}, "no part 'benchmark'"),
])
def test_bad_settings_are_refused_before_anything_runs(tmp_path: Path, env: dict, message: str) -> None:
    done = _run([str(tmp_path / "out")], env, tmp_path)
    assert done.returncode == 1 and message in done.stderr
    assert not (tmp_path / "out" / "env.txt").exists()


@NO_CUDA
def test_without_cuda_it_stops_at_once_and_says_why(tmp_path: Path) -> None:
    done = _run(["out"], {}, tmp_path)  # a relative folder: relative to where it was started
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert done.returncode == 2, done.stdout + done.stderr
    assert summary.startswith("NO CUDA") and "stopped" in summary and "rc=" not in summary
    assert "torch" in (tmp_path / "out" / "env.txt").read_text()


@NO_CUDA
def test_told_to_go_on_it_runs_the_parts_given_in_a_tree_without_git(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for folder in ("lib", "benchmarks"):
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "scripts").mkdir()
    shutil.copy2(SCRIPT, tree / "scripts" / SCRIPT.name)
    out = tmp_path / "out"
    done = _run([], {"OUT": str(out), "GPU_CHECK_CPU": "1", "GPU_CHECK_PARTS": "bench loop"}, tmp_path,
                tree / "scripts" / SCRIPT.name)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (out / "summary.txt").read_text().splitlines()
    assert lines[0].startswith("NO CUDA")
    assert "tests not selected (GPU_CHECK_PARTS)" in lines and "paper_profile not selected (GPU_CHECK_PARTS)" in lines
    # the benchmarks took their command lines (argparse) and said there is no card to measure
    assert [line.split(" seconds=")[0] for line in lines if " rc=" in line] == ["bench rc=0", "loop rc=0"]
    assert "no CUDA device here" in (out / "bench.jsonl").read_text() + (out / "loop.jsonl").read_text()
    assert lines[-1].startswith("total seconds=")
    # the tree was made a git repository of one commit, the script's own files in it
    files = subprocess.run(["git", "ls-files"], cwd=tree, capture_output=True, text=True, check=True).stdout
    assert "scripts/gpu_check.sh" in files.split()
