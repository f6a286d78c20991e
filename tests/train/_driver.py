"""Shared helpers of the tests/train suite, and a small training driver run as a subprocess.

Imported by the tests (``import _driver``) for :func:`build` / :func:`run_training`, and run as a
script (plain ``python`` or under ``torch.distributed.run``) by the resume and DDP tests::

    python tests/train/_driver.py '<json spec>'

The spec: ``{"prepared": dir, "out": dir, "task": "asr", "seed": 1, "train": {TrainConfig
overrides}, "model": {model_config overrides}}``. The driver uses one torch thread, trains with
:func:`lib.train.loop.train` (progress bar off), prints ``update <n>`` after each update and, on
rank 0, writes ``<out>/final.pt`` = ``{"model": state_dict, "summary": {...}}`` and prints ``DONE``.

``TRAIN_DRIVER_BLOCK_AT=<n>``: after update ``n`` (weights updated, before that update's
checkpoint is written) the driver prints ``BLOCKED at update <n>`` and sleeps until it is killed;
the resume test SIGKILLs it there, so the kill point is exact and no timing race decides it.
``TRAIN_DRIVER_BLOCK_IN_SAVE=<file name>@<update>``: block (same way) when the loop is about to
write checkpoint ``<file name>`` at update ``<update>`` (killed in the middle of a save).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lib.data.dataset import SpeechDataset  # noqa: E402
from lib.model.s2t_transformer import S2TTransformer, model_config  # noqa: E402
from lib.train.loop import TrainConfig, dist_info, init_distributed, train  # noqa: E402

# Small and fast: 5 batches of <= 200 frames per epoch on the fixture's 11 train utterances.
BASE_TRAIN = dict(lr=2e-3, warmup_updates=3, max_updates=8, max_frames=200, update_freq=1, eval_every=4,
                  save_every=2, average_last=3, specaugment=True, max_frames_train=3000)
BASE_MODEL: dict[str, Any] = {}


def train_config(**overrides: Any) -> TrainConfig:
    return TrainConfig(**{**BASE_TRAIN, **overrides})


def build(prepared: Path, task: str = "asr", seed: int = 1, model: dict | None = None
          ) -> tuple[S2TTransformer, SpeechDataset, SpeechDataset, dict]:
    """(model initialised from ``seed``, train set, dev set, run_config)."""
    train_ds = SpeechDataset(prepared, "train", task, max_frames=3000)
    dev_ds = SpeechDataset(prepared, "dev", task)
    mcfg = model_config("tiny", vocab_size=train_ds.vocab_size, **{**BASE_MODEL, **(model or {})})
    torch.manual_seed(seed)
    net = S2TTransformer(mcfg)
    return net, train_ds, dev_ds, {"task": task, "model": mcfg.to_dict(), "data": "tests/train fixture"}


def run_training(prepared: Path, out: Path, *, task: str = "asr", seed: int = 1, train_overrides: dict | None = None,
                 model: dict | None = None, live: Any = None, prefetch: bool | None = None) -> tuple[S2TTransformer, dict]:
    """Build and train; returns (model, summary)."""
    cfg = train_config(seed=seed, **(train_overrides or {}))
    net, train_ds, dev_ds, run_config = build(prepared, task, seed, model)
    summary = train(net, cfg, train_ds, dev_ds, out, run_config=run_config, progress=False, live=live,
                    prefetch=prefetch)
    return net, summary


class _ProgressLive:
    """Stands in for dvclive's ``Live``: prints each finished update, optionally blocks at one."""

    def __init__(self, block_at: int | None) -> None:
        self.step = 0
        self.block_at = block_at

    def log_metric(self, name: str, value: float) -> None:
        pass

    def next_step(self) -> None:
        print(f"update {self.step}", flush=True)
        if self.block_at is not None and self.step == self.block_at:
            print(f"BLOCKED at update {self.step}", flush=True)
            while True:  # wait for SIGKILL, or until SIGTERM reaches the training loop's handler
                stop = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)  # lib.train.resume.StopOnSigterm
                if getattr(stop, "flag", False):
                    break
                time.sleep(0.1)


def _block_in_save(target: str) -> None:
    """Make ``lib.train.checkpoint.save`` block before writing ``<name>@<update>``."""
    from lib.train import checkpoint as ckpt

    name, _, update = target.partition("@")
    real_save = ckpt.save

    def save(path, state):  # noqa: ANN001
        step = state["run_state"]["update"] if "run_state" in state else state.get("update")
        if Path(path).name == name and step == int(update):
            print(f"BLOCKED in save of {name} at update {step}", flush=True)
            while True:  # wait for SIGKILL
                time.sleep(1)
        real_save(path, state)

    ckpt.save = save


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    init_distributed()
    rank, world = dist_info()
    if os.environ.get("TRAIN_DRIVER_BLOCK_IN_SAVE"):
        _block_in_save(os.environ["TRAIN_DRIVER_BLOCK_IN_SAVE"])
    block = os.environ.get("TRAIN_DRIVER_BLOCK_AT")
    live = _ProgressLive(int(block) if block else None)
    net, summary = run_training(Path(spec["prepared"]), Path(spec["out"]), task=spec.get("task", "asr"),
                                seed=spec.get("seed", 1), train_overrides=spec.get("train"), model=spec.get("model"),
                                live=live if rank == 0 else None)
    if rank == 0:
        torch.save({"model": net.state_dict(), "summary": summary, "world": world},
                   Path(spec["out"]) / "final.pt")
        print("DONE", flush=True)
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
