"""The training batches of each update, collated ahead of the step (``train_*.data_workers``).

:class:`UpdateFeed` hands the loop the batches of one update, one :class:`BatchJob` each (the
utterances of a batch and the seed of its SpecAugment draws), in one of three ways:

- **in the training process**, when asked: no prefetch (the default on a CPU, so that a CPU run's
  bits never move);
- **in one background thread** (prefetch, ``data_workers`` 0): the next update's batches while this
  update runs;
- **in worker processes** (prefetch, ``data_workers`` n > 0): each batch in one of n spawned
  processes with one torch thread each, the next update's batches side by side; a background thread
  gathers them and pins them for asynchronous copies to the card. On a GPU the thread alone could
  not keep up: on an H200 one update's collation (memory-mapped reads, CMVN, SpecAugment of some
  300k frames) took longer in one thread than the folded update's forward and backward
  (docs/gpu.md, "Measured figures"), and the thread shares the interpreter with the step.

Every way gives the same batches in the same order: a batch's SpecAugment draws come from a
generator seeded by its place, never from a global one. Their values are the same to the last bit
where the training process would collate on one thread; with more threads, utterance CMVN's float64
sums are split differently, which moves values by float rounding (lib/data/features.py).

A worker that dies (killed, out of host memory) costs nothing but speed: the feed says so once and
collates in the training process from then on. The workers ignore SIGINT and SIGTERM, so that a
pre-empted run finishes its update and saves (lib/train/loop.py), and leave when the training
process does, however it ended.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from lib.data.dataset import Batch, SpecAugmentConfig, collate

#: ``data_workers: auto`` on CUDA: the host's cores per visible GPU less these (the training process
#: and its gathering thread), at most :data:`MAX_AUTO_WORKERS`.
CORES_KEPT = 2
MAX_AUTO_WORKERS = 8


@dataclass(frozen=True)
class BatchJob:
    """One training batch to collate: its utterances (indices into the dataset) and its seed."""

    indices: tuple[int, ...]
    seed: int


def resolve_data_workers(value: int | str, device: torch.device) -> int:
    """The worker processes a run collates with: an integer as given; ``auto``: on CUDA the host's
    cores per visible GPU less :data:`CORES_KEPT`, at most :data:`MAX_AUTO_WORKERS` (0: the thread
    alone), on a CPU 0 (a CPU run collates in its own process)."""
    if value != "auto":
        return int(value)
    if device.type != "cuda":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_gpu = cores // max(1, torch.cuda.device_count())
    return max(0, min(MAX_AUTO_WORKERS, per_gpu - CORES_KEPT))


def _collate_job(dataset: Any, specaugment: SpecAugmentConfig | None, pad_frames_to: int, pad_tokens_to: int,
                 job: BatchJob) -> Batch:
    return collate(dataset, list(job.indices), specaugment=specaugment,
                   generator=torch.Generator().manual_seed(job.seed),
                   pad_frames_to=pad_frames_to, pad_tokens_to=pad_tokens_to)


_WORKER_ARGS: tuple | None = None  # a worker process's dataset and collation settings


def _init_worker(*args: Any) -> None:
    """A worker process's start: one torch thread (n workers share the host), signals left to the
    training process, and an exit as soon as the training process is gone (a killed parent leaves
    the task queue open, and the worker would wait on it forever)."""
    global _WORKER_ARGS
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _WORKER_ARGS = args
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _collate_in_worker(job: BatchJob) -> Batch:
    assert _WORKER_ARGS is not None, "a feed worker was not initialised"
    return _collate_job(*_WORKER_ARGS, job)


class UpdateFeed:
    """The batches of each update for the training loop (module docstring).

    ``get(key, jobs)`` returns the batches of ``jobs`` (those prefetched under ``key`` when
    ``prefetch(key, jobs)`` was called for it last, else collated now); ``prefetch(key, jobs)`` starts
    collating the next update's batches (a no-op without prefetch); ``close()`` stops the workers and
    the thread. ``pin``: the batches are pinned (CUDA), for asynchronous copies."""

    def __init__(self, dataset: Any, *, specaugment: SpecAugmentConfig | None, pad_frames_to: int,
                 pad_tokens_to: int, prefetch: bool, pin: bool, workers: int,
                 say: Callable[[str], None] = print) -> None:
        if workers < 0:
            raise ValueError(f"data_workers must be >= 0 or 'auto', got {workers}")
        self._args = (dataset, specaugment, pad_frames_to, pad_tokens_to)
        self.pin, self._say = pin, say
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="collate") if prefetch else None
        self._procs: ProcessPoolExecutor | None = None
        if prefetch and workers > 0:
            # spawn, not fork: the training process has threads (and CUDA), which a fork would copy
            # half-way; the dataset travels to each worker once, pickled
            self._procs = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                              initializer=_init_worker, initargs=self._args)
        self.workers = workers if self._procs is not None else 0
        self._ahead: tuple[Any, Future] | None = None
        self._broken = self._closing = False

    def _gather(self, jobs: Sequence[BatchJob], futures: Sequence[Future | None]) -> list[Batch]:
        out = []
        for job, future in zip(jobs, futures):
            if self._closing:  # close(): nobody will read these batches
                return []
            batch = None
            if future is not None:
                try:
                    batch = future.result()
                except BrokenProcessPool as e:
                    self._lose_workers(e)
                except CancelledError:  # cancelled when another batch found the workers gone
                    pass
            if batch is None:
                batch = _collate_job(*self._args, job)
            out.append(batch.pin_memory() if self.pin else batch)
        return out

    def _lose_workers(self, error: BaseException) -> None:
        if not self._broken:
            self._broken = True
            self._say(f"data_workers: a worker process died ({error}); collating in the training process from now on")
        procs, self._procs = self._procs, None
        if procs is not None:
            procs.shutdown(wait=False, cancel_futures=True)

    def _start(self, jobs: Sequence[BatchJob]) -> Future:
        assert self._thread is not None
        futures: list[Future | None] = [None] * len(jobs)
        procs = self._procs
        if procs is not None:
            try:
                futures = [procs.submit(_collate_in_worker, job) for job in jobs]
            except (BrokenProcessPool, RuntimeError) as e:  # broken, or shut down by _lose_workers
                self._lose_workers(e)
                futures = [None] * len(jobs)
        return self._thread.submit(self._gather, jobs, futures)

    def get(self, key: Any, jobs: Sequence[BatchJob]) -> list[Batch]:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == key:
            return ahead[1].result()
        if self._thread is None:
            return self._gather(jobs, [None] * len(jobs))
        return self._start(jobs).result()

    def prefetch(self, key: Any, jobs: Sequence[BatchJob]) -> None:
        if self._thread is not None:
            self._ahead = (key, self._start(jobs))

    def close(self) -> None:
        self._ahead, self._closing = None, True
        if self._procs is not None:
            self._procs.shutdown(wait=False, cancel_futures=True)
            self._procs = None
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
