"""A workspace without pipeline outputs for the tools beside the stages (scripts/, benchmarks/), so that a
test can run one as a user runs it in a fresh clone: the tool's folder copied (its ROOT is the copy's
parent), lib/ linked, and a params.yaml (this repository's, or the text given)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BROKEN_PARAMS = "pairs: [en-de, en-es\nseeds: [1]\n"  # an unclosed list: not YAML


def tool_tree(tmp: Path, folder: str, params: str | None = None) -> Path:
    root = tmp / "workspace"
    shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "lib").symlink_to(REPO / "lib")
    (root / "params.yaml").write_text(params if params is not None else (REPO / "params.yaml").read_text(encoding="utf-8"),
                                      encoding="utf-8")
    return root


def run_in(root: Path, script: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python <script> args`` in ``root`` (the venv's python), output captured."""
    return subprocess.run([sys.executable, str(root / script), *args], cwd=root, capture_output=True, text=True,
                          timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line a tool ends with on a bad input (exit 1, no traceback); fails the test otherwise."""
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]
