"""The ``__main__`` of a tool beside the stages (scripts/, benchmarks/): a missing, truncated or malformed
input ends it with one line and exit code 1, as ``stages/_common.run_stage`` ends a stage.

    if __name__ == "__main__":
        run_tool(main)

The errors caught are the ones whose message already names the file or key and what to do:
FileNotFoundError (a tool run before the stage that writes its input: ``data/prepared/<pair>/train.tsv:
no such manifest (run the prepare stage first)``), :class:`lib.io.InputError` (a damaged pipeline
output) and :class:`lib.params.ParamError` (params.yaml). Anything else keeps its traceback: it is a bug
to report, not an input to fix.
"""
from __future__ import annotations

import sys
from typing import Callable, NoReturn

from lib.io import InputError
from lib.params import ParamError

INPUT_ERRORS = (InputError, ParamError, FileNotFoundError)


def run_tool(main: Callable[[], int | None]) -> NoReturn:
    """Call ``main`` and exit with what it returns (None: 0); an input error (:data:`INPUT_ERRORS`) is
    printed as ``error: <message>`` on stderr, and the exit code is 1."""
    try:
        code = main()
    except INPUT_ERRORS as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    sys.exit(code)
