"""Adding an encoder attention variant touches its module, its options and its test: here all three
live in this file. The toy variant (local attention with a learned per-head temperature) registers
itself, is built from a spec, gets its own optimizer group, trains, and round-trips through the model
file, with no edit anywhere else in lib/."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lib.model import checkpoint as model_file
from lib.model.attention import ATTENTION_VARIANTS, LocalAttention, VariantParameter, register_attention
from lib.model.s2t_transformer import model_config
from lib.params import TrainConfig
from lib.train.loop import make_optimizer


@pytest.fixture
def tempered_local(monkeypatch: pytest.MonkeyPatch) -> type:
    monkeypatch.setattr("lib.model.attention.base.ATTENTION_VARIANTS", dict(ATTENTION_VARIANTS))

    # the variant's module: one class; its options are its keyword arguments
    @register_attention("tempered_local")
    class TemperedLocal(LocalAttention):
        def __init__(self, d_model: int, n_heads: int, dropout: float, *, window: int, init_temperature: float = 1.0,
                     rel_pos_max: int = 0) -> None:
            super().__init__(d_model, n_heads, dropout, window=window)
            if not init_temperature > 0:
                raise ValueError(f"tempered_local: init_temperature must be > 0, got {init_temperature!r}")
            self.log_temperature = VariantParameter(torch.full((n_heads, 1, 1), float(init_temperature)).log())

        def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
            q = q / self.log_temperature.exp()  # (B, H, N, dh) / (H, 1, 1)
            return super().attend(q, k, v, key_padding_mask, need_weights=need_weights)

    return TemperedLocal


def _model(kind: str, **opts):
    torch.manual_seed(0)
    specs = [{"type": "full"}, {"type": kind, "window": 3, **opts}]
    cfg = model_config("tiny", vocab_size=20, encoder_layers=2, decoder_layers=1, encoder_attention=specs)
    return model_file.build_model(cfg), cfg


def test_a_toy_variant_plugs_in_without_edits_elsewhere(tempered_local: type, tmp_path: Path) -> None:
    model, cfg = _model("tempered_local", init_temperature=2.0)
    assert isinstance(model.encoder.layers[1].self_attn, tempered_local)
    # its parameter gets the variants' optimizer group
    opt = make_optimizer(model, TrainConfig(lr=1e-3, variant_lr=0.05))
    group = opt.param_groups[-1]
    assert group.get("variant") is True and [p.shape for p in group["params"]] == [(cfg.n_heads, 1, 1)]
    # it trains: the temperature moves
    feats, lengths = torch.randn(2, 40, 80), torch.tensor([40, 32])
    tokens = torch.randint(4, 20, (2, 5))
    before = model.encoder.layers[1].self_attn.log_temperature.detach().clone()
    model.train()
    model(feats, lengths, tokens).float().logsumexp(-1).mean().backward()
    opt.step()
    assert not torch.equal(before, model.encoder.layers[1].self_attn.log_temperature.detach())
    # the model file rebuilds it from the config it carries
    model_file.save_model(tmp_path / "model.pt", model, cfg, task="st")
    back, _ = model_file.load_model(tmp_path / "model.pt")
    assert isinstance(back.encoder.layers[1].self_attn, tempered_local)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(back(feats, lengths, tokens), model(feats, lengths, tokens))


def test_a_toy_variants_options_are_checked_where_it_is_built(tempered_local: type) -> None:
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['temperature'\] for attention type 'tempered_local'"):
        _model("tempered_local", temperature=2.0)
    with pytest.raises(ValueError, match="init_temperature must be > 0"):
        _model("tempered_local", init_temperature=0.0)
