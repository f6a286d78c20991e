"""benchmarks/gpu.py checked on the CPU (``--cpu-smoke``, tiny shapes): every figure that scripts/gpu_check.sh
collects on a card is emitted, the TF32 update last, and the TF32 flags are as before afterwards."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_smoke_emits_every_figure(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    spec = importlib.util.spec_from_file_location("gpu_bench_smoke", ROOT / "benchmarks/gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--cpu-smoke"])
    assert gpu.main() == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    figures = [d["figure"] for d in lines]
    assert figures[0] == "env" and {"op", "encoder", "update", "update_mix", "training"} <= set(figures)
    assert not [d for d in lines if "skipped" in d and d.get("path") != "flash"]  # no FA2 on a CPU
    update = [(d["dtype"], d["mode"]) for d in lines if d["figure"] == "update"]
    modes = ["accumulated_synced", "accumulated", "folded"]
    assert update == [("fp32", m) for m in modes] + [("fp32_tf32", m) for m in modes]
    assert figures[-3:] == ["update"] * 3  # the TF32 figure comes last
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == flags
    with pytest.raises(ValueError, match="update precision"):
        gpu.time_update_modes(None, torch.device("cpu"), None, None, None, [], "tf32", "update", 1, 0, {}, {})
