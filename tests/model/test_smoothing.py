"""Attention-weight smoothing with prior distributions (Maekaku et al.; docs/variants.md): encoder
self-attention (lib.model.attention.SmoothedAttention, band_logit_matrix, lib.model.spec.smoothing_spec)
and the decoder side (lib.model.attention.smoothing.SmoothedMultiheadAttention, decoder_smoothing_specs).

Item numbers refer to the spec's docs/variants.md list. float64 wherever exactness matters."""

from __future__ import annotations

import math

import pytest
import torch

from lib.model.checkpoint import load_decoder_layers, load_encoder
from lib.model.attention import (
    ATTENTION_VARIANTS,
    FullAttention,
    LocalAttention,
    SmoothedAttention,
    band_logit_matrix,
    build_attention,
)
from lib.model.config import BAND_INIT_LOGIT
from lib.model.dropout import dropout
from lib.model.s2t_transformer import (
    ModelConfig,
    S2TTransformer,
    model_config,
)
from lib.model.attention import MultiheadAttention, SmoothedMultiheadAttention
from lib.model.spec import decoder_smoothing_specs, local_attention_spec, smoothing_spec

D, H = 16, 2
DH = D // H
F64 = torch.float64
# One spec per prior (band with k = 3 so that the band is narrower than the test sequences).
PRIORS: dict[str, dict] = {
    "uniform": {"prior": "uniform"},
    "band": {"prior": "band", "k": 3},
    "prev": {"prior": "prev"},
    "rec": {"prior": "prev", "recursive": True},
    "predicted": {"prior": "prev", "recursive": True, "gamma": "predicted"},
}


def _smooth(name: str, *, gamma: float = 0.3, window: int | None = None, seed: int = 0, dropout_p: float = 0.0,
            **extra) -> SmoothedAttention:
    """A float64 smoothing module in eval mode; band logits / gate vector random (not their zero init)."""
    spec = {"type": "smooth", "gamma": gamma, **PRIORS[name], **extra}
    if window is not None:
        spec["window"] = window
    torch.manual_seed(seed)
    m = build_attention(spec, D, H, dropout_p).to(F64).eval()
    with torch.no_grad():
        if m.band_logits is not None:
            m.band_logits.copy_(torch.randn(m.band_logits.shape, dtype=F64))
        if m.gate_vector is not None:
            m.gate_vector.copy_(0.3 * torch.randn(m.gate_vector.shape, dtype=F64))
    return m


def _plain(m: SmoothedAttention) -> FullAttention | LocalAttention:
    """The unsmoothed layer with the same projections (full, or local with the same window)."""
    plain = FullAttention(D, H, 0.0) if m.window is None else LocalAttention(D, H, 0.0, window=m.window)
    plain.load_state_dict(m.state_dict(), strict=False)  # band_logits / gate_vector are variant-only
    return plain.to(F64).eval()


def _batch(lengths: list[int], n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), n, D, generator=g, dtype=F64)
    mask = torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]  # (B, N) True = padding
    return x.masked_fill(mask[..., None], 1e3), mask  # garbage in padded frames must not matter


def _prev(x: torch.Tensor, mask: torch.Tensor | None, seed: int = 7) -> torch.Tensor:
    """Weights of a full-attention layer below (what the encoder hands on as prev_attn)."""
    torch.manual_seed(seed)
    below = FullAttention(D, H, 0.0).to(F64).eval()
    return below(x, mask, need_weights=True).weights.detach()


def _window(n: int, w: int) -> torch.Tensor:
    i = torch.arange(n)
    return (i[:, None] - i[None, :]).abs() <= (w - 1) // 2  # (N, N)


def _seed_band(b: list[float], n: int) -> torch.Tensor:
    """The seed's literal construction: zero (N, N+k-1), b in columns i..i+k-1 of row i, keep N
    columns from the ceil(k/2)-th (1-based)."""
    k = len(b)
    z = torch.zeros(n, n + k - 1, dtype=F64)
    for i in range(n):
        z[i, i:i + k] += torch.tensor(b, dtype=F64)
    c0 = math.ceil(k / 2) - 1
    return z[:, c0:c0 + n]


# ------------------------------------------------------------------------ 1. rows, padding, NaN


@pytest.mark.parametrize("window", [None, 3], ids=["full", "local3"])
@pytest.mark.parametrize("name", list(PRIORS))
def test_rows_sum_to_one_padded_keys_zero_no_nan(name: str, window: int | None) -> None:
    lengths, n = [7, 4, 1, 0], 7  # a length-1 sample and an all-padding sample
    x, mask = _batch(lengths, n)
    m = _smooth(name, window=window)
    prev = _prev(x, mask).requires_grad_(True)
    res = m(x, mask, prev_attn=prev, need_weights=True)
    w = res.weights  # (B, H, N, N)
    assert w.shape == (4, H, n, n)
    for t in (w, res.carry, res.out):
        assert torch.isfinite(t).all()
    valid_q = (~mask)[:, None, :].expand(4, H, n)  # (B, H, N)
    torch.testing.assert_close(w.sum(-1)[valid_q], torch.ones(int(valid_q.sum()), dtype=F64), atol=1e-6, rtol=0)
    pad_keys = mask[:, None, None, :].expand_as(w)
    assert (w[pad_keys] == 0).all()  # every row, padded queries included
    assert (w[3] == 0).all()  # the all-padding sample: finite all-zero rows
    if window is not None:
        assert (w[..., ~_window(n, window)] == 0).all()
    # no NaN in the backward either (the window renormalisation divides by row sums that can be 0),
    # even with gradient arriving on padded rows
    res.out.sum().backward()
    grads = [p.grad for p in m.parameters()] + ([prev.grad] if m.prior == "prev" else [])
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


# ------------------------------------------------------------------------ 2. padding invariance


@pytest.mark.parametrize("window", [None, 3], ids=["full", "local3"])
@pytest.mark.parametrize("name", list(PRIORS))
def test_padding_invariance(name: str, window: int | None) -> None:
    """A sample alone == the same sample in a padded batch (1/T_b, masked band softmax, masked priors)."""
    lengths, n = [9, 5, 2], 9
    x, mask = _batch(lengths, n, seed=1)
    m = _smooth(name, window=window)
    out = m(x, mask, prev_attn=_prev(x, mask)).out
    for b, t in enumerate(lengths):
        xb = x[b:b + 1, :t]
        alone = m(xb, None, prev_attn=_prev(xb, None)).out
        torch.testing.assert_close(out[b, :t], alone[0], atol=1e-5, rtol=1e-5)


