"""scripts/same_outputs.py: which outputs of two revisions differ (the pipeline runs are its own job)."""
from __future__ import annotations

import sys

from tests.dvc_repo import REPO

sys.path.insert(0, str(REPO / "scripts"))

import same_outputs  # noqa: E402


def test_compare_names_what_differs_and_ignores_wall_seconds() -> None:
    a = {"metrics/x.json": "1", "runs/a/model.pt": "2", "runs/a/timing.json": "3", "only/a": "4"}
    b = {"metrics/x.json": "1", "runs/a/model.pt": "9", "runs/a/timing.json": "8", "only/b": "5"}
    assert same_outputs.compare(a, b) == ["only/a: only in the first revision", "only/b: only in the second revision",
                                          "runs/a/model.pt: 2 != 9"]
    assert same_outputs.compare(a, dict(a)) == []


def test_a_revision_that_is_no_commit_stops_before_any_pipeline_runs(capsys) -> None:
    """Both revisions are checked first: a typo in the second used to surface, after the first revision's
    tiny pipeline had run for minutes, as git's CalledProcessError traceback."""
    import pytest

    with pytest.raises(SystemExit, match=r"error: 'no-such-rev' is not a commit of this repository"):
        same_outputs.main(["HEAD", "no-such-rev"])
    assert "running the tiny pipeline" not in capsys.readouterr().out
