"""lib/analysis/peakiness.py: the per-layer diagonal weight and row entropy of the encoder
self-attention (the smoothing report's measure of Maekaku et al.'s Fig. 3 effect), computed from the very
weights the model returns, plus what smoothing modules learned (band logits, predicted g)."""
from __future__ import annotations

import math

import pytest
import torch

from lib.analysis.peakiness import attention_peakiness, layer_means, row_entropy
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.model.spec import smoothing_spec


class Features:
    """A dataset stand-in: ``features(i)`` of given lengths, seeded."""

    def __init__(self, lengths: list[int], n_mels: int = 80) -> None:
        g = torch.Generator().manual_seed(0)
        self.items = [torch.randn(t, n_mels, generator=g) for t in lengths]

    def __len__(self) -> int:
        return len(self.items)

    def features(self, i: int) -> torch.Tensor:
        return self.items[i]


def tiny(encoder_attention: list[dict] | None = None) -> S2TTransformer:
    torch.manual_seed(0)
    cfg = model_config("tiny", vocab_size=20, encoder_layers=3, encoder_attention=encoder_attention)
    return S2TTransformer(cfg).train()  # training mode on purpose: the measure must switch to eval


def test_row_entropy_by_hand() -> None:
    a = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    assert torch.allclose(row_entropy(a), torch.tensor([0.0, math.log(2), math.log(3)]))


def test_matches_a_direct_computation_from_the_returned_weights() -> None:
    model, data = tiny(), Features([40, 57, 23])
    out = attention_peakiness(model, data, n=2)
    assert model.training  # restored
    assert out["sentences"] == 2
    model.eval()
    diag, ent, rows = [0.0] * 3, [0.0] * 3, 0
    with torch.no_grad():
        for i in range(2):
            x = data.features(i)[None]
            enc = model.encode(x, torch.tensor([x.shape[1]]), need_weights=True)
            n = int(enc.lengths[0])
            rows += n
            for li, w in enumerate(enc.attn_weights):
                a = w[0].double()  # (H, n, n)
                diag[li] += float(torch.diagonal(a, dim1=-2, dim2=-1).mean(0).sum())
                ent[li] += float((-(a * a.log()).sum(-1)).mean(0).sum())
    assert out["attn_diag"] == pytest.approx([d / rows for d in diag], abs=1e-5)
    assert out["attn_entropy"] == pytest.approx([e / rows for e in ent], abs=1e-5)
    # a fresh model attends almost uniformly: entropy close to that of uniform attention
    assert all(abs(e - out["uniform_entropy"]) < 0.1 for e in out["attn_entropy"])
    assert out["band_logits"] == [None] * 3 and out["gate_mean"] == [None] * 3


def test_smoothing_lowers_the_diagonal_of_peaked_attention() -> None:
    """γ = 1 with a uniform prior makes every row uniform: diag = mean 1/N, entropy = log N."""
    spec = smoothing_spec([{"type": "full"}] * 3, {"prior": "uniform", "gamma": 1.0}, 3)
    model, data = tiny(spec), Features([45])
    out = attention_peakiness(model, data, n=5)
    n = model.eval().encode(data.features(0)[None], torch.tensor([45])).lengths[0].item()
    assert out["attn_diag"] == pytest.approx([1 / n] * 3, abs=1e-5)
    assert out["attn_entropy"] == pytest.approx([math.log(n)] * 3, abs=1e-5)


def test_records_band_logits_and_predicted_gates_and_unpatches() -> None:
    spec = smoothing_spec([{"type": "full"}] * 3, {"prior": "prev", "recursive": True, "gamma": "predicted"}, 3)
    spec[0] = {"type": "smooth", "prior": "band", "gamma": 0.1, "k": 5}
    model = tiny(spec)
    with torch.no_grad():
        model.encoder.layers[0].self_attn.band_logits.copy_(torch.arange(5.0))
    out = attention_peakiness(model, Features([30, 33]), n=2)
    assert out["band_logits"][0] == [0.0, 1.0, 2.0, 3.0, 4.0] and out["band_logits"][1:] == [None, None]
    assert out["gate_mean"][0] is None
    assert out["gate_mean"][1:] == [0.1, 0.1] and out["gate_std"][1:] == [0.0, 0.0]  # c = 0, b = logit(0.1) -> g = γ = 0.1
    assert "gate" not in vars(model.encoder.layers[1].self_attn)  # the recording wrapper is gone


def test_layer_means() -> None:
    assert layer_means([1.0, None, 3.0, 5.0], [2, 3, 4]) == 4.0
    assert layer_means([None, None], [1, 2]) is None


def test_empty_dataset_is_an_error() -> None:
    with pytest.raises(ValueError, match="no sentences"):
        attention_peakiness(tiny(), Features([]), n=3)
