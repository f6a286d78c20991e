"""Suite-wide settings."""
from __future__ import annotations

import os
import tempfile


def pytest_configure(config) -> None:
    # Machine-level measurements (lib/train/precision.py's `amp: probe` probe) go to a fresh folder per
    # test session, inherited by the `dvc repro` subprocesses: the suite neither reads nor
    # writes the user's ~/.cache/locality-st, and every run of one session sees the same answer.
    os.environ["LOCALITY_ST_CACHE"] = tempfile.mkdtemp(prefix="locality-st-cache-")
