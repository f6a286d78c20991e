"""lib/report/document.py's note on a stale efficiency benchmark: it compares the `own` windows the
benchmark timed (metrics/efficiency.md) with the windows.json its note names, as that file is now."""
from __future__ import annotations

import json
from pathlib import Path

from lib import layout
from lib.report.document import efficiency_windows_note

OWN = "F F F 1 11 1 1 13 13 21 3 13"


def _root(tmp_path: Path, windows: list) -> Path:
    md = tmp_path / layout.EFFICIENCY_MD
    md.parent.mkdir(parents=True)
    md.write_text(f"Configurations:\n\n- `full`: F F F F\n- `own`: {OWN}\n"
                  "- note: own windows from data/windows/en-de/windows.json\n", encoding="utf-8")
    path = tmp_path / "data/windows/en-de/windows.json"
    path.parent.mkdir(parents=True)
    spec = [{"type": "full"} if w == "F" else {"type": "local", "window": w} for w in windows]
    path.write_text(json.dumps({"encoder_attention": spec}), encoding="utf-8")
    return tmp_path


def test_the_note_names_the_timed_and_the_current_windows(tmp_path: Path) -> None:
    same = _root(tmp_path / "same", ["F", "F", "F", 1, 11, 1, 1, 13, 13, 21, 3, 13])
    assert efficiency_windows_note(same) == ""
    other = _root(tmp_path / "other", ["F", "F", "F", 1, 11, 1, 1, 13, 13, 21, 3, 15])
    assert efficiency_windows_note(other) == (
        f"**Stale:** the benchmark below timed `own` windows {OWN}, but data/windows/en-de/windows.json now holds "
        "F F F 1 11 1 1 13 13 21 3 15; rerun the command above.\n")
    (other / "data/windows/en-de/windows.json").unlink()  # nothing to compare with: no note
    assert efficiency_windows_note(other) == "" == efficiency_windows_note(tmp_path / "no-benchmark")


def test_a_damaged_windows_file_is_named(tmp_path: Path) -> None:
    """The windows file the benchmark's note names, truncated: an InputError naming it and select_windows
    (the report stage prints it as one line), not a bare 'Expecting value' without a file."""
    import pytest

    from lib.io import InputError

    root = _root(tmp_path, ["F", "F", "F", 1, 11, 1, 1, 13, 13, 21, 3, 13])
    path = root / "data/windows/en-de/windows.json"
    path.write_text(path.read_text(encoding="utf-8")[:30], encoding="utf-8")
    with pytest.raises(InputError, match=r"windows\.json: not valid JSON .*select_windows"):
        efficiency_windows_note(root)
