"""The `amp: auto` training probe (lib/precision.py) on real collated batches of the tiny corpus."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lib import precision
from lib.data.dataset import SpeechDataset, batch_by_frames, collate
from lib.model.config import model_config


def test_probe_times_both_precisions_and_leaves_the_rng_alone(prepared: Path) -> None:
    ds = SpeechDataset(prepared, "train", "st")
    batches = [collate(ds, idx) for idx in batch_by_frames(ds.n_frames, 200, shuffle=False)[:5]]
    assert len(batches) == 5
    cfg = model_config("tiny", vocab_size=ds.vocab_size).to_dict()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    t = precision.probe_step_times(cfg, batches)
    assert set(t) == {"none", "bf16"} and all(v > 0 for v in t.values())
    assert torch.equal(torch.get_rng_state(), before)
    with pytest.raises(ValueError, match="at least 3 training batches"):
        precision.probe_step_times(cfg, batches[:2])


def test_probe_with_ctc_runs_the_asr_objective(prepared: Path) -> None:
    ds = SpeechDataset(prepared, "train", "asr")
    batches = [collate(ds, idx) for idx in batch_by_frames(ds.n_frames, 200, shuffle=False)[:3]]
    cfg = model_config("tiny", vocab_size=ds.vocab_size, ctc_vocab_size=ds.vocab_size).to_dict()
    t = precision.probe_step_times(cfg, batches, ctc_weight=0.3)
    assert t["none"] > 0 and t["bf16"] > 0


def test_probe_times_each_batch_in_both_precisions_back_to_back(prepared: Path, monkeypatch) -> None:
    """Interleaved, with alternating order: a load that comes and goes hits fp32 and bf16 alike
    (timed in blocks, a test run beside the probe once made fp32 look 1.47x slower than bf16)."""
    ds = SpeechDataset(prepared, "train", "st")
    batches = [collate(ds, idx) for idx in batch_by_frames(ds.n_frames, 200, shuffle=False)[:5]]
    cfg = model_config("tiny", vocab_size=ds.vocab_size).to_dict()
    seen: list[str] = []
    real = precision.autocast

    def recording(device, amp):
        seen.append(amp)
        return real(device, amp)

    monkeypatch.setattr(precision, "autocast", recording)
    precision.probe_step_times(cfg, batches)
    assert seen == ["bf16", "none", "none", "bf16", "bf16", "none", "none", "bf16", "bf16", "none"]
