"""Suite-wide settings."""
from __future__ import annotations

import os
import tempfile


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs ``-n auto`` workers): give each worker its own share of the
    cores through its CPU affinity, which the `dvc repro` subprocesses it starts inherit and
    ``lib.parallel.available_cores`` reads. Two workers each running 2-thread OpenMP code on 2 cores make
    every barrier wait for a descheduled thread (lib.parallel.share_cores); one core each does not."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cores, n, i = sorted(os.sched_getaffinity(0)), int(count), int(worker.removeprefix("gw"))
    if n < 2 or len(cores) < n:
        return
    mine = set(cores[i::n])
    os.sched_setaffinity(0, mine)
    import torch

    torch.set_num_threads(len(mine))


def pytest_configure(config) -> None:
    # Machine-level measurements (lib/train/precision.py's `amp: probe` probe) go to a fresh folder per
    # test session, inherited by the `dvc repro` subprocesses: the suite neither reads nor
    # writes the user's ~/.cache/locality-st, and every run of one session sees the same answer.
    os.environ["LOCALITY_ST_CACHE"] = tempfile.mkdtemp(prefix="locality-st-cache-")
    _pin_xdist_worker()


# Under pytest-xdist's --dist loadfile each file runs whole on one worker, in collection order (pyproject.toml
# turns xdist's own reordering by test count off). The files that build a tiny pipeline (minutes on one core)
# go first, so that they start at once; the files that copy the session's tiny repository, which
# tests/test_pipeline.py builds (tests/dvc_repo.py), come after most short files, so that the other worker
# runs those while it is built instead of waiting for it; and the files of two folders of short files (about
# three minutes in all) come last, to fill whichever worker is free while the long files end. (xdist hands a
# worker its next file as soon as its current one has two tests left, so with the long files last one
# worker could take two of them and the other none.)
FIRST = ("tests/test_pipeline.py", "tests/test_paper_profile.py")
LAST = ("tests/test_pipeline_variants.py", "tests/test_pipeline_experiments.py", "tests/test_pipeline_processes.py")
FILLER = ("tests/train/", "tests/scripts/")  # in this order: the train folder has the longer files


def _place(nodeid: str) -> int:
    path = nodeid.split("::")[0]
    if path in FIRST:
        return FIRST.index(path)
    if path in LAST:
        return len(FIRST) + 1 + LAST.index(path)
    for i, folder in enumerate(FILLER):
        if path.startswith(folder):
            return len(FIRST) + 1 + len(LAST) + i
    return len(FIRST)


def pytest_collection_modifyitems(config, items) -> None:
    items.sort(key=lambda item: _place(item.nodeid))  # stable: the files within a place keep their order
