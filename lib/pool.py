"""Worker pools for the CPU-bound data stages (``corpus``, ``prepare``): ordered results, bounded
memory, and failures that end the stage instead of hanging it.

Why not ``multiprocessing.Pool``: when a worker is killed (the out-of-memory killer sends
SIGKILL), ``Pool`` quietly starts a replacement and the task the dead worker held is lost, so
the parent waits for its result forever. :class:`concurrent.futures.ProcessPoolExecutor` instead
marks the pool broken and fails every pending future; :func:`ordered_results` turns that into a
:class:`WorkerDied` error saying which worker died and how.

Workers ignore SIGINT (:func:`ignore_sigint`, run by :func:`worker_pool` before the caller's
initializer): Ctrl-C in a terminal reaches the whole process group, and only the parent should
react (one message, cleanup), not every worker with its own traceback. On any exception in its
``with`` block, including KeyboardInterrupt, :func:`worker_pool` cancels what is queued and
terminates the workers rather than waiting for the talks they are busy with.

Torch-free on purpose (the ``corpus`` stage does not need torch).
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class WorkerDied(RuntimeError):
    """A pool worker process died (killed by a signal or exited) while holding a task."""


def ignore_sigint() -> None:
    """Worker initializer: leave Ctrl-C (SIGINT to the process group) to the parent process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _init(initializer: Callable[[], None] | None) -> None:
    ignore_sigint()
    if initializer is not None:
        initializer()


def _processes(pool: ProcessPoolExecutor) -> dict[int, Any]:
    """The pool's worker processes by pid (a private attribute of ProcessPoolExecutor, read
    defensively: without it errors just cannot name the pid)."""
    procs = getattr(pool, "_processes", None)
    return dict(procs) if isinstance(procs, dict) else {}


@contextmanager
def worker_pool(workers: int, start_method: str,
                initializer: Callable[[], None] | None = None) -> Iterator[ProcessPoolExecutor]:
    """A process pool of ``workers`` processes whose workers ignore SIGINT and run
    ``initializer`` (module-level, so any start method works). On an exception in the block the
    queued tasks are cancelled and the workers terminated (no waiting for busy workers)."""
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context(start_method), initializer=_init,
                               initargs=(initializer,))
    try:
        yield pool
    except BaseException:
        procs = _processes(pool)
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs.values():
            if p.is_alive():
                p.terminate()
        for p in procs.values():
            p.join(10)
        raise
    pool.shutdown(wait=True)


def _death(procs: dict[int, Any]) -> str:
    """How the worker that broke the pool died, from the exit codes of the known workers (the
    pool terminates the survivors with SIGTERM once one has died, so SIGTERM ranks last)."""
    dead = []
    for pid, p in procs.items():
        code = p.exitcode
        if code is not None and code != 0:
            dead.append((code == -signal.SIGTERM, pid, code))
    if not dead:
        return "died"
    _, pid, code = min(dead)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        how = f"(pid {pid}) died with {name}"
        if -code == signal.SIGKILL:
            how += ", probably killed by the out-of-memory killer"
        return how
    return f"(pid {pid}) exited with code {code}"


def ordered_results(pool: ProcessPoolExecutor, fn: Callable[[T], R], items: Iterable[T], max_in_flight: int,
                    what: str = "a worker", hint: str = "") -> Iterator[R]:
    """``fn(item)`` for each item, in item order, with at most ``max_in_flight`` items submitted
    and not yet consumed (memory bounded by a few results, not the whole input).

    ``fn`` must be picklable (module-level). An exception raised by ``fn`` is re-raised as is; a
    dead worker raises :class:`WorkerDied`: ``"<what> (pid N) died with SIGKILL, probably killed
    by the out-of-memory killer; <hint>"``."""
    it = iter(items)
    pending: deque[Future] = deque()
    procs: dict[int, Any] = {}
    try:
        for item in it:
            pending.append(pool.submit(fn, item))
            if len(pending) >= max_in_flight:
                break
        procs.update(_processes(pool))
        while pending:
            result = pending.popleft().result()
            nxt = next(it, _END)
            if nxt is not _END:
                pending.append(pool.submit(fn, nxt))
                procs.update(_processes(pool))
            yield result
    except BrokenProcessPool:
        # The pool reaps the dead worker and terminates the survivors in its own thread: wait
        # (briefly) for the exit codes, which tell who died first and how.
        until = time.monotonic() + 5
        while any(p.exitcode is None for p in procs.values()) and time.monotonic() < until:
            time.sleep(0.02)
        msg = f"{what} {_death(procs)}"
        raise WorkerDied(f"{msg}; {hint}" if hint else msg) from None
    finally:
        for f in pending:
            f.cancel()


_END = object()
