"""Mixed-precision resolution (lib/precision.py)."""
from __future__ import annotations

import pytest
import torch

from lib import precision


def test_auto_resolves_by_cpu_capability(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert precision.resolve_amp("auto", cpu) == "bf16"
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    assert precision.resolve_amp("auto", cpu) == "none"
    assert precision.resolve_amp("bf16", cpu) == "bf16" and precision.resolve_amp("none", cpu) == "none"


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="amp must be one of"):
        precision.resolve_amp("fp8", torch.device("cpu"))
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        precision.resolve_amp("fp16", torch.device("cpu"))


def test_autocast_context_matches_the_precision():
    x = torch.randn(4, 4)
    with precision.autocast(torch.device("cpu"), "bf16"):
        assert (x @ x).dtype == torch.bfloat16
    with precision.autocast(torch.device("cpu"), "none"):
        assert (x @ x).dtype == torch.float32
