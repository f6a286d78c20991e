"""scripts/params_profile.py: switching params.yaml to a profile keeps the user's own, edits included, and
puts it back in one command."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts/params_profile.py"


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=root, capture_output=True, text=True)


def test_switch_keeps_the_users_params_and_restore_puts_them_back(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles/paper.yaml").write_text("model:\n  size: s\n")
    mine = "model:\n  size: tiny  # an uncommitted edit of mine\n"
    (tmp_path / "params.yaml").write_text(mine)
    proc = _run(tmp_path, "paper")
    assert proc.returncode == 0 and "params.yaml is now profiles/paper.yaml" in proc.stdout, proc.stderr
    assert (tmp_path / "params.yaml").read_text() == "model:\n  size: s\n"
    assert (tmp_path / "params.before-profile.yaml").read_text() == mine
    (tmp_path / "params.yaml").write_text("model:\n  size: s\ndata:\n  mustc_root: /x\n")  # dvc exp run -S ...
    proc = _run(tmp_path, "paper")  # a second switch would overwrite the kept file: refused
    assert proc.returncode == 1 and "--restore` first" in proc.stderr
    assert (tmp_path / "params.before-profile.yaml").read_text() == mine
    proc = _run(tmp_path, "--restore")
    assert proc.returncode == 0 and (tmp_path / "params.yaml").read_text() == mine
    assert not (tmp_path / "params.before-profile.yaml").exists()
    proc = _run(tmp_path, "--restore")
    assert proc.returncode == 1 and "no params.before-profile.yaml to restore" in proc.stderr
    proc = _run(tmp_path, "papr")
    assert proc.returncode == 1 and "no profile 'papr' in profiles/ (have: paper)" in proc.stderr
    assert (tmp_path / "params.yaml").read_text() == mine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "profiles"]  # no temporary left
