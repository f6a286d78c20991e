"""torchrun: the process's rank and world size, and the process group (NCCL on GPU, gloo on CPU)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from lib.precision import configure_cuda


def dist_info() -> tuple[int, int]:
    """(rank, world_size); (0, 1) outside torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed() -> tuple[int, int, torch.device]:
    """Initialise torch.distributed when launched by torchrun (NCCL on GPU, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            # torch.cuda.set_device would fail with "invalid device ordinal", which names neither cause
            raise RuntimeError(
                f"process with LOCAL_RANK={local_rank} has no CUDA device: this machine has "
                f"{torch.cuda.device_count()} visible; start at most that many processes per node "
                "(torchrun --nproc_per_node), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on CPU with gloo")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        configure_cuda()
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist_info()
    return rank, world, device
