"""Shared start-up for stage scripts: run from the repo root, import lib/, load params."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lib.params import PAIR_PATTERN, ParamError, Params, load_params  # noqa: E402


def stage_params(argv_pair: str | None = None) -> Params:
    """Load and validate params.yaml from the repo root; exit with the key's name on a bad value.

    The pair comes from the command line (dvc.yaml's matrix over ``pairs``); it is checked for its
    form only, so that a stage reads -- and dvc.yaml lists -- no more params than it uses (a stage of
    one pair must not rerun because another pair was added to ``pairs``)."""
    try:
        params = load_params(ROOT / "params.yaml")
    except ParamError as e:
        sys.exit(f"error: {e}")
    if argv_pair is not None and not PAIR_PATTERN.match(argv_pair):
        sys.exit(f"error: {argv_pair!r} is not a language pair like 'en-de'")
    return params
