"""Batch shapes rounded up (`train_*.pad_frames_to` / `pad_tokens_to`, lib/data/dataset.py `collate`):
the extra positions are padding, so a model in eval mode computes the same loss, also with CTC and
local attention; the options reach training and the `amp: auto` probe's cache key."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lib.train import precision  # the probe module; re-exports resolve_amp, resolve_padding, BF16_PAD_TO
from lib.data.dataset import PAD_ID, SpeechDataset, batch_by_frames, collate, first_batches
from lib.model.config import model_config
from lib.model.s2t_transformer import S2TTransformer
from lib.params import TrainConfig
from lib.train.loop import Criterion


def test_shapes_are_rounded_up_and_the_extra_positions_are_padding(prepared: Path) -> None:
    ds = SpeechDataset(prepared, "train", "st")
    idx = batch_by_frames(ds.n_frames, 400, shuffle=False)[0]
    plain, padded = collate(ds, idx), collate(ds, idx, pad_frames_to=64, pad_tokens_to=8)
    T, L = plain.feats.shape[1], plain.target.shape[1]
    assert padded.feats.shape[1] % 64 == 0 and T <= padded.feats.shape[1] < T + 64
    assert padded.target.shape[1] % 8 == 0 and L <= padded.target.shape[1] < L + 8
    assert torch.equal(padded.feats[:, :T], plain.feats) and not padded.feats[:, T:].any()
    assert torch.equal(padded.target[:, :L], plain.target) and (padded.target[:, L:] == PAD_ID).all()
    assert torch.equal(padded.prev_tokens[:, :L], plain.prev_tokens) and (padded.prev_tokens[:, L:] == PAD_ID).all()
    assert torch.equal(padded.feat_lengths, plain.feat_lengths)
    assert torch.equal(padded.target_lengths, plain.target_lengths)
    with pytest.raises(ValueError, match="pad_frames_to"):
        collate(ds, idx, pad_frames_to=0)


@pytest.mark.parametrize("attention", ["full", "local"])
def test_padding_leaves_the_eval_loss_unchanged(prepared: Path, attention: str) -> None:
    ds = SpeechDataset(prepared, "train", "asr")
    specs = [{"type": "full"}, {"type": "local", "window": 3}] if attention == "local" else None
    cfg = model_config("tiny", vocab_size=ds.vocab_size, ctc_vocab_size=ds.vocab_size, encoder_attention=specs)
    torch.manual_seed(0)
    crit = Criterion(S2TTransformer(cfg).eval(), 0.1, 0.3)
    checked = 0
    for idx in batch_by_frames(ds.n_frames, 300, shuffle=False):
        with torch.no_grad():
            ref, ref_parts = crit(collate(ds, idx))
            got, got_parts = crit(collate(ds, idx, pad_frames_to=48, pad_tokens_to=5))
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
        assert got_parts["ctc"] == pytest.approx(ref_parts["ctc"], rel=1e-5)
        checked += 1
    assert checked >= 2


def test_the_params_reject_a_zero_multiple() -> None:
    TrainConfig(pad_frames_to=64, pad_tokens_to=8).validate("train_st")
    TrainConfig(pad_frames_to="auto", pad_tokens_to="auto").validate("train_st")
    with pytest.raises(ValueError, match="train_asr.pad_frames_to must be an integer >= 1 or 'auto'"):
        TrainConfig(pad_frames_to="always").validate("train_asr")
    with pytest.raises(ValueError, match="train_st.pad_tokens_to"):
        TrainConfig(pad_tokens_to=0).validate("train_st")


def test_padding_is_part_of_the_probe_cache_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    monkeypatch.setattr(precision, "resolve_amp", lambda amp, device: "bf16")
    calls: list[int] = []
    monkeypatch.setattr(precision, "probe_step_times",
                        lambda cfg, batches, ctc_weight=0.0, bf16_batches=None: calls.append(1) or {"none": 2.0, "bf16": 1.0, "speedup": 2.0})

    def resolve(pad_to: tuple[int, int]) -> str:
        return precision.resolve_train_amp("probe", torch.device("cpu"), {"d_model": 16}, 400,
                                           probe_batches=lambda: [object()] * precision.PROBE_MIN_BATCHES,
                                           pad_to=pad_to)

    assert resolve((1, 1)) == "bf16" and resolve((1, 1)) == "bf16"
    assert len(calls) == 1  # cached
    assert resolve((64, 8)) == "bf16"
    assert len(calls) == 2  # another shape regime: measured again
    assert len(list((tmp_path / "precision").glob("train-*.json"))) == 2


def test_first_batches_are_the_first_batches_of_a_shuffled_epoch(prepared: Path) -> None:
    """What the `amp: auto` probe times: the epoch's first batches, in its order, padded as asked."""
    ds = SpeechDataset(prepared, "train", "st")
    got = first_batches(ds, 200, 3, seed=2, pad_frames_to=64, pad_tokens_to=8)
    order = batch_by_frames(ds.n_frames, 200, shuffle=True, seed=2)[:3]
    assert [b.ids for b in got] == [[ds.rows[i]["id"] for i in idx] for idx in order]
    assert all(b.feats.shape[1] % 64 == 0 and b.target.shape[1] % 8 == 0 for b in got)
    assert [b.ids for b in first_batches(ds, 200, 3, seed=3)] != [b.ids for b in got]


