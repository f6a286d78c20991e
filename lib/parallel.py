"""Runs side by side on a CPU: how many (``parallel.jobs``) and how many threads each.

DVC runs one stage at a time. On a 2-core CPU one demo training run does not keep both cores busy:
its many small kernels (d = 128) and the Python between them scale poorly past one thread.
Measured on the project's 2-core AMD EPYC (``python benchmarks/parallel_runs.py --tasks st
--updates 80``): two ST runs side by side with one thread each finish 1.35x (fp32) and 1.43x (bf16)
sooner than the same two runs one after the other with two threads each. So ``scripts/repro.py``
(``make repro``) runs independent stages (the 30 ST runs, the three ASR forks, the per-pair
analyses) ``parallel.jobs`` at a time, and every training run of a per-pair or per-seed stage
uses ``cores // jobs`` threads.

The thread count is a function of the params and the machine, never of how the stage was started:
the same run trained with one thread or with two differs in the last bits (oneDNN splits its
work differently), so a run started by a plain ``dvc repro`` (one stage at a time) uses the same
threads as under ``scripts/repro.py`` and gives the same metrics, only slower. The one shared ASR
model (and its one shared fork) trains alone and keeps every core.

Torch is imported lazily: ``scripts/repro.py`` and the params loader must not need it.
"""
from __future__ import annotations

import os
from pathlib import Path

MAX_AUTO_JOBS = 8  # more runs side by side than this buys little and costs memory (≈ 1-2 GB each)


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_jobs(jobs: int | str, *, cuda: bool | None = None, processes_per_run: int = 1) -> int:
    """``parallel.jobs`` as a number: an integer as given; ``auto`` -> with CUDA the number of visible
    GPUs over ``processes_per_run`` (``train_st.processes``: one run per GPU, or per that many; each
    run claims its own, :func:`claim_gpu`), else the number of cores, at most :data:`MAX_AUTO_JOBS`
    either way. ``cuda=None`` asks torch."""
    if jobs != "auto":
        return int(jobs)
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if cuda:
        import torch

        return max(1, min(MAX_AUTO_JOBS, torch.cuda.device_count() // max(1, processes_per_run)))
    return min(MAX_AUTO_JOBS, available_cores())


_claims: list = []  # the open lock files of this process's GPU claims: released when it exits


def claim_gpu(keys: list[str], lock_dir: Path) -> int | None:
    """The index of the first GPU (``keys``: one stable name per visible GPU, e.g. its UUID) that no
    other process holds, claimed for the life of this process (an exclusive ``flock`` on
    ``lock_dir/gpu-<key>.lock``, which the system drops when the process ends, killed or not). None
    when every GPU is held. So runs started side by side by any means (``make repro`` with
    ``parallel.jobs`` = the GPUs, ``dvc queue start -j N``, several shells) each train on a GPU of
    their own instead of all on the first."""
    import fcntl

    lock_dir.mkdir(parents=True, exist_ok=True)
    for i, key in enumerate(keys):
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in str(key))
        f = open(lock_dir / f"gpu-{safe}.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        _claims.append(f)
        return i
    return None


def claim_gpus(keys: list[str], lock_dir: Path, n: int) -> list[int] | None:
    """``n`` GPUs claimed as by :func:`claim_gpu` (for one run in ``n`` processes), their indices in
    ``keys``; None, with nothing claimed, when fewer than ``n`` are free."""
    held = len(_claims)
    got: list[int] = []
    free = list(range(len(keys)))
    while len(got) < n:
        i = claim_gpu([keys[j] for j in free], lock_dir)
        if i is None:
            for f in _claims[held:]:  # release the partial claim
                f.close()
            del _claims[held:]
            return None
        got.append(free.pop(i))
    return got


def gpu_keys() -> list[str]:
    """One stable name per visible GPU (its UUID) for :func:`claim_gpu`: the same card has the same name
    whatever ``CUDA_VISIBLE_DEVICES`` numbers it."""
    import torch

    return [str(getattr(torch.cuda.get_device_properties(i), "uuid", i)) for i in range(torch.cuda.device_count())]


def threads_per_run(jobs: int | str, *, cuda: bool | None = None) -> int:
    """Threads of one training run of a per-pair / per-seed stage on a CPU: the cores shared out
    among ``resolve_jobs(jobs)`` runs, at least one."""
    return max(1, available_cores() // resolve_jobs(jobs, cuda=cuda))


def share_cores(jobs: int | str) -> None:
    """A per-pair stage on a CPU: ``threads_per_run(jobs)`` torch threads, as the per-pair and per-seed
    training runs use. ``make repro`` runs such stages beside others, and OpenMP threads that wait at
    every barrier for a sibling the OS has descheduled made them 7-15x slower there (select_windows
    and analyze with 2 threads beside a 1-thread training run on 2 cores: 88-228 s instead of 10-20 s).
    The stage lists ``parallel`` among its params: the thread count may change its results' last bits."""
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(threads_per_run(jobs, cuda=False))
