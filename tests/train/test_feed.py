"""lib/train/feed.py: the training batches collated in the training process, in a background thread or
in worker processes are the same batches; a dead worker costs only speed; workers leave with their
training process; ``data_workers: auto`` by device and host."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import _driver
from lib.data.dataset import SpecAugmentConfig, SpeechDataset
from lib.params import TrainConfig
from lib.train import feed
from lib.train.feed import BatchJob, UpdateFeed, resolve_data_workers
from lib.train.resume import train_config_dict

REPO = Path(__file__).resolve().parents[2]


def _jobs(ds: SpeechDataset, update: int) -> list[BatchJob]:
    n = len(ds)
    return [BatchJob(tuple((update * 7 + b * 3 + k) % n for k in range(4)), 1000 * update + b) for b in range(3)]


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.ids == y.ids
        for name in ("feats", "feat_lengths", "prev_tokens", "target", "target_lengths"):
            assert torch.equal(getattr(x, name), getattr(y, name)), name


def _feed(ds: SpeechDataset, **kw) -> UpdateFeed:
    return UpdateFeed(ds, specaugment=SpecAugmentConfig(), pad_frames_to=1, pad_tokens_to=1, pin=False, **kw)


def test_workers_thread_and_training_process_give_the_same_batches(prepared: Path) -> None:
    ds = SpeechDataset(prepared, "train", "asr")
    inline = _feed(ds, prefetch=False, workers=0)
    thread = _feed(ds, prefetch=True, workers=0)
    workers = _feed(ds, prefetch=True, workers=2)
    assert (inline.workers, thread.workers, workers.workers) == (0, 0, 2)
    try:
        for update in range(4):
            want = inline.get(update, _jobs(ds, update))
            for f in (thread, workers):
                if update:  # asked ahead, as the loop does, except for the first update
                    assert f._ahead is not None and f._ahead[0] == update
                _same(want, f.get(update, _jobs(ds, update)))
                f.prefetch(update + 1, _jobs(ds, update + 1))
        # a prefetch under another key is not handed out for this one
        _same(inline.get(9, _jobs(ds, 9)), workers.get(9, _jobs(ds, 9)))
    finally:
        for f in (inline, thread, workers):
            f.close()


def test_a_worker_that_dies_costs_only_speed(prepared: Path) -> None:
    ds = SpeechDataset(prepared, "train", "asr")
    said: list[str] = []
    inline = _feed(ds, prefetch=False, workers=0)
    f = _feed(ds, prefetch=True, workers=1, say=said.append)
    try:
        _same(inline.get(0, _jobs(ds, 0)), f.get(0, _jobs(ds, 0)))
        (pid,) = list(f._procs._processes)
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        for update in (1, 2):
            _same(inline.get(update, _jobs(ds, update)), f.get(update, _jobs(ds, update)))
        assert len(said) == 1 and said[0].startswith("data_workers: a worker process died")
        assert said[0].endswith("collating in the training process from now on")
        assert f._procs is None
    finally:
        f.close()
        inline.close()


def test_the_workers_leave_with_a_killed_training_process(prepared: Path, tmp_path: Path) -> None:
    """A training process killed outright (SIGKILL: no clean-up runs) leaves no worker behind."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from lib.data.dataset import SpecAugmentConfig, SpeechDataset
        from lib.train.feed import BatchJob, UpdateFeed
        if __name__ == "__main__":
            ds = SpeechDataset({str(prepared)!r}, "train", "asr")
            f = UpdateFeed(ds, specaugment=SpecAugmentConfig(), pad_frames_to=1, pad_tokens_to=1, prefetch=True,
                           pin=False, workers=2)
            f.get(0, [BatchJob((0, 1), 1), BatchJob((2, 3), 2)])
            print(*f._procs._processes, flush=True)
            import time
            time.sleep(600)
    """)
    (tmp_path / "parent.py").write_text(script)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) >= 1
        assert all(_alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "a feed worker outlived its training process"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_run_collating_in_worker_processes_trains_the_same_weights(prepared: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole loop with prefetch forced on a CPU and 2 worker processes, across an epoch boundary:
    the weights and history of the run that collates in its own process, bit for bit."""
    submitted = []

    class Counting(feed.ProcessPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            submitted.append(args)
            return super().submit(fn, *args, **kwargs)

    m1, s1 = _driver.run_training(prepared, tmp_path / "a", prefetch=False)
    monkeypatch.setattr(feed, "ProcessPoolExecutor", Counting)
    m2, s2 = _driver.run_training(prepared, tmp_path / "b", prefetch=True, train_overrides={"data_workers": 2})
    assert s1["epochs_started"] == 2 and len(submitted) >= 5  # most batches came from the workers
    for name, value in m1.state_dict().items():
        assert torch.equal(value, m2.state_dict()[name]), name
    assert s1["history"] == s2["history"]
    assert s1["fingerprint"] == s2["fingerprint"]  # data_workers is not part of the run's fingerprint


def test_data_workers_auto_by_device_and_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_data_workers("auto", torch.device("cpu")) == 0
    assert resolve_data_workers(3, torch.device("cpu")) == 3
    for cores, gpus, want in ((16, 1, 8), (64, 8, 6), (24, 8, 1), (2, 1, 0), (128, 2, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        monkeypatch.setattr(torch.cuda, "device_count", lambda g=gpus: g)
        assert resolve_data_workers("auto", torch.device("cuda")) == want, (cores, gpus)
    # a torchrun worker of lib.train.distributed.launch sees only its run's 2 GPUs of the host's 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv(feed.HOST_GPUS_ENV, "8")
    assert resolve_data_workers("auto", torch.device("cuda")) == 6
    assert "data_workers" not in train_config_dict(TrainConfig(data_workers=4))
    TrainConfig(data_workers=0).validate()
    with pytest.raises(ValueError, match=r"train\.data_workers must be an integer >= 0 or 'auto', got -2"):
        TrainConfig(data_workers=-2).validate()


_EXIT_AFTER_A_DEAD_WORKER = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from lib.data.dataset import SpecAugmentConfig, SpeechDataset
from lib.train.feed import BatchJob, UpdateFeed
if __name__ == "__main__":
    ds = SpeechDataset({prepared!r}, "train", "asr")
    f = UpdateFeed(ds, specaugment=SpecAugmentConfig(), pad_frames_to=1, pad_tokens_to=1, prefetch=True,
                   pin=False, workers=2, say=lambda m: None)
    jobs = [BatchJob((0, 1), 1), BatchJob((2, 3), 2), BatchJob((4, 5), 3)]
    f.get(0, jobs)
    time.sleep(1.0)  # both idle: one of them waits for a task holding the task queue's lock
    os.kill(sorted(f._procs._processes)[{which}], signal.SIGKILL)
    time.sleep(1.0)
    f.get(1, jobs)
    f.close()
    print("closed", flush=True)
"""


@pytest.mark.parametrize("which", [0, 1])
def test_a_dead_worker_among_two_leaves_a_process_that_exits(prepared: Path, tmp_path: Path, which: int) -> None:
    """The pool stops the other workers with SIGTERM, which they ignore: the feed must stop them itself, or
    the training process hangs at exit joining the pool's thread (whichever worker died)."""
    (tmp_path / "parent.py").write_text(_EXIT_AFTER_A_DEAD_WORKER.format(repo=str(REPO), prepared=str(prepared),
                                                                          which=which))
    proc = subprocess.run([sys.executable, str(tmp_path / "parent.py")], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "closed" in proc.stdout, proc.stderr[-2000:]


_WORKER_FAILS = """
import multiprocessing, sys
sys.path.insert(0, {repo!r})
from lib.data.dataset import SpecAugmentConfig, SpeechDataset
from lib.train.feed import BatchJob, UpdateFeed

class FailsInWorkers(SpeechDataset):
    def features(self, i):
        if multiprocessing.parent_process() is not None:  # as torch when /dev/shm is full
            raise RuntimeError("unable to write to file </torch_1_2_3>: No space left on device (28)")
        return super().features(i)

if __name__ == "__main__":
    said = []
    ds = FailsInWorkers({prepared!r}, "train", "asr")
    f = UpdateFeed(ds, specaugment=SpecAugmentConfig(), pad_frames_to=1, pad_tokens_to=1, prefetch=True,
                   pin=False, workers=2, say=said.append)
    try:
        out = f.get(0, [BatchJob((0, 1), 1), BatchJob((2, 3), 2)])
    finally:
        f.close()
    assert len(out) == 2 and len(said) == 1 and "No space left on device" in said[0], said
    print("ok", flush=True)
"""


def test_a_worker_that_fails_for_the_hosts_sake_costs_only_speed(prepared: Path, tmp_path: Path) -> None:
    (tmp_path / "parent.py").write_text(_WORKER_FAILS.format(repo=str(REPO), prepared=str(prepared)))
    proc = subprocess.run([sys.executable, str(tmp_path / "parent.py")], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
