"""Several processes per training run: the process's rank and world size, the process group (NCCL on
GPU, gloo on CPU), and the stage starting torchrun itself (``train_asr.processes`` /
``train_st.processes``).

Why the stage starts torchrun rather than the user: dvc.yaml's command stays ``python stages/…``
whatever the number of processes, so ``dvc repro`` and ``dvc exp run -S train_st.processes=4`` record
the run in dvc.lock like any other, and the count is a param the run can be compared on. The parent
process claims the GPUs its workers get (:func:`lib.parallel.claim_gpus`, the same locks one-process
runs take), so several multi-GPU runs side by side (``make repro`` with ``parallel.jobs: auto``) never
share a card."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from lib.precision import configure_cuda

#: how often a multi-GPU run waiting for free GPUs asks again
GPU_WAIT_SECONDS = 5.0


def dist_info() -> tuple[int, int]:
    """(rank, world_size); (0, 1) outside torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def under_torchrun() -> bool:
    """Whether this process is one of torchrun's workers."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_command(processes: int, argv: list[str]) -> list[str]:
    """The command that runs ``argv`` (a script and its arguments) in ``processes`` workers on this node.
    ``--standalone``: a rendezvous on a free local port, so runs side by side never collide."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *argv]


def visible_devices(indices: list[int], current: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the workers: the claimed GPUs (indices among the visible ones), named
    as the current setting names them (``current``: its value, None when unset)."""
    names = [n.strip() for n in current.split(",")] if current else None
    return ",".join(names[i] if names else str(i) for i in indices)


def launch(processes: int, key: str) -> int:
    """Run this process's command line in ``processes`` torchrun workers and return torchrun's exit status.

    With CUDA the workers get ``processes`` GPUs that no other run holds (claimed for as long as this
    process lives); while fewer are free it says so and waits; RuntimeError names ``key`` when the machine
    has fewer. SIGTERM or Ctrl-C reaches the workers
    (torchrun forwards it; each saves its training state and stops, lib.train.resume.StopOnSigterm) and
    this process waits for them before it re-raises."""
    env = dict(os.environ)
    if torch.cuda.is_available():
        from lib.parallel import claim_gpus, gpu_keys
        from lib.train.precision import cache_dir

        keys = gpu_keys()
        if len(keys) < processes:
            raise RuntimeError(f"{key}: {processes} processes need {processes} GPUs, and this machine has "
                               f"{len(keys)} visible; set {key} to at most {len(keys)}")
        claimed = claim_gpus(keys, cache_dir() / "gpu-claims", processes)
        if claimed is None:
            # Runs side by side hold the others (make repro sizes parallel.jobs by train_st.processes, so a
            # multi-GPU ASR stage can start beside single-GPU runs): wait for them rather than fail.
            print(f"{key} = {processes}: fewer than {processes} of the {len(keys)} GPUs are free (held by runs "
                  f"side by side); waiting for them", file=sys.stderr, flush=True)
            while claimed is None:
                time.sleep(GPU_WAIT_SECONDS)
                claimed = claim_gpus(keys, cache_dir() / "gpu-claims", processes)
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(claimed, os.environ.get("CUDA_VISIBLE_DEVICES"))
        from lib.train.feed import HOST_GPUS_ENV  # data_workers: auto shares the cores among all the GPUs

        env.setdefault(HOST_GPUS_ENV, str(len(keys)))
    cmd = torchrun_command(processes, [sys.argv[0], *sys.argv[1:]])
    print(f"{key} = {processes}: starting torchrun {' '.join(cmd[3:5])} {' '.join(cmd[5:])}"
          + (f" on CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in env
             and env.get("CUDA_VISIBLE_DEVICES") != os.environ.get("CUDA_VISIBLE_DEVICES") else ""),
          file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except BaseException:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
        raise


def init_distributed(processes: int = 1, key: str = "processes") -> tuple[int, int, torch.device]:
    """Initialise torch.distributed when launched by torchrun (NCCL on GPU, gloo on CPU).

    ``processes`` (the run's ``train_*.processes``, named by ``key`` in errors) > 1 outside torchrun: start
    torchrun with that many workers running this same command (:func:`launch`) and exit with its status
    (SystemExit): the workers train, this process only waits. Under torchrun the worker count must be
    ``processes``, or 1 for a run started by hand with ``torchrun`` outside DVC."""
    if processes < 1:
        raise ValueError(f"{key}: expected an integer >= 1, got {processes}")
    if processes > 1 and not under_torchrun():
        raise SystemExit(launch(processes, key))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if processes > 1 and world != processes:
        raise SystemExit(f"error: {key} is {processes} but torchrun started {world} processes; let the stage "
                         f"start torchrun itself (plain `python stages/...`, as dvc.yaml does)")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            # torch.cuda.set_device would fail with "invalid device ordinal", which names neither cause
            raise RuntimeError(
                f"process with LOCAL_RANK={local_rank} has no CUDA device: this machine has "
                f"{torch.cuda.device_count()} visible; start at most that many processes per node "
                f"({key}), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on CPU with gloo")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        configure_cuda()
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist_info()
    return rank, world, device
