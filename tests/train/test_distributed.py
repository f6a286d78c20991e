"""lib/train/distributed.py: a stage starts torchrun itself when its run has several processes
(``train_*.processes``); the command, the devices its workers see, and the errors that name the key.
The run through `dvc repro` with two gloo processes: tests/test_pipeline.py."""
from __future__ import annotations

import sys

import pytest
import torch

from lib.params import TrainConfig
from lib.train import distributed


def test_the_torchrun_command_reruns_the_same_script_in_n_workers() -> None:
    cmd = distributed.torchrun_command(4, ["stages/train_baseline.py", "en-de", "1"])
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                   "stages/train_baseline.py", "en-de", "1"]


@pytest.mark.parametrize("current, expected", [(None, "0,2"), ("", "0,2"), ("3,5,6", "3,6"),
                                               ("GPU-aa, GPU-bb, GPU-cc", "GPU-aa,GPU-cc")])
def test_workers_see_the_claimed_gpus_named_as_the_parent_sees_them(current: str | None, expected: str) -> None:
    assert distributed.visible_devices([0, 2], current) == expected


def test_one_process_trains_here_and_several_start_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert distributed.init_distributed(1, "train_st.processes") == (0, 1, torch.device("cpu"))
    started = []
    monkeypatch.setattr(distributed, "launch", lambda n, key: started.append((n, key)) or 143)
    with pytest.raises(SystemExit) as e:
        distributed.init_distributed(2, "train_st.processes")
    assert e.value.code == 143 and started == [(2, "train_st.processes")]  # torchrun's status is the stage's


def test_torchrun_started_by_hand_with_another_count_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(distributed, "launch", lambda n, key: pytest.fail("a worker must not start torchrun"))
    with pytest.raises(SystemExit, match=r"train_st\.processes is 4 but torchrun started 2 processes"):
        distributed.init_distributed(4, "train_st.processes")


def test_a_multi_gpu_run_on_too_few_gpus_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from lib import parallel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(parallel, "gpu_keys", lambda: ["a", "b"])
    monkeypatch.setattr(distributed.subprocess, "Popen", lambda *a, **k: pytest.fail("started"))
    with pytest.raises(RuntimeError, match=r"train_asr\.processes: 4 processes need 4 GPUs.* has 2 visible"):
        distributed.launch(4, "train_asr.processes")


def test_a_multi_gpu_run_waits_while_runs_side_by_side_hold_the_gpus(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """make repro sizes its jobs by train_st.processes, so a train_asr stage in 4 processes can start while
    single-GPU runs hold the GPUs: it waits for 4 to be free instead of failing."""
    from lib import parallel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(parallel, "gpu_keys", lambda: [f"g{i}" for i in range(8)])
    answers = [None, None, [1, 2, 5, 6]]
    monkeypatch.setattr(parallel, "claim_gpus", lambda keys, lock_dir, n: answers.pop(0))
    slept = []
    monkeypatch.setattr(distributed.time, "sleep", slept.append)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    started = []

    class Proc:
        def __init__(self, cmd, env):
            started.append(env["CUDA_VISIBLE_DEVICES"])

        def wait(self):
            return 0

    monkeypatch.setattr(distributed.subprocess, "Popen", Proc)
    assert distributed.launch(4, "train_asr.processes") == 0
    assert started == ["1,2,5,6"] and slept == [distributed.GPU_WAIT_SECONDS] * 2 and not answers
    assert capsys.readouterr().err.count("waiting for them") == 1


@pytest.mark.parametrize("update_freq, processes, ok", [(8, 1, True), (8, 4, True), (8, 3, False), (1, 2, False)])
def test_update_freq_must_split_over_the_processes(update_freq: int, processes: int, ok: bool) -> None:
    cfg = TrainConfig(update_freq=update_freq, processes=processes)
    if ok:
        cfg.validate("train_st")
    else:
        with pytest.raises(ValueError, match=r"train_st\.update_freq .* train_st\.processes"):
            cfg.validate("train_st")


def test_the_process_count_is_not_fingerprinted() -> None:
    """It is the run config's world_size: a resume with another count stops (ProcessCountChanged)
    instead of moving last.pt aside as another config's."""
    from lib.train.resume import train_config_dict

    assert train_config_dict(TrainConfig(processes=4)) == train_config_dict(TrainConfig())
