"""DDP (gloo, 2 CPU processes) computes the same updates as one process accumulating the same
batches: ``update_freq`` is the whole update's batches, split among the processes, so n processes
and one process with the same update_freq train the same (fairseq's normalisation by the token count
of the whole update, summed over ranks).

Both runs are CPU subprocesses with the GPUs hidden: on a machine with one GPU, two ranks cannot
each have a CUDA device (``init_distributed`` says so), and a GPU reference would not be comparable
to gloo on CPU at 1e-5."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import _driver
from lib.train import checkpoint as ckpt

NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
TRAIN = {"max_updates": 4, "save_every": 2, "eval_every": 2, "specaugment": False, "warmup_updates": 2}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _driver_command(prepared: Path, out: Path, train: dict, nproc: int) -> tuple[list[str], dict, str]:
    """The command line, environment and folder that train with tests/train/_driver.py on CPU (GPUs
    hidden) in ``nproc`` processes (torchrun when > 1)."""
    spec = {"prepared": str(prepared), "out": str(out), "model": NO_DROPOUT, "train": train}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "PYTHONUNBUFFERED": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    driver = str(Path(_driver.__file__).resolve())
    launch = ([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}"] if nproc > 1 else [sys.executable])
    return [*launch, driver, json.dumps(spec)], env, str(Path(driver).parents[2])


def _run_driver(prepared: Path, out: Path, train: dict, nproc: int) -> dict:
    """Train as :func:`_driver_command` says; the driver's final.pt (model, summary, world)."""
    cmd, env, cwd = _driver_command(prepared, out, train, nproc)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DONE" in proc.stdout
    return torch.load(out / "final.pt", weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("specaugment", [False, True], ids=["no_specaugment", "specaugment"])
def test_two_gloo_ranks_equal_one_process_with_the_same_update_freq(prepared: Path, tmp_path: Path,
                                                                  specaugment: bool) -> None:
    """Dropout must be off (each rank has its own dropout stream). SpecAugment may be on: its
    masks are seeded by the batch's place in the update group, whichever rank processes it."""
    train = {**TRAIN, "specaugment": specaugment}
    single = _run_driver(prepared, tmp_path / "single", {**train, "update_freq": 2}, nproc=1)
    single_summary = single["summary"]
    out = tmp_path / "ddp"
    final = _run_driver(prepared, out, {**train, "update_freq": 2}, nproc=2)  # one batch per process
    assert single["world"] == 1 and final["world"] == 2 and final["summary"]["updates"] == 4

    single_state, ddp_state = single["model"], final["model"]
    assert list(single_state) == list(ddp_state)
    worst = max(float((single_state[k] - ddp_state[k]).abs().max()) for k in single_state)
    moved = max(float((single_state[k] - ckpt.load(tmp_path / "single/checkpoints/snapshots/update_0000002.pt")
                       ["model"][k]).abs().max()) for k in single_state)
    assert moved > 1e-3  # the comparison is not trivially between untrained models
    assert worst < 1e-5, f"DDP and single-process parameters differ by up to {worst:g}"
    # dev metrics agree; the logged lr/updates are the same schedule
    for a, b in zip(single_summary["history"], final["summary"]["history"], strict=True):
        assert a["update"] == b["update"] and a["train/lr"] == b["train/lr"]
        assert a["dev/loss"] == pytest.approx(b["dev/loss"], rel=1e-5)
        # the gradient norm (of the all-reduced gradient under DDP) is the same: catches a wrong
        # constant factor in the normalisation, which Adam alone would almost hide
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-5)
    # rank 0 alone wrote the checkpoints, with both ranks' RNG states in last.pt
    last = ckpt.load(out / "checkpoints/last.pt")
    assert len(last["rng"]) == 2 and last["run_state"]["update"] == 4


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_both_ranks_after_one_update_and_the_same_command_continues(
        prepared: Path, tmp_path: Path) -> None:
    """A pre-emption of a run in two processes: SIGTERM reaches torchrun, which forwards it to both ranks;
    they agree (an all-reduce of the flag) to stop after the same update, rank 0 saves that update off the
    save_every schedule with both ranks' RNG states, and the same command continues to the weights of the
    uninterrupted run, bit for bit."""
    import signal
    import threading

    train = {**TRAIN, "update_freq": 2}  # save_every 2: update 3 is saved only because of the SIGTERM
    reference = _run_driver(prepared, tmp_path / "whole", train, nproc=2)
    out = tmp_path / "preempted"
    cmd, env, cwd = _driver_command(prepared, out, train, nproc=2)
    proc = subprocess.Popen(cmd, env={**env, "TRAIN_DRIVER_BLOCK_AT": "3"}, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    blocked = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "BLOCKED at update 3" in line:
                blocked.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert blocked.wait(timeout=120), "".join(lines)
        os.kill(proc.pid, signal.SIGTERM)  # to torchrun, as a scheduler's pre-emption would
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    log = "".join(lines)
    for rank in (0, 1):  # each rank stopped after update 3 (rank 1 was not held: without the agreement it
        # would have gone on into update 4 and failed waiting for rank 0)
        assert f"[rank{rank}]: lib.train.resume.Preempted: stopped by SIGTERM after update 3" in log, log
    last = ckpt.load(out / "checkpoints/last.pt")
    assert last["run_state"]["update"] == 3 and len(last["rng"]) == 2

    final = _run_driver(prepared, out, train, nproc=2)
    assert final["world"] == 2 and final["summary"]["updates"] == 4
    assert list(final["model"]) == list(reference["model"])
    assert all(torch.equal(final["model"][k], reference["model"][k]) for k in reference["model"])
    assert final["summary"]["history"] == reference["summary"]["history"]


def test_more_ranks_than_gpus_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks on a one-GPU machine: an error naming the rank, the device count and both ways
    out, not CUDA's "invalid device ordinal" (seen on an H100 machine before the check)."""
    from lib.train.loop import init_distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("set_device reached"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=1 .* 1 visible.*\(processes\).*CUDA_VISIBLE_DEVICES"):
        init_distributed()


def test_a_cuda_run_switches_cudnn_attention_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways a run picks a CUDA device apply lib.precision.configure_cuda (cuDNN's SDPA
    backend off: a graph per batch shape, 2x slower training measured on an H100)."""
    from lib.train.loop import init_distributed
    from lib.train.run import auto_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        for pick in (init_distributed, auto_device):
            torch.backends.cuda.enable_cudnn_sdp(True)
            pick()
            assert not torch.backends.cuda.cudnn_sdp_enabled(), pick.__name__
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
