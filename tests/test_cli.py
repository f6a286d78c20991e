"""lib/cli.py: a tool's missing or damaged input ends it with one line and exit code 1 (as run_stage ends a
stage); any other error keeps its traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

_TOOL = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from lib.cli import run_tool

def main():
    kind = sys.argv[1]
    if kind == "missing":
        raise FileNotFoundError("data/prepared/en-de/train.tsv: no such manifest (run the prepare stage first)")
    if kind == "damaged":
        from lib.io import read_json
        read_json(sys.argv[2], "train_baseline@en-de-1")
    if kind == "params":
        from lib.params import load_params
        load_params(sys.argv[2])
    if kind == "bug":
        raise KeyError("a bug")
    return 3 if kind == "three" else None

run_tool(main)
"""


@pytest.mark.parametrize("kind, says", [
    ("missing", "error: data/prepared/en-de/train.tsv: no such manifest (run the prepare stage first)"),
    ("damaged", "m.json: not valid JSON"),
    ("params", "params.yaml: not valid YAML: line 2, column 6"),
])
def test_an_input_error_is_one_line_and_exit_code_1(tmp_path: Path, kind: str, says: str) -> None:
    (tmp_path / "m.json").write_text('{"bleu": 8')
    (tmp_path / "params.yaml").write_text("pairs: [en-de\nseeds: [1]\n")
    arg = str(tmp_path / ("m.json" if kind == "damaged" else "params.yaml"))
    proc = subprocess.run([sys.executable, "-c", _TOOL, kind, arg], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines


def test_a_bug_keeps_its_traceback_and_the_return_value_is_the_exit_code() -> None:
    bug = subprocess.run([sys.executable, "-c", _TOOL, "bug"], capture_output=True, text=True, timeout=60)
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "KeyError: 'a bug'" in bug.stderr
    for kind, code in (("none", 0), ("three", 3)):
        assert subprocess.run([sys.executable, "-c", _TOOL, kind], capture_output=True, timeout=60).returncode == code