def test_padding_invariance_in_the_encoder() -> None:
    """Through a whole encoder (prev priors get the layer below's carry), float32 as trained."""
    specs = [{"type": "full"}, {"type": "smooth", "prior": "prev", "recursive": True, "gamma": "predicted"},
             {"type": "smooth", "prior": "band", "gamma": 0.2, "k": 5, "window": 3},
             {"type": "smooth", "prior": "prev", "gamma": 0.3}, {"type": "smooth", "prior": "uniform", "gamma": 0.1}]
    torch.manual_seed(0)
    model = S2TTransformer(model_config("tiny", vocab_size=11, encoder_layers=5, encoder_attention=specs)).eval()
    with torch.no_grad():
        model.encoder.layers[1].self_attn.gate_vector.normal_()
        model.encoder.layers[2].self_attn.band_logits.normal_()
    g = torch.Generator().manual_seed(0)
    feats, lengths = torch.randn(3, 41, 80, generator=g), torch.tensor([41, 23, 9])
    enc = model.encode(feats, lengths)
    for b in range(3):
        alone = model.encode(feats[b:b + 1, :int(lengths[b])], lengths[b:b + 1])
        n = int(enc.lengths[b])
        torch.testing.assert_close(enc.out[b, :n], alone.out[0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------ 3. band matrix by hand


def test_band_matrix_by_hand() -> None:
    bl, inside = band_logit_matrix(torch.tensor([1.0, 2.0, 3.0], dtype=F64), 4)
    assert bl.tolist() == [[2, 3, 0, 0], [1, 2, 3, 0], [0, 1, 2, 3], [0, 0, 1, 2]]
    assert inside.tolist() == [[i - 1 <= j <= i + 1 for j in range(4)] for i in range(4)]
    assert band_logit_matrix(torch.tensor([1.0, 2, 3, 4, 5], dtype=F64), 2)[0].tolist() == [[3, 4], [2, 3]]
    # even k, builder called directly: lopsided one step to the future
    assert band_logit_matrix(torch.tensor([1.0, 2, 3, 4], dtype=F64), 4)[0].tolist() == [
        [2, 3, 4, 0], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 1, 2]]
    # the closed form is the paper's construction, for all small N and k
    for k in range(1, 9):
        b = [float(v) for v in range(1, k + 1)]
        for n in range(1, 9):
            torch.testing.assert_close(band_logit_matrix(torch.tensor(b, dtype=F64), n)[0], _seed_band(b, n),
                                       rtol=0, atol=0)
    # a leading head dimension is kept (per_head)
    bh = torch.tensor([[1.0, 2, 3], [4, 5, 6]], dtype=F64)
    assert band_logit_matrix(bh, 3)[0][1].tolist() == [[5, 6, 0], [4, 5, 6], [0, 4, 5]]


def test_band_prior_by_hand() -> None:
    m = _smooth("band")
    with torch.no_grad():
        m.band_logits.copy_(torch.tensor([1.0, 2.0, 3.0]))
    p = m.prior_weights(m.allowed_keys(None, 4, torch.device("cpu")), None, F64)  # (1, 1, 4, 4)
    e = math.e
    row0 = torch.tensor([e**2, e**3, 1.0, 1.0], dtype=F64) / (e**2 + e**3 + 2)
    torch.testing.assert_close(p[0, 0, 0], row0, rtol=0, atol=1e-15)
    # padding: the same logits, softmax over the valid keys only
    pad = torch.tensor([[False, False, False, True]])
    p = m.prior_weights(m.allowed_keys(pad, 4, torch.device("cpu")), None, F64)
    torch.testing.assert_close(p[0, 0, 0], torch.tensor([e**2, e**3, 1.0, 0.0], dtype=F64) / (e**2 + e**3 + 1),
                               rtol=0, atol=1e-15)


def test_even_k_rejected() -> None:
    with pytest.raises(ValueError, match=r"smooth\.k"):
        build_attention({"type": "smooth", "prior": "band", "k": 4}, D, H, 0.0)
    with pytest.raises(ValueError, match=r"smoothing\.defs\.band\.k"):
        smoothing_spec([{"type": "full"}] * 3, {"prior": "band", "k": 4}, 3, key="smoothing.defs.band")


# ------------------------------------------------------------------------ 4. band = 0 -> uniform; masked band


@pytest.mark.parametrize("window", [None, 3], ids=["full", "local3"])
def test_zero_band_logits_equal_uniform(window: int | None) -> None:
    x, mask = _batch([8, 5], 8, seed=2)
    band = _smooth("band", window=window)
    with torch.no_grad():
        band.band_logits.zero_()
    uni = _smooth("uniform", window=window)
    uni.load_state_dict(band.state_dict(), strict=False)
    a, b = band(x, mask, need_weights=True), uni(x, mask, need_weights=True)
    torch.testing.assert_close(a.weights, b.weights, rtol=0, atol=1e-15)
    torch.testing.assert_close(a.out, b.out, rtol=0, atol=1e-13)


def test_masked_band_rows_are_zero_off_band() -> None:
    x, mask = _batch([8, 5], 8, seed=3)
    m = _smooth("band", band_outside="masked", gamma=1.0)
    p = m.prior_weights(m.allowed_keys(mask, 8, x.device), None, F64)  # (B, 1, N, N)
    off_band = ~_window(8, 3)
    assert (p[..., off_band] == 0).all()
    valid_q = ~mask
    torch.testing.assert_close(p.sum(-1)[:, 0][valid_q], torch.ones(int(valid_q.sum()), dtype=F64))
    assert (m(x, mask, need_weights=True).weights[..., off_band] == 0).all()  # γ = 1: A' = P
    literal = _smooth("band", gamma=1.0)  # the default: logit 0 off band, mass there
    assert (literal(x, mask, need_weights=True).weights[0][..., off_band] > 0).all()


# ------------------------------------------------------------------------ 5. γ = 0 and γ = 1


@pytest.mark.parametrize("window", [None, 3], ids=["full", "local3"])
@pytest.mark.parametrize("name", ["uniform", "band", "prev", "rec"])
def test_gamma_zero_is_base_attention_and_gamma_one_is_prior(name: str, window: int | None) -> None:
    x, mask = _batch([9, 6], 9, seed=4)
    valid = ~mask
    prev = _prev(x, mask)
    m0 = _smooth(name, gamma=0.0, window=window)
    plain = _plain(m0)
    a, b = m0(x, mask, prev_attn=prev, need_weights=True), plain(x, mask, need_weights=True)
    torch.testing.assert_close(a.out[valid], b.out[valid], rtol=0, atol=1e-12)
    q_valid = valid[:, None, :, None]
    torch.testing.assert_close(a.weights * q_valid, b.weights * q_valid, rtol=0, atol=1e-12)

    m1 = _smooth(name, gamma=1.0, window=window)
    res = m1(x, mask, prev_attn=prev, need_weights=True)
    p = m1.prior_weights(m1.allowed_keys(mask, 9, x.device), prev, F64).expand(2, H, 9, 9)
    _, _, v = m1._project(x)
    expected = m1.out_proj(m1._merge(p @ v))
    torch.testing.assert_close(res.weights, p, rtol=0, atol=0)
    torch.testing.assert_close(res.out, expected, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------ 6. relaxed attention, train_only


@pytest.mark.parametrize("window", [None, 3], ids=["full", "local3"])
def test_relaxed_train_only(window: int | None) -> None:
    x, mask = _batch([9, 4], 9, seed=5)
    m = _smooth("uniform", gamma=0.25, window=window, train_only=True)
    plain = _plain(m)
    for need in (False, True):  # eval: exactly the plain layer (same code path)
        a, b = m(x, mask, need_weights=need), plain(x, mask, need_weights=need)
        assert torch.equal(a.out, b.out)
        assert (a.weights is None and b.weights is None) or torch.equal(a.weights, b.weights)
    m.train()  # dropout 0: the manual formula
    q, k, v = m._project(x)
    allowed = ~mask[:, None, None, :] & (_window(9, window) if window else torch.ones(9, 9, dtype=torch.bool))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(DH)
    a = torch.softmax(scores.masked_fill(~allowed, -math.inf), -1)  # (B, H, N, N)
    t = allowed.sum(-1, keepdim=True).to(F64)  # T_b (or |W_i|)
    eff = 0.75 * a + 0.25 * allowed.to(F64) / t
    res = m(x, mask, need_weights=True)
    valid = ~mask
    torch.testing.assert_close(res.weights[valid[:, None].expand(2, H, 9)], eff[valid[:, None].expand(2, H, 9)],
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(res.out[valid], m.out_proj(m._merge(eff @ v))[valid], rtol=0, atol=1e-12)


def test_dropout_is_applied_to_the_smoothed_weights() -> None:
    x, mask = _batch([6, 4], 6, seed=6)
    m = _smooth("band", dropout_p=0.5).train()
    torch.manual_seed(3)
    res = m(x, mask, need_weights=True)
    _, _, v = m._project(x)
    torch.manual_seed(3)
    expected = m.out_proj(m._merge(dropout(res.weights, 0.5, True) @ v))  # weights: A' before dropout
    torch.testing.assert_close(res.out, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(res.weights.sum(-1)[0], torch.ones(H, 6, dtype=F64))


# ------------------------------------------------------------------------ 7. recursion and carry


def _encoder(specs: list[dict], seed: int = 0) -> tuple[S2TTransformer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = S2TTransformer(model_config("tiny", vocab_size=11, encoder_layers=len(specs),
                                        encoder_attention=specs)).to(F64).eval()
    g = torch.Generator().manual_seed(seed)
    return model, torch.randn(2, 37, 80, generator=g, dtype=F64), torch.tensor([37, 21])


def _raw_weights(model: S2TTransformer, enc) -> list[torch.Tensor]:
    """Each layer's raw softmax A_l, recomputed by an independent full-attention module."""
    raws = []
    for layer, x in zip(model.encoder.layers, enc.layer_inputs):
        full = FullAttention(D, H, 0.0).to(F64).eval()
        full.load_state_dict(layer.self_attn.state_dict(), strict=False)
        raws.append(full(layer.self_attn_layer_norm(x), enc.padding_mask, need_weights=True).weights)
    return raws


def test_recursive_smoothing_closed_form() -> None:
    g = 0.3
    rec = {"type": "smooth", "prior": "prev", "recursive": True, "gamma": g}
    model, feats, lengths = _encoder([{"type": "full"}, rec, rec, rec])
    enc = model.encode(feats, lengths, need_weights=True)
    a1, a2, a3, a4 = _raw_weights(model, enc)
    closed = (1 - g) * a4 + g * (1 - g) * a3 + g**2 * (1 - g) * a2 + g**3 * a1  # docs/variants.md
    valid_q = (~enc.padding_mask)[:, None, :, None]
    torch.testing.assert_close(enc.attn_weights[3] * valid_q, closed * valid_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(enc.attn_weights[0], a1, rtol=0, atol=1e-12)  # unsmoothed layer: raw
    # computing weights for the analysis does not change the output
    torch.testing.assert_close(model.encode(feats, lengths).out, enc.out, rtol=0, atol=1e-10)


def test_non_recursive_carry_is_the_raw_weights() -> None:
    """A'_3 = (1-γ) A_3 + γ A_2 with the *raw* A_2, although layer 2 is itself smoothed (A9)."""
    g = 0.4
    nonrec = {"type": "smooth", "prior": "prev", "gamma": g}
    model, feats, lengths = _encoder([{"type": "full"}, nonrec, nonrec])
    enc = model.encode(feats, lengths, need_weights=True)
    a1, a2, a3 = _raw_weights(model, enc)
    valid_q = (~enc.padding_mask)[:, None, :, None]
    torch.testing.assert_close(enc.attn_weights[1] * valid_q, ((1 - g) * a2 + g * a1) * valid_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(enc.attn_weights[2] * valid_q, ((1 - g) * a3 + g * a2) * valid_q, rtol=0, atol=1e-6)
    smoothed_2 = (1 - g) * a2 + g * a1  # what recursion would have used instead
    assert not torch.allclose(enc.attn_weights[2] * valid_q, ((1 - g) * a3 + g * smoothed_2) * valid_q, atol=1e-6)


@pytest.mark.parametrize("name, carry_is_raw", [("uniform", False), ("band", False), ("prev", True), ("rec", False),
                                                ("predicted", False)])
def test_module_carry(name: str, carry_is_raw: bool) -> None:
    """docs/variants.md: carry = raw A_l for non-recursive prev, A'_l otherwise; the weights are always A'_l."""
    x, mask = _batch([6, 3], 6, seed=8)
    m = _smooth(name)
    res = m(x, mask, prev_attn=_prev(x, mask), need_weights=True)
    raw = _plain(m)(x, mask, need_weights=True).weights
    valid_q = (~mask)[:, None, :, None]
    assert not torch.allclose(res.weights * valid_q, raw * valid_q)
    expected = raw if carry_is_raw else res.weights
    torch.testing.assert_close(res.carry * valid_q, expected * valid_q, rtol=0, atol=1e-12)
    assert m.needs_prev_attn is (m.prior == "prev")


@pytest.mark.parametrize("window", [None, 3], ids=["full", "local3"])
def test_gradient_flows_through_the_prior(window: int | None) -> None:
    """The previous layer's weights are not detached (end-to-end, docs/variants.md)."""
    x, mask = _batch([5, 4], 5)
    prev = _prev(x, mask).requires_grad_(True)
    _smooth("prev", window=window)(x, mask, prev_attn=prev).out[~mask].sum().backward()
    assert prev.grad is not None and prev.grad.abs().sum() > 0


def test_prev_prior_without_a_layer_below_is_an_error() -> None:
    model, feats, lengths = _encoder([{"type": "smooth", "prior": "prev"}, {"type": "full"}])
    with pytest.raises(ValueError, match="no layer below"):
        model.encode(feats, lengths)


# ------------------------------------------------------------------------ 8. predicted coefficient


def test_predicted_gate() -> None:
    x, mask = _batch([5, 3], 5, seed=9)
    m = _smooth("predicted")
    q, _, _ = m._project(x)
    g = m.gate(q)
    assert g.shape == (2, H, 5, 1)
    for h in range(H):  # σ(q_h · c_h) by hand
        c_h = m.gate_vector[h * DH:(h + 1) * DH]
        torch.testing.assert_close(g[:, h, :, 0], torch.sigmoid(q[:, h] @ c_h + m.gate_bias[h]), rtol=0, atol=1e-15)
    g_valid = g[:, :, :, 0].transpose(1, 2)[~mask]  # moderate inputs (not the 1e3 padding frames)
    assert ((g_valid > 0) & (g_valid < 1)).all()
    # A' = (1 - g) A + g Ā_{l-1}, row by row
    prev = _prev(x, mask)
    res = m(x, mask, prev_attn=prev, need_weights=True)
    raw = _plain(m)(x, mask, need_weights=True).weights
    valid_q = (~mask)[:, None, :, None]
    torch.testing.assert_close(res.weights * valid_q, ((1 - g) * raw + g * prev) * valid_q, rtol=0, atol=1e-12)
    # c = 0 and b = logit(γ) -> g = γ = 0.1 (gate_init's default) for any query: where the fixed-γ systems start
    fresh = build_attention({"type": "smooth", "prior": "prev", "recursive": True, "gamma": "predicted"}, D, H, 0.0)
    assert fresh.gate_vector.shape == (D,) and (fresh.gate_vector == 0).all()
    assert fresh.gate_bias.shape == (H,) and fresh.gate_init == 0.1
    torch.testing.assert_close(fresh.gate(q.float()), torch.full((2, H, 5, 1), 0.1), rtol=0, atol=1e-7)


def test_predicted_gate_is_per_head() -> None:
    """With identical query heads, g differs between heads exactly when the head chunks of c differ."""
    m = _smooth("predicted")
    with torch.no_grad():
        m.q_proj.weight[DH:] = m.q_proj.weight[:DH]
        m.q_proj.bias[DH:] = m.q_proj.bias[:DH]
        m.gate_vector[DH:] = m.gate_vector[:DH]
        m.gate_bias.zero_()  # σ(z) + σ(-z) = 1 below holds without the bias
    q, _, _ = m._project(torch.randn(2, 5, D, dtype=F64))
    assert torch.equal(m.gate(q)[:, 0], m.gate(q)[:, 1])
    with torch.no_grad():
        m.gate_vector[DH:] = -m.gate_vector[:DH]
    g = m.gate(q)
    assert not torch.allclose(g[:, 0], g[:, 1])
    torch.testing.assert_close(g[:, 0] + g[:, 1], torch.ones_like(g[:, 0]))  # σ(z) + σ(-z) = 1


def test_gradcheck_band_logits_and_gate_vector() -> None:
    x, mask = _batch([4, 3], 4, seed=10)
    band = _smooth("band", window=3)

    def f_band(b: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(band, {"band_logits": b}, (x, mask)).out

    assert torch.autograd.gradcheck(f_band, (band.band_logits.detach().clone().requires_grad_(True),))
    pred = _smooth("predicted")
    prev = _prev(x, mask)

    def f_gate(c: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(pred, {"gate_vector": c}, (x, mask), {"prev_attn": prev}).out

    assert torch.autograd.gradcheck(f_gate, (pred.gate_vector.detach().clone().requires_grad_(True),))
    per_head = _smooth("band", per_head=True)
    assert per_head.band_logits.shape == (H, 3)
    assert torch.autograd.gradcheck(
        lambda b: torch.func.functional_call(per_head, {"band_logits": b}, (x, mask)).out,
        (per_head.band_logits.detach().clone().requires_grad_(True),))


# ------------------------------------------------------------------------ 9. local + smoothing


def test_local_uniform_prior_is_renormalised_on_the_window() -> None:
    m = _smooth("uniform", window=3)
    p = m.prior_weights(m.allowed_keys(None, 5, torch.device("cpu")), None, F64)[0, 0]  # (5, 5)
    third, half = 1 / 3, 1 / 2
    expected = torch.tensor([
        [half, half, 0, 0, 0],
        [third, third, third, 0, 0],
        [0, third, third, third, 0],
        [0, 0, third, third, third],
        [0, 0, 0, half, half]], dtype=F64)
    torch.testing.assert_close(p, expected, rtol=0, atol=1e-15)
    pad = torch.tensor([[False, False, False, False, True]])  # T = 4: row 3's window loses key 4
    p = m.prior_weights(m.allowed_keys(pad, 5, torch.device("cpu")), None, F64)[0, 0]
    torch.testing.assert_close(p[3], torch.tensor([0, 0, half, half, 0], dtype=F64), rtol=0, atol=1e-15)
    x, _ = _batch([5], 5)
    assert (m(x, None, need_weights=True).weights[..., ~_window(5, 3)] == 0).all()


def test_local_prev_prior_is_renormalised_on_the_window() -> None:
    m = _smooth("prev", window=3)
    prev = torch.softmax(torch.randn(2, H, 5, 5, dtype=F64), -1)  # a full layer below
    p = m.prior_weights(m.allowed_keys(None, 5, torch.device("cpu")), prev, F64)
    win = _window(5, 3)
    expected = prev * win / (prev * win).sum(-1, keepdim=True)
    torch.testing.assert_close(p, expected, rtol=0, atol=1e-15)
    x, _ = _batch([5, 5], 5)
    res = m(x, None, prev_attn=prev, need_weights=True)
    assert (res.weights[..., ~win] == 0).all()
    torch.testing.assert_close(res.weights.sum(-1), torch.ones(2, H, 5, dtype=F64))


# ------------------------------------------------------------------------ 10. checkpoints


SYSTEMS = {
    "relaxed_enc": {"prior": "uniform", "gamma": 0.1, "train_only": True},
    "band": {"prior": "band", "gamma": 0.1, "k": 13},
    "band_masked_per_head": {"prior": "band", "gamma": 0.1, "k": 5, "band_outside": "masked", "per_head": True},
    "prev": {"prior": "prev", "recursive": False, "gamma": 0.1},
    "rec": {"prior": "prev", "recursive": True, "gamma": 0.1},
    "rec_pred": {"prior": "prev", "recursive": True, "gamma": "predicted"},
}


@pytest.mark.parametrize("base", ["full", "local"])
@pytest.mark.parametrize("system", list(SYSTEMS))
def test_full_attention_checkpoint_loads_into_every_smoothing_config(system: str, base: str) -> None:
    n = 3
    torch.manual_seed(0)
    asr = S2TTransformer(model_config("tiny", vocab_size=11, encoder_layers=n, ctc_vocab_size=7))
    base_spec = local_attention_spec(n, 1, [3, 5]) if base == "local" else [{"type": "full"}] * n
    spec = smoothing_spec(base_spec, SYSTEMS[system], n, key=f"smoothing.defs.{system}")
    torch.manual_seed(1)
    st = S2TTransformer(model_config("tiny", vocab_size=11, encoder_layers=n, encoder_attention=spec))
    report = load_encoder(st, asr.state_dict())
    variant = sorted(k for k in st.encoder.state_dict() if k.endswith((".band_logits", ".gate_vector", ".gate_bias")))
    assert report.missing == variant
    assert bool(variant) == (system.startswith("band") or system == "rec_pred")
    assert report.skipped == ["ctc_proj.bias", "ctc_proj.weight"]
    for key in report.loaded:
        assert torch.equal(st.encoder.state_dict()[key], asr.encoder.state_dict()[key])
    kinds = [type(layer.self_attn) for layer in st.encoder.layers]
    first_smoothed = 2 if SYSTEMS[system]["prior"] == "prev" else 1  # layer 1 stays full (base: 1 full layer)
    assert kinds == [FullAttention] * (first_smoothed - 1) + [SmoothedAttention] * (n - first_smoothed + 1)
    assert [layer.self_attn.window for layer in st.encoder.layers[1:]] == ([3, 5] if base == "local" else [None] * 2)
    feats, lengths = torch.randn(2, 33, 80), torch.tensor([33, 20])
    logits = st.train()(feats, lengths, torch.tensor([[2, 5, 6], [2, 7, 1]]))
    assert torch.isfinite(logits).all()


def test_smoothing_with_gamma_zero_reproduces_the_loaded_model() -> None:
    """After loading, γ = 0 smoothing computes what the source model computes (weights really used)."""
    n = 3
    torch.manual_seed(0)
    src = S2TTransformer(model_config("tiny", vocab_size=11, encoder_layers=n)).eval()
    spec = smoothing_spec([{"type": "full"}] * n, {"prior": "prev", "recursive": True, "gamma": 0.0}, n)
    dst = S2TTransformer(model_config("tiny", vocab_size=11, encoder_layers=n, encoder_attention=spec)).eval()
    load_encoder(dst, src.state_dict())
    feats, lengths = torch.randn(2, 33, 80), torch.tensor([33, 20])
    torch.testing.assert_close(dst.encode(feats, lengths).out, src.encode(feats, lengths).out, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------ 11. spec validation


def test_registry_and_spec_keys() -> None:
    assert ATTENTION_VARIANTS["smooth", "encoder"] is SmoothedAttention
    with pytest.raises(ValueError, match="prior"):  # required spec key
        build_attention({"type": "smooth"}, D, H, 0.0)
    with pytest.raises(ValueError, match="window"):
        build_attention({"type": "smooth", "prior": "uniform", "window": 4}, D, H, 0.0)
    with pytest.raises(ValueError, match=r"smooth\.gamma"):
        build_attention({"type": "smooth", "prior": "uniform", "gamma": 2.0}, D, H, 0.0)
    m = build_attention({"type": "smooth", "prior": "band"}, D, H, 0.0)
    assert m.k == 13 and m.band_logits.shape == (13,) and m.band_init_width == 13  # reading A7 default
    assert torch.equal(m.band_logits.detach(), torch.full((13,), BAND_INIT_LOGIT))  # starts as the whole band
    assert {n for n, _ in m.named_parameters()} - {f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj")
                                                   for w in ("weight", "bias")} == {"band_logits"}


KEY = "smoothing.defs.x"


@pytest.mark.parametrize("sdef, needle", [
    ({"prior": "prev", "layers": [1, 2]}, f"{KEY}.layers"),  # no layer below layer 1
    ({"prior": "prev", "recursive": True, "layers": [1]}, f"{KEY}.layers"),
    ({"prior": "band", "k": 4}, f"{KEY}.k"),
    ({"prior": "band", "k": 0}, f"{KEY}.k"),
    ({"prior": "uniform", "gamma": 1.5}, f"{KEY}.gamma"),
    ({"prior": "uniform", "gamma": -0.1}, f"{KEY}.gamma"),
    ({"prior": "uniform", "gamma": True}, f"{KEY}.gamma"),
    ({"prior": "uniform", "gamma": "learned"}, f"{KEY}.gamma"),
    ({"prior": "prev", "gamma": "predicted"}, f"{KEY}.gamma"),  # predicted needs recursive
    ({"prior": "uniform", "recursive": True}, f"{KEY}.recursive"),
    ({"prior": "uniform", "k": 3}, f"{KEY}.k"),
    ({"prior": "gaussian"}, f"{KEY}.prior"),
    ({"gamma": 0.1}, f"{KEY}.prior"),
    ({"prior": "uniform", "where": ["encoder", "ffn"]}, f"{KEY}.where"),
    ({"prior": "uniform", "where": "encoder"}, f"{KEY}.where"),
    ({"prior": "band", "where": ["cross"]}, f"{KEY}.where"),
    ({"prior": "uniform", "layers": [0]}, f"{KEY}.layers"),
    ({"prior": "uniform", "layers": [4]}, f"{KEY}.layers"),
    ({"prior": "uniform", "layers": [2, 2]}, f"{KEY}.layers"),
    ({"prior": "uniform", "base": "banded"}, f"{KEY}.base"),
    ({"prior": "uniform", "train_only": "yes"}, f"{KEY}.train_only"),
    ({"prior": "uniform", "typo": 1}, "typo"),
])
def test_smoothing_spec_errors_name_the_key(sdef: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        smoothing_spec([{"type": "full"}] * 3, sdef, 3, key=KEY)


def test_smoothing_spec_overlay() -> None:
    base = local_attention_spec(4, 2, [3, 5])
    spec = smoothing_spec(base, {"prior": "prev", "recursive": True, "gamma": "predicted", "where": ["encoder"]}, 4)
    assert spec == [{"type": "full"}] + [{"type": "smooth", "prior": "prev", "gamma": "predicted", "gate_init": 0.1,
                                          "recursive": True, **w} for w in ({}, {"window": 3}, {"window": 5})]
    assert base == local_attention_spec(4, 2, [3, 5])  # the base is not modified
    spec = smoothing_spec([{"type": "full"}] * 3, {"prior": "band", "layers": [2]}, 3)
    assert spec[1] == {"type": "smooth", "prior": "band", "gamma": 0.1, "k": 13, "band_init_width": 13}
    assert spec[0] == spec[2] == {"type": "full"}
    # over a local layer the band starts at the layer's window (Algorithm 1's), capped at k
    local = smoothing_spec(local_attention_spec(4, 1, [3, 5, 21]), {"prior": "band", "k": 13}, 4)
    assert [s.get("band_init_width") for s in local] == [13, 3, 5, 13]
    assert smoothing_spec(local_attention_spec(4, 1, [3, 5, 21]), {"prior": "band", "k": 13, "band_init_width": 7},
                          4)[1]["band_init_width"] == 7
    # decoder-only smoothing leaves the encoder spec alone
    assert smoothing_spec(base, {"prior": "uniform", "where": ["cross"]}, 4) == base
    # an overlaid spec builds a model (a base layer that is neither full nor local is refused)
    model = S2TTransformer(model_config("tiny", vocab_size=11, encoder_layers=3, encoder_attention=spec))
    assert isinstance(model.encoder.layers[1].self_attn, SmoothedAttention)
    with pytest.raises(ValueError, match="layer 2"):
        smoothing_spec([{"type": "full"}, {"type": "banded", "window": 3}], {"prior": "uniform"}, 2)
    with pytest.raises(ValueError, match="3 layer specs"):
        smoothing_spec([{"type": "full"}] * 3, {"prior": "uniform"}, 4)


# ------------------------------------------------------------------------ decoder side (docs/variants.md)

V = 23
DEC_PRIORS = ["uniform", "prev", "rec", "predicted"]


def _dec_module(name: str, *, gamma: float = 0.3, seed: int = 0) -> SmoothedMultiheadAttention:
    spec = {"gamma": gamma, **PRIORS[name]}
    torch.manual_seed(seed)
    m = SmoothedMultiheadAttention(D, H, 0.0, **spec).to(F64).eval()
    if m.gate_vector is not None:
        with torch.no_grad():
            m.gate_vector.copy_(0.3 * torch.randn(D, dtype=F64))
    return m


def _plain_dec(m: MultiheadAttention) -> MultiheadAttention:
    plain = MultiheadAttention(D, H, 0.0)
    plain.load_state_dict(m.state_dict(), strict=False)
    return plain.to(F64).eval()


@pytest.mark.parametrize("place", ["decoder_self", "cross"])
@pytest.mark.parametrize("name", DEC_PRIORS)
def test_decoder_rows_sum_to_one_padded_keys_zero_no_nan(name: str, place: str) -> None:
    g = torch.Generator().manual_seed(11)
    query = torch.randn(4, 6, D, generator=g, dtype=F64)
    memory = torch.randn(4, 7, D, generator=g, dtype=F64)
    if place == "cross":
        pad = torch.arange(7)[None, :] >= torch.tensor([7, 4, 1, 0])[:, None]  # incl. a length-1 and an empty source
        kw = dict(key_padding_mask=pad)
        allowed = (~pad)[:, None, None, :].expand(4, 1, 6, 7)
        mem = memory
    else:
        pad = torch.arange(6)[None, :] >= torch.tensor([6, 4, 1, 1])[:, None]  # right-padded targets
        kw = dict(key_padding_mask=pad, causal=True)
        allowed = (~pad)[:, None, None, :] & torch.ones(6, 6, dtype=torch.bool).tril()
        mem = None
    m = _dec_module(name)
    prev = _plain_dec(_dec_module("uniform", seed=5))(query, mem, need_weights=True, **kw).weights
    res = m(query, mem, prev_attn=prev, need_weights=True, **kw)
    w = res.weights  # (B, H, L, S)
    for t in (w, res.carry, res.out):
        assert torch.isfinite(t).all()
    assert (w[~allowed.expand_as(w)] == 0).all()  # padded (and future) keys: exactly 0, every row
    has_key = allowed.any(-1).expand(4, H, 6)
    torch.testing.assert_close(w.sum(-1)[has_key], torch.ones(int(has_key.sum()), dtype=F64), atol=1e-6, rtol=0)
    if name == "uniform" and place == "decoder_self":  # P[i, j] = 1 / (i + 1) over the causal prefix
        p1 = _dec_module("uniform", gamma=1.0)(query, None, need_weights=True, causal=True).weights
        torch.testing.assert_close(p1[0, 0], torch.ones(6, 6, dtype=F64).tril() / torch.arange(1, 7, dtype=F64)[:, None])


def _dec_model(self_spec: dict | None, cross_spec: dict | None, *, seed: int = 0, layers: int = 3) -> S2TTransformer:
    torch.manual_seed(seed)
    cfg = model_config("tiny", vocab_size=V, decoder_layers=layers, decoder_self_attention=self_spec,
                       cross_attention=cross_spec)
    model = S2TTransformer(cfg).eval()
    with torch.no_grad():
        for p in model.decoder.parameters():
            if p.dim() == 1 and p.shape == (D,) and (p == 0).all():  # gate vectors: not their 0.5 init
                p.normal_()
    return model


def _dec_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    feats, lengths = torch.randn(3, 41, 80, generator=g), torch.tensor([41, 23, 9])
    tokens = torch.randint(3, V, (3, 7), generator=g)
    tokens[1, 5:] = 1
    tokens[2, 3:] = 1
    return feats, lengths, tokens


DEC_SYSTEMS = {
    "rec_pred_all": {"prior": "prev", "recursive": True, "gamma": "predicted"},
    "prev": {"prior": "prev", "gamma": 0.3},
    "uniform_both": {"prior": "uniform", "gamma": 0.2},
}


def test_the_decoder_runs_the_encoders_smoothing_core() -> None:
    """One smoothing core for both roles: the decoder's class holds the encoder's functions (not copies),
    and its weights are the core's on its own keys (the causal prefix here)."""
    from lib.model.attention import SmoothedAttention

    for name in ("smoothed", "raw_weights", "prior_weights", "gate"):
        assert getattr(SmoothedMultiheadAttention, name) is getattr(SmoothedAttention, name)
    m = SmoothedMultiheadAttention(D, H, 0.0, **PRIORS["predicted"]).to(F64).eval()
    calls = []
    m.gate = lambda q: calls.append(1) or SmoothedAttention.gate(m, q)  # an instance patch reaches the core
    query = torch.randn(2, 5, D, dtype=F64)
    prev = torch.softmax(torch.randn(2, H, 5, 5, dtype=F64), -1).tril()
    m(query, None, causal=True, prev_attn=prev, need_weights=True)
    assert calls == [1]


@pytest.mark.parametrize("system", list(DEC_SYSTEMS))
def test_decoder_incremental_equals_full_sequence(system: str) -> None:
    spec = decoder_smoothing_specs({**DEC_SYSTEMS[system], "where": ["decoder_self", "cross"]}, 3)
    model = _dec_model(spec["decoder_self_attention"], spec["cross_attention"])
    assert any(isinstance(layer.self_attn, SmoothedMultiheadAttention) for layer in model.decoder.layers)
    feats, lengths, tokens = _dec_batch()
    enc = model.encode(feats, lengths)
    full = model.decode(tokens, enc)
    state: dict = {}
    inc = torch.cat([model.decode(tokens[:, :t + 1], enc, incremental_state=state) for t in range(7)], dim=1)
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)
    plain = _dec_model(None, None)
    plain.load_state_dict(model.state_dict(), strict=False)
    assert not torch.allclose(plain.decode(tokens, enc), full, atol=1e-3)  # the smoothing does something
    # padding invariance: a sample alone == the same sample in the padded batch
    logits = model(feats, lengths, tokens)
    for b in range(3):
        n_tok = int((tokens[b] != 1).sum())
        alone = model(feats[b:b + 1, :int(lengths[b])], lengths[b:b + 1], tokens[b:b + 1, :n_tok])
        torch.testing.assert_close(logits[b, :n_tok], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("recursive", [False, True])
def test_decoder_carry_semantics(recursive: bool) -> None:
    """Layer l + 1 receives the raw A_l (non-recursive) or A'_l (recursive) of the same kind."""
    spec = {"type": "smooth", "prior": "prev", "recursive": recursive, "gamma": 0.4}
    model = _dec_model(spec, spec)
    seen: dict[tuple[int, str], tuple] = {}
    for li, layer in enumerate(model.decoder.layers):
        for kind, mod in (("self", layer.self_attn), ("cross", layer.encoder_attn)):
            mod.register_forward_hook(lambda _m, args, kwargs, out, key=(li, kind): seen.__setitem__(key, (args, kwargs, out)),
                                      with_kwargs=True)
    feats, lengths, tokens = _dec_batch(1)
    model(feats, lengths, tokens)
    for li in (0, 1):
        for kind in ("self", "cross"):
            args, kwargs, out = seen[(li, kind)]
            mod = getattr(model.decoder.layers[li], "self_attn" if kind == "self" else "encoder_attn")
            raw = _plain_dec(mod).float()(*args, **{**kwargs, "need_weights": True, "prev_attn": None}).weights
            received = seen[(li + 1, kind)][1]["prev_attn"]
            expected = out.weights if recursive and li > 0 else raw  # layer 1 is plain: raw either way
            torch.testing.assert_close(received, expected, rtol=0, atol=1e-6)
            if li == 1:
                torch.testing.assert_close(out.weights, 0.6 * raw + 0.4 * kwargs["prev_attn"], rtol=0, atol=1e-6)


def test_decoder_none_is_todays_sdpa_path() -> None:
    """decoder_self_attention = cross_attention = None: plain modules (no new parameters) and the
    fused SDPA computation, bit for bit."""
    model = _dec_model(None, None)
    ref = S2TTransformer(model_config("tiny", vocab_size=V, decoder_layers=3))
    assert model.state_dict().keys() == ref.state_dict().keys()
    assert all(type(m) is MultiheadAttention for layer in model.decoder.layers
               for m in (layer.self_attn, layer.encoder_attn))
    mha = model.decoder.layers[0].self_attn
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, D, generator=g)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])

    def split(t):
        return t.view(2, -1, H, DH).transpose(1, 2)

    mask = pad[:, None, None, :] | (torch.arange(5)[None, :] > torch.arange(5)[:, None])
    from lib.model.attention import mask_bias

    ctx = torch.nn.functional.scaled_dot_product_attention(
        split(mha.q_proj(x)), split(mha.k_proj(x)), split(mha.v_proj(x)), attn_mask=mask_bias(mask, x.dtype))
    expected = mha.out_proj(ctx.transpose(1, 2).reshape(2, 5, D))
    got = mha(x, None, key_padding_mask=pad, causal=True)
    assert torch.equal(got.out, expected) and got.weights is None and got.carry is None


def test_relaxed_cross_attention_is_plain_at_inference() -> None:
    relaxed = decoder_smoothing_specs({"prior": "uniform", "gamma": 0.1, "train_only": True, "where": ["cross"]}, 3)
    model = _dec_model(**{"self_spec": relaxed["decoder_self_attention"], "cross_spec": relaxed["cross_attention"]})
    plain = _dec_model(None, None)
    plain.load_state_dict(model.state_dict())
    feats, lengths, tokens = _dec_batch(2)
    assert torch.equal(model(feats, lengths, tokens), plain(feats, lengths, tokens))
    model.train(), plain.train()
    torch.manual_seed(0)
    a = model(feats, lengths, tokens)
    torch.manual_seed(0)
    assert not torch.allclose(a, plain(feats, lengths, tokens))  # smoothing in training only


def test_decoder_checkpoints_load() -> None:
    """A plain model's decoder layers load into a decoder-smoothing model; gate vectors keep their init."""
    asr = S2TTransformer(model_config("tiny", vocab_size=11, decoder_layers=3))
    spec = decoder_smoothing_specs({**DEC_SYSTEMS["rec_pred_all"], "where": ["encoder", "decoder_self", "cross"]}, 3)
    st = S2TTransformer(model_config("tiny", vocab_size=V, decoder_layers=3, **spec))
    loaded = load_decoder_layers(st, asr.state_dict())
    gates = sorted(k for k in st.decoder.state_dict() if k.endswith("gate_vector"))
    assert len(gates) == 4 and not set(gates) & set(loaded)  # layers 2-3, self and cross
    assert all((st.decoder.state_dict()[k] == 0).all() for k in gates)
    assert set(loaded) == {k for k in asr.decoder.state_dict() if k.startswith(("layers.", "layer_norm."))}
    # config round trip (checkpoints store model_config as a plain dict); plain decoders keep the old dict
    cfg = model_config("tiny", vocab_size=V, decoder_layers=3, **spec)
    assert cfg.to_dict()["cross_attention"]["layers"] == [2, 3] and ModelConfig.from_dict(cfg.to_dict()) == cfg
    plain = model_config("tiny", vocab_size=V)
    assert not {"decoder_self_attention", "cross_attention"} & set(plain.to_dict())
    assert ModelConfig.from_dict(plain.to_dict()) == plain


@pytest.mark.parametrize("spec, needle", [
    ({"type": "smooth", "prior": "band"}, r"cross_attention\.prior"),
    ({"type": "smooth", "prior": "prev", "layers": [1, 2]}, r"cross_attention\.layers"),
    ({"type": "smooth", "prior": "uniform", "layers": [4]}, r"cross_attention\.layers"),
    ({"type": "smooth", "prior": "uniform", "gamma": 3}, r"cross_attention\.gamma"),
    ({"type": "smooth", "prior": "uniform", "window": 3}, "window"),
    ({"type": "local", "prior": "uniform"}, "cross_attention"),
])
def test_decoder_spec_errors_name_the_key(spec: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        model_config("tiny", vocab_size=V, decoder_layers=3, cross_attention=spec)


def test_decoder_smoothing_specs() -> None:
    out = decoder_smoothing_specs({"prior": "uniform", "gamma": 0.1, "train_only": True, "where": ["cross"]}, 2)
    assert out == {"decoder_self_attention": None, "cross_attention": {
        "type": "smooth", "prior": "uniform", "gamma": 0.1, "recursive": False, "train_only": True, "layers": [1, 2]}}
    assert decoder_smoothing_specs({"prior": "band"}, 2) == {"decoder_self_attention": None, "cross_attention": None}
    with pytest.raises(ValueError, match=r"smoothing\.defs\.x\.layers"):
        decoder_smoothing_specs({"prior": "prev", "layers": [5], "where": ["cross"]}, 3, key="smoothing.defs.x")
    with pytest.raises(ValueError, match=r"smoothing\.defs\.x\.where"):
        decoder_smoothing_specs({"prior": "band", "where": ["decoder_self"]}, 3, key="smoothing.defs.x")


def test_decoder_predicted_gate() -> None:
    """Decoder A' = (1 - g) A + g Ā_{l-1} with g = σ(q_h · c_h) per head and query (cross-attention)."""
    m = _dec_module("predicted")
    g = torch.Generator().manual_seed(4)
    query, memory = torch.randn(2, 3, D, generator=g, dtype=F64), torch.randn(2, 6, D, generator=g, dtype=F64)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    prev = torch.softmax(torch.randn(2, H, 3, 6, generator=g, dtype=F64).masked_fill(pad[:, None, None], -1e9), -1)
    res = m(query, memory, key_padding_mask=pad, prev_attn=prev, need_weights=True)
    raw = _plain_dec(m)(query, memory, key_padding_mask=pad, need_weights=True).weights
    q = m.q_proj(query).view(2, 3, H, DH)  # (B, L, H, dh)
    gate = torch.stack([torch.sigmoid(q[:, :, h] @ m.gate_vector[h * DH:(h + 1) * DH] + m.gate_bias[h])
                        for h in range(H)], 1)[..., None]
    assert not torch.allclose(gate, torch.full_like(gate, 0.5))
    torch.testing.assert_close(res.weights, (1 - gate) * raw + gate * prev, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------ priors that can act: the start


@pytest.mark.parametrize("gate_init", [None, 0.1, 0.3])
def test_predicted_gate_starts_at_gamma(gate_init: float | None) -> None:
    """g = σ(q · c_h + b_h) with c = 0 and b_h = logit(gate_init) (default γ = 0.1): every g of every
    query starts at gate_init, encoder and decoder (the seed's bias-free gate started at 0.5)."""
    want = 0.1 if gate_init is None else gate_init
    extra = {} if gate_init is None else {"gate_init": gate_init}
    enc = build_attention({"type": "smooth", "prior": "prev", "recursive": True, "gamma": "predicted", **extra},
                          D, H, 0.0)
    dec = SmoothedMultiheadAttention(D, H, 0.0, prior="prev", recursive=True, gamma="predicted", **extra)
    for m in (enc, dec):
        assert m.gate_init == want and m.gate_bias.shape == (H,)
        torch.testing.assert_close(torch.sigmoid(m.gate_bias.detach()), torch.full((H,), want), rtol=1e-6, atol=0)
    q = torch.randn(2, H, 7, DH)
    torch.testing.assert_close(enc.gate(q), torch.full((2, H, 7, 1), want), rtol=1e-6, atol=0)
    # the weights at initialisation are the fixed-γ system's: A' = (1 - γ) A + γ Ā_{l-1}
    x, mask = _batch([5, 3], 5, seed=2)
    prev = _prev(x, mask)
    fixed = build_attention({"type": "smooth", "prior": "prev", "recursive": True, "gamma": want}, D, H, 0.0)
    fixed.load_state_dict(enc.state_dict(), strict=False)
    a = enc.to(F64).eval()(x, mask, prev_attn=prev, need_weights=True).weights
    b = fixed.to(F64).eval()(x, mask, prev_attn=prev, need_weights=True).weights
    torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match=r"smooth\.gate_init"):
        build_attention({"type": "smooth", "prior": "prev", "recursive": True, "gamma": "predicted", "gate_init": 1.0},
                        D, H, 0.0)
    with pytest.raises(ValueError, match=r"smooth\.gate_init"):
        build_attention({"type": "smooth", "prior": "prev", "gamma": 0.1, "gate_init": 0.2}, D, H, 0.0)


@pytest.mark.parametrize("width", [None, 1, 5, 13])
def test_band_prior_starts_as_a_band_of_its_width(width: int | None) -> None:
    """The band logits start at ln 100 on the centred ``band_init_width`` entries (default k) and 0 on
    the rest: the prior starts concentrated on that band, not uniform (the seed's b = 0)."""
    extra = {} if width is None else {"band_init_width": width}
    m = build_attention({"type": "smooth", "prior": "band", "k": 13, "gamma": 1.0, **extra}, D, H, 0.0).eval()
    w = 13 if width is None else width
    assert m.band_init_width == w
    b = m.band_logits.detach()
    inside = (torch.arange(13) - 6).abs() <= (w - 1) // 2
    assert torch.equal(b[inside], torch.full((w,), BAND_INIT_LOGIT)) and torch.equal(b[~inside], torch.zeros(13 - w))
    n = 40
    p = m.prior_weights(torch.ones(1, 1, n, n, dtype=torch.bool), None, torch.float64)[0, 0]  # (N, N)
    i = n // 2
    near = (torch.arange(n) - i).abs() <= (w - 1) // 2
    mass = float(p[i, near].sum().detach())
    assert mass == pytest.approx(w * 100 / (w * 100 + n - w), rel=1e-6)  # an in-band key 100 x an off-band one
    assert mass > 0.7 and mass > 13 / n  # a band, far above uniform's in-band share
    with pytest.raises(ValueError, match=r"smooth\.band_init_width"):
        build_attention({"type": "smooth", "prior": "band", "k": 13, "band_init_width": 4}, D, H, 0.0)
    with pytest.raises(ValueError, match=r"smooth\.band_init_width"):
        build_attention({"type": "smooth", "prior": "band", "k": 5, "band_init_width": 7}, D, H, 0.0)
    with pytest.raises(ValueError, match=r"smooth\.band_init_width"):
        build_attention({"type": "smooth", "prior": "uniform", "band_init_width": 3}, D, H, 0.0)
