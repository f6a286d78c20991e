"""The attention variants' own parameters in an optimizer group of their own (lib.train.loop.make_optimizer,
``TrainConfig.variant_lr``): head-selection logits, band-prior logits and the predicted gate's vector and
bias step at ``variant_lr`` on the run's schedule, untouched by ``encoder_lr_scale`` /
``encoder_layer_lr_decay``, without weight decay; a model without them gets exactly the groups of before."""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

from lib.model.attention import VariantParameter, variant_parameters
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.params import TrainConfig
from lib.train.loop import encoder_lr_scales, make_optimizer, train_config_dict


def _groups_before(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """make_optimizer as it was before ``variant_lr`` existed (the reference of the default runs)."""
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in model.parameters())
    params: Any = model.parameters()
    if cfg.encoder_lr_scale != 1.0 or cfg.encoder_layer_lr_decay != 1.0:
        scales = encoder_lr_scales(model, cfg)
        groups: dict[float, list[nn.Parameter]] = {}
        for p in model.parameters():
            groups.setdefault(scales.get(id(p), 1.0), []).append(p)
        params = [{"params": ps, "lr_scale": scale} for scale, ps in groups.items()]
    return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay,
                            fused=fused or None)


def _plain(seed: int = 0) -> S2TTransformer:
    torch.manual_seed(seed)
    return S2TTransformer(model_config("tiny", vocab_size=24, ctc_vocab_size=24))


def _variants(seed: int = 0) -> S2TTransformer:
    """Every kind of variant parameter: band logits and a predicted gate (vector + bias) in the encoder,
    head logits in the decoder, a predicted gate in the cross-attention."""
    torch.manual_seed(seed)
    n = model_config("tiny", vocab_size=24).encoder_layers
    enc = [{"type": "smooth", "prior": "band", "k": 5}] + \
          [{"type": "smooth", "prior": "prev", "recursive": True, "gamma": "predicted"}] * (n - 1)
    return S2TTransformer(model_config(
        "tiny", vocab_size=24, n_heads=4, decoder_layers=2, encoder_attention=enc,
        decoder_self_attention={"type": "head_select", "strategy": "group", "candidates": 8, "tasks": 2},
        cross_attention={"type": "smooth", "prior": "prev", "recursive": True, "gamma": "predicted", "layers": [2]}))


def _structure(opt: torch.optim.Optimizer) -> list[dict]:
    return [{**{k: v for k, v in g.items() if k != "params"}, "params": [id(p) for p in g["params"]]}
            for g in opt.param_groups]


SCALES = [dict(), dict(encoder_lr_scale=0.2), dict(encoder_lr_scale=0.2, encoder_layer_lr_decay=0.9)]


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("variant_lr", [None, 0.025])
def test_a_model_without_variant_parameters_gets_the_groups_of_before(scales: dict, variant_lr: float | None) -> None:
    cfg = TrainConfig(lr=1.5e-3, weight_decay=0.01, variant_lr=variant_lr, **scales)
    model = _plain()
    assert variant_parameters(model) == []
    new, old = make_optimizer(model, cfg), _groups_before(model, cfg)
    assert _structure(new) == _structure(old)
    # and two steps of each on copies of the model move every parameter identically
    a, b = _plain(), _plain()
    opt_a, opt_b = make_optimizer(a, cfg), _groups_before(b, cfg)
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        for pa, pb in zip(a.parameters(), b.parameters()):
            pa.grad = torch.randn(pa.shape, generator=g)
            pb.grad = pa.grad.clone()
        for opt in (opt_a, opt_b):
            for group in opt.param_groups:
                group["lr"] = cfg.lr * group.get("lr_scale", 1.0)
            opt.step()
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("scales", SCALES)
def test_variant_parameters_step_at_variant_lr_outside_the_encoder_scale_without_weight_decay(scales: dict) -> None:
    cfg = TrainConfig(lr=1.5e-3, weight_decay=0.01, variant_lr=0.025, **scales)
    model = _variants()
    variant = variant_parameters(model)
    names = {n.rsplit(".", 1)[-1] for n, _ in variant}
    assert names == {"head_logits", "band_logits", "gate_vector", "gate_bias"}  # every variant's own parameters
    assert all(isinstance(p, VariantParameter) for _, p in variant)
    assert any(n.startswith("encoder.") for n, _ in variant) and any(n.startswith("decoder.") for n, _ in variant)
    opt = make_optimizer(model, cfg)
    last = opt.param_groups[-1]
    assert last.get("variant") is True and [id(p) for p in last["params"]] == [id(p) for _, p in variant]
    assert last["weight_decay"] == 0.0 and last["lr_scale"] == pytest.approx(0.025 / 1.5e-3)
    ids = {id(p) for _, p in variant}
    for group in opt.param_groups[:-1]:  # the other groups: the grouping of before, minus the variant parameters
        assert not ids & {id(p) for p in group["params"]} and group["weight_decay"] == 0.01
    before = _groups_before(model, cfg)
    assert [[id(p) for p in g["params"] if id(p) not in ids] for g in before.param_groups] == \
           [[id(p) for p in g["params"]] for g in opt.param_groups[:-1]]
    # the training loop's lr: schedule x lr_scale -> variant_lr at the peak, whatever encoder_lr_scale is
    for group in opt.param_groups:
        group["lr"] = cfg.lr * group.get("lr_scale", 1.0)
    assert last["lr"] == pytest.approx(0.025)
    # a step: an encoder variant parameter moves by ~variant_lr (Adam's first step is lr x sign), weight decay 0
    band = dict(variant)["encoder.layers.0.self_attn.band_logits"]
    start = band.detach().clone()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    torch.testing.assert_close(start - band.detach(), torch.full_like(start, 0.025), rtol=1e-4, atol=0)


def test_variant_lr_none_keeps_variant_parameters_in_their_groups() -> None:
    cfg = TrainConfig(lr=1.5e-3, encoder_lr_scale=0.2)
    model = _variants()
    assert _structure(make_optimizer(model, cfg)) == _structure(_groups_before(model, cfg))


def test_variant_lr_validation_and_fingerprint() -> None:
    assert "variant_lr" not in train_config_dict(TrainConfig())  # None: the fingerprints of before
    assert train_config_dict(TrainConfig(variant_lr=0.025))["variant_lr"] == 0.025
    with pytest.raises(ValueError, match="variant_lr"):
        TrainConfig(variant_lr=0.0).validate("train_st")
    cfg = dataclasses.replace(TrainConfig(), variant_lr=0.025)
    assert copy.deepcopy(cfg) == cfg
