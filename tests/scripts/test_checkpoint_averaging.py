"""scripts/checkpoint_averaging.py picks the snapshots of each run's last k saves by the save schedule,
and stops naming a missing one before any decoding."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts/checkpoint_averaging.py"


@pytest.fixture(scope="module")
def averaging():
    spec = importlib.util.spec_from_file_location("checkpoint_averaging", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_last_k_saves_of_the_schedule_not_the_newest_files(averaging, tmp_path: Path) -> None:
    snaps = tmp_path / "checkpoints/snapshots"
    snaps.mkdir(parents=True)
    for u in (180, 210, 240, 255, 270):  # 255: a save off the schedule (written by earlier code)
        (snaps / f"update_{u:07d}.pt").write_bytes(b"")
    assert [p.name for p in averaging.snapshots(tmp_path, 30, 270, 3)] == \
        ["update_0000210.pt", "update_0000240.pt", "update_0000270.pt"]
    (snaps / "update_0000240.pt").unlink()
    with pytest.raises(SystemExit, match=r"k = 3 needs the snapshots of .*'s last 3 saves, but .*update_0000240\.pt is missing"):
        averaging.snapshots(tmp_path, 30, 270, 3)
    with pytest.raises(SystemExit, match="its schedule has 2 saves"):
        averaging.snapshots(tmp_path, 200, 270, 3)


@pytest.mark.parametrize("params, says", [
    (None, "data/prepared/en-de/tst-COMMON.tsv: no such manifest (run the prepare stage first)"),
    ("broken", "params.yaml: not valid YAML"),
])
def test_no_prepared_data_or_a_broken_params_file_is_one_line(tmp_path: Path, params, says: str) -> None:
    """Run in a fresh clone (no pipeline outputs) or with a params.yaml that is not YAML: one error line naming
    the input, not a traceback."""
    from tests.tool_tree import BROKEN_PARAMS, one_error_line, run_in, tool_tree

    root = tool_tree(tmp_path, "scripts", BROKEN_PARAMS if params else None)
    assert says in one_error_line(run_in(root, "scripts/checkpoint_averaging.py", "en-de", "--ks", "1"))
