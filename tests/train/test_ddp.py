"""DDP (gloo, 2 CPU processes) computes the same updates as one process accumulating the same
batches: n processes with update_freq=k == one process with update_freq=k*n (fairseq's
normalisation by the token count of the whole update, summed over ranks)."""
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


@pytest.mark.slow
@pytest.mark.parametrize("specaugment", [False, True], ids=["no_specaugment", "specaugment"])
def test_two_gloo_ranks_equal_one_process_with_double_update_freq(prepared: Path, tmp_path: Path,
                                                                  specaugment: bool) -> None:
    """Dropout must be off (each rank has its own dropout stream). SpecAugment may be on: its
    masks are seeded by the batch's place in the update group, whichever rank processes it."""
    train = {**TRAIN, "specaugment": specaugment}
    single, single_summary = _driver.run_training(prepared, tmp_path / "single", model=NO_DROPOUT,
                                                  train_overrides={**train, "update_freq": 2})

    out = tmp_path / "ddp"
    spec = {"prepared": str(prepared), "out": str(out), "model": NO_DROPOUT, "train": {**train, "update_freq": 1}}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(Path(_driver.__file__).resolve()),
           json.dumps(spec)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180,
                          cwd=str(Path(_driver.__file__).resolve().parents[2]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DONE" in proc.stdout
    final = torch.load(out / "final.pt", weights_only=True)
    assert final["world"] == 2 and final["summary"]["updates"] == 4

    single_state, ddp_state = single.state_dict(), final["model"]
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