def test_auto_padding_pads_only_bf16_training_on_a_cpu() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert precision.resolve_padding("auto", "auto", "bf16", cpu) == precision.BF16_PAD_TO == (64, 8)
    assert precision.resolve_padding("auto", "auto", "none", cpu) == (1, 1)
    assert precision.resolve_padding("auto", "auto", "bf16", cuda) == (1, 1)  # no per-shape kernels to reuse
    assert precision.resolve_padding(32, "auto", "none", cpu) == (32, 1)
    assert precision.resolve_padding(32, 4, "bf16", cpu) == (32, 4)  # explicit numbers as given


@pytest.mark.parametrize(("fp32", "bf16", "choice", "pad"), [(2.0, 1.0, "bf16", (64, 8)), (1.0, 1.0, "none", (1, 1))])
def test_auto_padding_probes_each_precision_on_the_batches_it_would_train_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fp32: float, bf16: float, choice: str, pad: tuple) -> None:
    """`pad_*: auto` with `amp: probe`: the probe times fp32 on unpadded batches and bf16 on padded
    ones; the run then trains with the padding of the precision chosen."""
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    monkeypatch.setattr(precision, "resolve_amp", lambda amp, device: "bf16")
    seen: dict[str, list] = {}

    def probe(cfg, batches, ctc_weight=0.0, bf16_batches=None):
        seen["none"], seen["bf16"] = batches, bf16_batches
        return {"none": fp32, "bf16": bf16, "speedup": fp32 / bf16}

    monkeypatch.setattr(precision, "probe_step_times", probe)
    cfg = TrainConfig(amp="probe", max_frames=400, pad_frames_to="auto", pad_tokens_to="auto")
    n = precision.PROBE_MIN_BATCHES
    got = precision.resolve_train_precision(cfg, torch.device("cpu"), {"d_model": 16}, lambda p: [p] * n, data_id="x")
    assert got == (choice, pad)
    assert seen == {"none": [(1, 1)] * n, "bf16": [(64, 8)] * n}
    # cached apart from a run that pads both precisions alike
    key = json.loads(next((tmp_path / "precision").glob("train-*.json")).read_text())["ident"]
    assert key["bf16_pad_to"] == [64, 8] and "pad_to" not in key
    explicit = TrainConfig(amp="probe", max_frames=400, pad_frames_to=64, pad_tokens_to=8)
    precision.resolve_train_precision(explicit, torch.device("cpu"), {"d_model": 16}, lambda p: [p] * n, data_id="x")
    assert seen == {"none": [(64, 8)] * n, "bf16": None}
    assert len(list((tmp_path / "precision").glob("train-*.json"))) == 2
