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

A worker that dies (killed, out of host memory) or fails for the host's sake (/dev/shm full) costs
nothing but speed: the feed says so once and collates in the training process from then on. The
workers ignore SIGINT (Ctrl-C reaches the whole process group; the training process stops them
itself) but not SIGTERM: that is how a broken pool stops the other workers, and one that ignored it
would never be joined (the pool's thread would block, and with it the training process, at its next
batch on Python >= 3.12 and at its exit on 3.11). A pre-empted run that loses its workers to the
same SIGTERM finishes its update and saves all the same (lib/train/loop.py). They leave when the
training process does, however it ended.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
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
#: The host's GPUs, set by lib.train.distributed.launch for the torchrun workers it starts, which see only
#: the GPUs they claimed (CUDA_VISIBLE_DEVICES) while the host's other GPUs train runs side by side.
HOST_GPUS_ENV = "LOCALITY_ST_HOST_GPUS"


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
    gpus = int(os.environ.get(HOST_GPUS_ENV) or 0) or torch.cuda.device_count()
    per_gpu = cores // max(1, gpus)
    return max(0, min(MAX_AUTO_WORKERS, per_gpu - CORES_KEPT))


def _collate_job(dataset: Any, specaugment: SpecAugmentConfig | None, pad_frames_to: int, pad_tokens_to: int,
                 job: BatchJob) -> Batch:
    return collate(dataset, list(job.indices), specaugment=specaugment,
                   generator=torch.Generator().manual_seed(job.seed),
                   pad_frames_to=pad_frames_to, pad_tokens_to=pad_tokens_to)


_WORKER_ARGS: tuple | None = None  # a worker process's dataset and collation settings


def _init_worker(payload: bytes, parent: int) -> None:
    """A worker process's start: one torch thread (n workers share the host), Ctrl-C left to the
    training process (SIGTERM is not ignored: module docstring), and an exit as soon as the training
    process is gone (a killed parent leaves the task queue open, and the worker would wait on it
    forever)."""
    global _WORKER_ARGS
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # ``parent``: the training process's pid as it gave it, not os.getppid() read here: a training
    # process killed while this worker started (importing torch, unpickling the dataset: seconds,
    # and the moment n copies of the dataset push the host's memory up) would be missed for good
    _WORKER_ARGS = pickle.loads(payload)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
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
        self._broken = False
        if prefetch and workers > 0:
            # spawn, not fork: the training process has threads (and CUDA), which a fork would copy
            # half-way. The dataset (every manifest row and target)
            # is pickled once here, not once per worker in the training loop's thread as each worker
            # starts (~1 s each)
            try:
                payload = pickle.dumps(self._args, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001 (a dataset that does not pickle: the thread alone)
                say(f"data_workers: the training set cannot go to worker processes ({e}); collating in "
                    f"the training process")
                self._broken = True
            else:
                self._procs = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_init_worker, initargs=(payload, os.getpid()))
        self.workers = workers if self._procs is not None else 0
        self._ahead: tuple[Any, Future] | None = None
        self._closing = False
        self._lock = threading.Lock()

    def _gather(self, jobs: Sequence[BatchJob], futures: Sequence[Future | None]) -> list[Batch]:
        out = []
        for job, future in zip(jobs, futures):
            if self._closing:  # close(): nobody will read these batches
                return []
            batch = None
            if future is not None:
                try:
                    batch = future.result()
                except CancelledError:  # cancelled by close(), or when another batch found the workers gone
                    if self._closing:
                        return []
                except Exception as e:  # noqa: BLE001
                    # a dead worker (BrokenProcessPool), or one that failed for the host's sake (/dev/shm
                    # full: "unable to write to file </torch_...>", too many open files, out of memory):
                    # collate here from now on; an error of the data itself comes again, from here
                    self._lose_workers(e)
            if batch is None:
                batch = _collate_job(*self._args, job)
            out.append(batch.pin_memory() if self.pin else batch)
        return out

    def _lose_workers(self, error: BaseException) -> None:
        """Called from the gathering thread and from the training process's thread alike."""
        with self._lock:
            first, self._broken = not self._broken, True
            procs, self._procs = self._procs, None
        if first:
            what = "died" if isinstance(error, BrokenProcessPool) else f"failed ({type(error).__name__})"
            self._say(f"data_workers: a worker process {what} ({error}); collating in the training process "
                      f"from now on")
        if procs is not None:
            # Stop the other workers outright: the pool is dropped, and a worker that would outlive a
            # SIGTERM (the pool's way to stop them) would leave the pool's thread joining it, holding
            # the pool's shutdown lock (Python >= 3.12), which shutdown() below takes.
            for p in list((getattr(procs, "_processes", None) or {}).values()):
                try:
                    p.kill()
                except (OSError, ValueError, AttributeError):  # gone already, or closed
                    pass
            procs.shutdown(wait=False, cancel_futures=True)

    def _start(self, jobs: Sequence[BatchJob]) -> Future:
        assert self._thread is not None
        futures: list[Future | None] = [None] * len(jobs)
        procs = self._procs
        if procs is not None:
            try:
                futures = [procs.submit(_collate_in_worker, job) for job in jobs]
            except Exception as e:  # noqa: BLE001 (broken, shut down by _lose_workers, or a worker that
                # could not start: the dataset does not pickle, no memory or processes left)
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
        with self._lock:  # the gathering thread may drop the pool at the same time (_lose_workers)
            procs, self._procs = self._procs, None
        if procs is not None:
            procs.shutdown(wait=False, cancel_futures=True)
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
