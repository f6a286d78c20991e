"""Shared start-up for stage scripts: run from the repo root, import lib/, load params, and turn
SIGTERM into a clean, one-line exit (:func:`run_stage`)."""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lib.io import InputError  # noqa: E402
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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so the same cleanups run; ``signum`` tells
    :func:`run_stage` which exit code to use."""

    signum = signal.SIGTERM


_main_pid: int | None = None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Raise :class:`Terminated` in the stage's own process; die as by default anywhere else.

    Python runs handlers in the main thread of the process that installed them -- and of every
    process forked from it, which inherits the handler: multiprocessing pool workers (corpus,
    prepare) and DataLoader workers. Those are stopped with SIGTERM by their parent
    (``Pool.terminate``) and own no output; raising there would print a traceback per worker and
    could keep a worker alive in a ``finally`` its parent no longer waits for. So only the pid that
    called :func:`run_stage` raises; the others restore the default action and re-send the signal."""
    if os.getpid() != _main_pid:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Terminated()


def install_sigterm_handler() -> bool:
    """Handle SIGTERM -- the default of ``kill``, ``timeout``, torchrun and batch schedulers --
    like Ctrl-C, so that ``finally`` / ``except BaseException`` cleanups run (lib/io.py's atomic
    writers remove their temporaries, checkpoint saves leave no ``.last.pt.tmp-*``) instead of the
    process vanishing mid-write. Without a handler SIGTERM ends Python at once, running nothing.

    Only from the main thread (``signal.signal`` refuses any other, and the handler runs there
    anyway); returns whether it was installed. A signal that arrives inside a long C call (a big
    torch op, a blocking collective) is handled when that call returns."""
    global _main_pid
    if threading.current_thread() is not threading.main_thread():
        return False
    _main_pid = os.getpid()
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def run_stage(main: Callable[[], None]) -> None:
    """Run a stage's ``main`` with SIGTERM handled like Ctrl-C; an interrupt ends the process with
    one line on stderr and exit code 128 + signal (130 for SIGINT, 143 for SIGTERM, the shell's
    convention) instead of a traceback: the cleanups have run, there is nothing to debug. An input
    file that cannot be read (:class:`lib.io.InputError`: a truncated JSON or checkpoint) ends it with
    its one line and exit code 1, as do a missing input (FileNotFoundError: a stage run by hand before
    the stage that writes its input) and a :class:`lib.params.ParamError` raised while the stage runs
    (a setting its data cannot meet, e.g. a train set too small for one update).

    Called under ``if __name__ == "__main__":`` only, so a process that re-imports the script
    (multiprocessing's spawn start method) never installs the handler."""
    install_sigterm_handler()
    try:
        main()
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        name = signal.Signals(signum).name
        script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] not in ("", "-c") else "stage"
        # a training run pre-empted by SIGTERM says where its state is (lib.train.resume.Preempted)
        print(f"error: {script}: {e}" if str(e) else
              f"error: {script} interrupted by {name}; partial outputs removed (rerun to redo or resume)",
              file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    except (InputError, ParamError, FileNotFoundError) as e:  # a truncated, malformed or missing input
        # file, or a setting that cannot work (found only once the run sees its data): the message names
        # the file or key and, where the library knows it, the stage that writes the file
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
