"""A wall-clock limit for one block of a test, without a pytest plugin: a test that would hang
(a lost task in a process pool) fails with ``DeadlineExceeded`` instead."""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class DeadlineExceeded(AssertionError):
    """The block ran past its deadline (raised in the main thread by SIGALRM)."""


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raise :class:`DeadlineExceeded` if the block runs longer than ``seconds`` (main thread only)."""
    def _expired(signum, frame):
        raise DeadlineExceeded(f"still running after {seconds} s (hung?)")

    old = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
