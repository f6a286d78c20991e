"""Shared start-up for stage scripts: run from the repo root, import lib/, load params."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lib.params import ParamError, Params, load_params  # noqa: E402


def stage_params(argv_pair: str | None = None) -> Params:
    """Load params.yaml from the repo root; exit with the key's name on a bad value."""
    try:
        params = load_params(ROOT / "params.yaml")
    except ParamError as e:
        sys.exit(f"error: {e}")
    if argv_pair is not None and argv_pair not in params.pairs:
        sys.exit(f"error: pair {argv_pair!r} is not in params.yaml 'pairs' {params.pairs}")
    return params
