"""The benchmarks that read the pipeline's prepared data or params.yaml, run where there is none (a fresh clone)
or where params.yaml is not YAML: one ``error:`` line naming the input and exit code 1 (lib/cli.py's
run_tool), not a traceback from lib/data/dataset.py or lib/params."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.tool_tree import BROKEN_PARAMS, one_error_line, run_in, tool_tree

NO_DATA = "data/prepared/en-de/train.tsv: no such manifest (run the prepare stage first)"


@pytest.mark.parametrize("argv, params, says", [
    (["benchmarks/train_real_batches.py", "--updates", "1", "--no-decode", "--tasks", "asr"], None, NO_DATA),
    (["benchmarks/train_real_batches.py", "--updates", "1", "--no-decode", "--tasks", "asr"], BROKEN_PARAMS,
     "params.yaml: not valid YAML"),
    (["benchmarks/parallel_runs.py", "--updates", "1", "--runs", "1", "--tasks", "asr"], None, NO_DATA),
    (["benchmarks/smoothing_speed.py", "--reps", "1"], BROKEN_PARAMS, "params.yaml: not valid YAML"),
    (["benchmarks/head_selection_speed.py", "--reps", "1"], BROKEN_PARAMS, "params.yaml: not valid YAML"),
])
def test_a_missing_or_broken_input_is_one_line(tmp_path: Path, argv: list[str], params, says: str) -> None:
    root = tool_tree(tmp_path, "benchmarks", params)
    assert says in one_error_line(run_in(root, *argv))
