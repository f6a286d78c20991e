"""Run the pipeline's own scripts under the project's virtualenv even when it is not activated.

``make repro`` puts ``.venv/bin`` first on PATH; a user who runs ``python scripts/repro.py`` or
``python scripts/time_repro.py`` in a fresh shell after ``bash scripts/setup.sh`` gets whatever
``python`` the shell has, without torch or dvc, and used to see a ``ModuleNotFoundError`` from deep
inside the library. :func:`ensure_project_venv` re-runs the script under ``.venv/bin/python`` with
``.venv/bin`` first on PATH (so the ``dvc`` it starts is the venv's), or stops with the set-up
command when there is no venv. Torch-free and cheap: ``importlib.util.find_spec`` imports nothing.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

REEXEC_FLAG = "LOCALITY_ST_VENV_REEXEC"  # set before re-running: never loop


def missing_tools() -> list[str]:
    """What this Python lacks of what the pipeline's scripts need: the torch and dvc packages, and
    a ``dvc`` command on PATH (the stages run as ``dvc repro`` subprocesses)."""
    missing = [name for name in ("torch", "dvc") if importlib.util.find_spec(name) is None]
    if shutil.which("dvc") is None:
        missing.append("a `dvc` command on PATH")
    return missing


def ensure_project_venv(repo: Path) -> None:
    """Return when this Python has what the pipeline needs; else re-run this process's command line
    under ``<repo>/.venv/bin/python`` (``.venv/bin`` first on PATH), or exit naming the set-up step."""
    missing = missing_tools()
    if not missing:
        return
    python = Path(repo) / ".venv" / "bin" / "python"
    if python.exists() and os.environ.get(REEXEC_FLAG) != "1":
        os.environ[REEXEC_FLAG] = "1"
        os.environ["PATH"] = f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        os.environ["VIRTUAL_ENV"] = str(python.parent.parent)
        print(f"note: {sys.executable} lacks {', '.join(missing)}; running under the project's venv "
              f"({python})", file=sys.stderr, flush=True)
        os.execv(str(python), [str(python), *sys.argv])
    sys.exit(f"error: this Python ({sys.executable}) lacks {', '.join(missing)}"
             + (f", and so does {python}" if python.exists() else f", and there is no {python.parent.parent}")
             + ". Set up the project's venv with `bash scripts/setup.sh` (or run `make repro`), then "
             "`source .venv/bin/activate`.")
