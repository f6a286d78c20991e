"""scripts/_venv.py: the pipeline's scripts re-run themselves under the project's venv."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import _venv  # noqa: E402

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _lacking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_venv.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(_venv.shutil, "which", lambda name: None)


def test_nothing_happens_in_a_python_that_has_everything() -> None:
    assert _venv.missing_tools() == []  # the suite runs in the project's venv
    _venv.ensure_project_venv(Path("/nonexistent"))


def test_reruns_under_the_venv_with_its_bin_first_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _lacking(monkeypatch)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.delenv(_venv.REEXEC_FLAG, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setattr(sys, "argv", ["scripts/repro.py", "--dry"])
    calls = []

    class Replaced(Exception):  # os.execv never returns: the process becomes the venv's python
        pass

    def execv(exe: str, argv: list[str]) -> None:
        calls.append((exe, argv))
        raise Replaced

    monkeypatch.setattr(_venv.os, "execv", execv)
    with pytest.raises(Replaced):
        _venv.ensure_project_venv(tmp_path)
    assert calls == [(str(python), [str(python), "scripts/repro.py", "--dry"])]
    assert os.environ["PATH"] == f"{python.parent}{os.pathsep}/usr/bin"
    assert os.environ[_venv.REEXEC_FLAG] == "1"


def test_without_a_venv_the_error_names_what_is_missing_and_the_setup(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _lacking(monkeypatch)
    monkeypatch.delenv(_venv.REEXEC_FLAG, raising=False)
    with pytest.raises(SystemExit, match=r"lacks torch, dvc, a `dvc` command on PATH, and there is no .*\.venv\. "
                                         r"Set up the project's venv with `bash scripts/setup.sh`"):
        _venv.ensure_project_venv(tmp_path)


def test_a_venv_that_lacks_them_too_stops_instead_of_looping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _lacking(monkeypatch)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.setenv(_venv.REEXEC_FLAG, "1")  # already re-run once
    monkeypatch.setattr(_venv.os, "execv", lambda *a: pytest.fail("re-ran again"))
    with pytest.raises(SystemExit, match=r"and so does .*\.venv/bin/python"):
        _venv.ensure_project_venv(tmp_path)


def test_repro_started_by_a_bare_python_runs_under_the_venv() -> None:
    """End to end: the system's python (no torch, no dvc, no venv on PATH) starting scripts/repro.py
    --help ends in the venv's python (argparse's help printed, a note on stderr)."""
    bare = Path("/usr/bin/python3")
    venv_python = SCRIPTS.parent / ".venv" / "bin" / "python"
    if not bare.exists() or not venv_python.exists():
        pytest.skip("needs /usr/bin/python3 and the project's .venv")
    done = subprocess.run([str(bare), str(SCRIPTS / "repro.py"), "--help"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}, timeout=120)
    if "note:" not in done.stderr:  # the system's python3 has torch and dvc itself: nothing to show
        pytest.skip("/usr/bin/python3 has torch and dvc")
    assert done.returncode == 0, done.stderr
    assert "running under the project's venv" in done.stderr
    assert "stages at a time" in done.stdout
