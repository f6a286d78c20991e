"""The `amp: auto` training probe (lib/precision.py) on real collated batches of the tiny corpus."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lib import precision
from lib.train import precision as train_precision
from lib.data.dataset import PAD_ID, SpeechDataset, batch_by_frames, collate
from lib.model.config import model_config


def test_probe_times_both_precisions_and_leaves_the_rng_alone(prepared: Path) -> None:
    ds = SpeechDataset(prepared, "train", "st")
    batches = [collate(ds, idx) for idx in batch_by_frames(ds.n_frames, 200, shuffle=False)[:5]]
    assert len(batches) == 5
    cfg = model_config("tiny", vocab_size=ds.vocab_size).to_dict()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    t = train_precision.probe_step_times(cfg, batches)
    assert set(t) == {"none", "bf16", "speedup"} and all(v > 0 for v in t.values())
    assert torch.equal(torch.get_rng_state(), before)
    with pytest.raises(ValueError, match="at least 3 training batches"):
        train_precision.probe_step_times(cfg, batches[:2])


def test_probe_with_ctc_runs_the_asr_objective(prepared: Path, monkeypatch) -> None:
    """The probe times the step a CTC run takes: every batch's loss is CE + ctc_weight x CTC rescaled
    per target token (lib.train.criterion.Criterion), the CTC computed (lib.train.objectives.ctc_loss)
    once per batch -- not the cheaper CE-only step of a criterion that ignores the weight."""
    from lib.train import criterion as criterion_module

    ds = SpeechDataset(prepared, "train", "asr")
    batches = [collate(ds, idx) for idx in batch_by_frames(ds.n_frames, 200, shuffle=False)[:3]]
    cfg = model_config("tiny", vocab_size=ds.vocab_size, ctc_vocab_size=ds.vocab_size).to_dict()
    ctc_calls: list[int] = []
    real_ctc = criterion_module.ctc_loss
    monkeypatch.setattr(criterion_module, "ctc_loss", lambda *a, **kw: ctc_calls.append(1) or real_ctc(*a, **kw))
    seen: list[tuple[object, float, dict]] = []  # (batch, loss, parts) of every step
    real_forward = criterion_module.Criterion.forward

    def forward(self, batch, host=None):
        loss, parts = real_forward(self, batch, host)
        seen.append((batch, float(loss.detach()), parts))
        return loss, parts

    monkeypatch.setattr(criterion_module.Criterion, "forward", forward)
    steps = train_precision.time_training_steps(cfg, batches, "bf16", ctc_weight=0.3)
    assert len(steps) == 2 and all(s > 0 for s in steps)  # batch 0 is the warm-up
    assert len(ctc_calls) == 3 and len(seen) == 3 and all(s[0] is b for s, b in zip(seen, batches))
    for batch, loss, parts in seen:
        tokens = int(batch.target.ne(PAD_ID).sum())  # target tokens, eos included
        labels = tokens - len(batch.ids)  # CTC's labels: the targets without their eos
        assert parts["ctc"] > 0
        assert loss == pytest.approx(parts["ce"] + 0.3 * parts["ctc"] * tokens / labels, rel=1e-5)


def test_probe_times_each_precision_in_its_own_process_and_decides_on_the_median(prepared: Path, monkeypatch,
                                                                                 tmp_path) -> None:
    """In one process bf16 steps slow the fp32 steps after them, and one slow step must not buy bf16:
    with per-batch fp32 / bf16 times of 1/1, 1/1, 1/1.25 and 3/1 the means say 1.41x, the median 1.0x."""
    ds = SpeechDataset(prepared, "train", "st")
    batches = [collate(ds, idx) for idx in batch_by_frames(ds.n_frames, 200, shuffle=False)[:5]]
    cfg = model_config("tiny", vocab_size=ds.vocab_size).to_dict()
    scripted = {"none": [1.0, 1.0, 1.0, 3.0], "bf16": [1.0, 1.0, 1.25, 1.0]}
    calls: list[tuple[str, int]] = []

    def child(model_config, batches, amp, ctc_weight, warm=False):
        assert not warm  # unpadded batches: timed as a run meets them, new shapes
        calls.append((amp, len(batches)))
        return scripted[amp]

    monkeypatch.setattr(train_precision, "_child_step_times", child)
    t = train_precision.probe_step_times(cfg, batches)
    assert calls == [("none", 5), ("bf16", 5)]  # one process per precision, every batch in each
    assert t["none"] == pytest.approx(1.5) and t["bf16"] == pytest.approx(1.0625)
    assert t["speedup"] == pytest.approx(1.0)

    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    enough = batches * train_precision.PROBE_MIN_BATCHES  # the fake probe's figures stand for these
    assert train_precision.resolve_train_amp("probe", torch.device("cpu"), cfg, 200, probe_batches=lambda: enough) == "none"


def test_probe_child_process_round_trips_the_batches(prepared: Path, tmp_path: Path) -> None:
    """The child process rebuilds the very batches (ids, features, targets) from what is saved for it."""
    ds = SpeechDataset(prepared, "train", "st")
    batches = [collate(ds, idx) for idx in batch_by_frames(ds.n_frames, 200, shuffle=False)[:3]]
    from lib.data.dataset import Batch

    saved = tmp_path / "job.pt"
    torch.save({"batches": [train_precision._batch_to_dict(b) for b in batches]}, saved)
    for a, b in zip((Batch(**d) for d in torch.load(saved, weights_only=True)["batches"]), batches):
        assert a.ids == b.ids and a.src_texts == b.src_texts and a.task is None
        for name in ("feats", "feat_lengths", "prev_tokens", "target", "target_lengths"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_probe_times_bf16_on_its_own_padded_batches(prepared: Path) -> None:
    """`pad_*: auto`: the same items, padded as a bf16 run would train on them, reach the bf16 process."""
    ds = SpeechDataset(prepared, "train", "st")
    order = batch_by_frames(ds.n_frames, 200, shuffle=False)[:3]
    plain = [collate(ds, idx) for idx in order]
    padded = [collate(ds, idx, pad_frames_to=64, pad_tokens_to=8) for idx in order]
    cfg = model_config("tiny", vocab_size=ds.vocab_size).to_dict()
    t = train_precision.probe_step_times(cfg, plain, bf16_batches=padded)
    assert all(v > 0 for v in t.values())
    # timed on a second pass (kernels built by the first), one time per batch after the warm-up
    assert len(train_precision.time_training_steps(cfg, padded, "bf16", warm=True)) == 2
    assert len(train_precision.time_training_steps(cfg, padded, "bf16")) == 2
    with pytest.raises(ValueError, match="same 3 batches"):
        train_precision.probe_step_times(cfg, plain, bf16_batches=padded[:2])


def test_padded_bf16_is_timed_warm_in_both_precisions(prepared: Path, monkeypatch) -> None:
    """With bf16's own padded batches, both processes time a second pass (kernels built by the
    first), fp32 on its unpadded batches and bf16 on the padded ones."""
    ds = SpeechDataset(prepared, "train", "st")
    order = batch_by_frames(ds.n_frames, 200, shuffle=False)[:3]
    plain = [collate(ds, idx) for idx in order]
    padded = [collate(ds, idx, pad_frames_to=64, pad_tokens_to=8) for idx in order]
    calls: list[tuple[str, bool, int]] = []

    def child(model_config, batches, amp, ctc_weight, warm=False):
        calls.append((amp, warm, batches[0].feats.shape[1]))
        return [1.0, 1.0] if amp == "none" else [0.5, 0.5]

    monkeypatch.setattr(train_precision, "_child_step_times", child)
    t = train_precision.probe_step_times({}, plain, bf16_batches=padded)
    assert t["speedup"] == pytest.approx(2.0)
    assert calls == [("none", True, plain[0].feats.shape[1]), ("bf16", True, padded[0].feats.shape[1])]
    assert padded[0].feats.shape[1] % 64 == 0
