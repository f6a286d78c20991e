"""The `local` attention variant inside the model: exactness, checkpoint compatibility, spec errors."""
from __future__ import annotations

import pytest
import torch

from lib.model.checkpoint import load_decoder_layers, load_encoder
from lib.model.attention import FullAttention, LocalAttention, build_attention
from lib.model.local_attention import (
    band_mask,
)
from lib.model.s2t_transformer import S2TTransformer, model_config


def _pair(window: int) -> tuple[FullAttention, LocalAttention]:
    torch.manual_seed(0)
    full = FullAttention(16, 2, 0.0)
    local = LocalAttention(16, 2, 0.0, window=window)
    local.load_state_dict(full.state_dict(), strict=True)  # same parameter names and shapes
    return full.eval(), local.eval()


def test_local_equals_full_when_window_covers_sequence() -> None:
    full, local = _pair(window=21)
    x = torch.randn(2, 9, 16)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True
    a, b = full(x, pad).out, local(x, pad).out
    assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[1, :6], b[1, :6], atol=1e-5)


def test_local_weights_are_the_band_of_full_softmax() -> None:
    _, local = _pair(window=3)
    x = torch.randn(1, 7, 16)
    out = local(x, None, need_weights=True)
    w = out.weights  # (1, 2, 7, 7)
    assert w.shape == (1, 2, 7, 7)
    assert torch.all(w[..., ~band_mask(7, 3)] == 0)
    assert torch.allclose(w.sum(-1), torch.ones(1, 2, 7), atol=1e-6)


@pytest.mark.parametrize("window", [0, -3, 4, 2.0, True])
def test_bad_window_spec(window) -> None:
    with pytest.raises(ValueError, match="window"):
        build_attention({"type": "local", "window": window}, 16, 2, 0.0)


def test_full_checkpoint_loads_into_local_model() -> None:
    full_cfg = model_config("tiny", vocab_size=20)
    local_cfg = model_config("tiny", vocab_size=20, encoder_attention=[{"type": "full"}, {"type": "local", "window": 3}])
    full_model, local_model = S2TTransformer(full_cfg), S2TTransformer(local_cfg)
    local_model.load_state_dict(full_model.state_dict(), strict=True)
    report = load_encoder(local_model, full_model.state_dict())
    assert not report.missing
    feats, lengths = torch.randn(2, 40, 80), torch.tensor([40, 31])
    logits = local_model.eval()(feats, lengths, torch.tensor([[2, 5, 6], [2, 7, 1]]))
    assert torch.isfinite(logits).all()
