"""Tests for lib.analysis.contributions: fast Gram route vs the materialised ground truth, and the
block-output identity Σ_j F_i(x_j) + b = x̂_i."""
from __future__ import annotations

import pytest
import torch

from lib.analysis.contributions import (
    block_output,
    contribution_bias,
    contribution_vectors,
    contributions,
    contributions_naive,
)

D_MODEL, N_HEADS = 32, 4


def _layer(n: int, seed: int, *, d: int = D_MODEL, h: int = N_HEADS, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(dtype)  # noqa: E731
    x = r(n, d, scale=3.0)
    logits = r(h, n, n, scale=2.0).to(torch.float64)
    attn = logits.softmax(-1).to(dtype)
    return dict(
        x=x,
        attn=attn,
        ln_weight=1.0 + r(d, scale=0.3),
        ln_bias=r(d, scale=0.3),
        ln_eps=1e-5,
        v_weight=r(d, d, scale=d**-0.5),
        v_bias=r(d, scale=0.5),
        out_weight=r(d, d, scale=d**-0.5),
        out_bias=r(d, scale=0.5),
    )


def _args(p):
    return (p["x"], p["attn"], p["ln_weight"], p["ln_bias"], p["ln_eps"], p["v_weight"], p["v_bias"],
            p["out_weight"], p["out_bias"])


@pytest.mark.parametrize("n", [1, 2, 5, 17, 64])
@pytest.mark.parametrize("value_bias", ["bias", "token"])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_fast_matches_naive(n, value_bias, residual, normalize):
    p = _layer(n, seed=n * 7 + 1)
    kw = dict(value_bias=value_bias, residual=residual, normalize=normalize)
    fast = contributions(*_args(p), **kw)
    naive = contributions_naive(*_args(p), **kw)
    assert fast.shape == (n, n) and fast.dtype == torch.float64
    torch.testing.assert_close(fast, naive, rtol=1e-5, atol=1e-12)
    assert (fast >= 0).all()


@pytest.mark.parametrize("h", [1, 2, 8])
def test_fast_matches_naive_other_head_counts(h):
    p = _layer(23, seed=h, d=32, h=h)
    torch.testing.assert_close(contributions(*_args(p)), contributions_naive(*_args(p)), rtol=1e-5, atol=1e-12)


def test_float64_inputs_and_no_biases():
    p = _layer(11, seed=3, dtype=torch.float64)
    p["v_bias"] = None
    p["out_bias"] = None
    for vb in ("bias", "token"):
        torch.testing.assert_close(
            contributions(*_args(p), value_bias=vb), contributions_naive(*_args(p), value_bias=vb), rtol=1e-5, atol=1e-12
        )
    fv, b = contribution_vectors(*_args(p))
    assert torch.count_nonzero(b) == 0
    torch.testing.assert_close(fv.sum(1) + b, block_output(*_args(p)), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("value_bias", ["bias", "token"])
@pytest.mark.parametrize("n", [1, 9, 40])
def test_block_output_identity(value_bias, n):
    # attention rows must sum to 1 exactly for the "bias" fold: build it in float64
    p = _layer(n, seed=100 + n, dtype=torch.float64)
    fv, b = contribution_vectors(*_args(p), value_bias=value_bias, residual=True)
    out = block_output(*_args(p))
    torch.testing.assert_close(fv.sum(1) + b, out, rtol=1e-5, atol=1e-9)
    # the bias terms of both modes differ exactly by Σ_h b_V^h W_O^h
    b_other = contribution_bias(p["v_bias"], p["out_weight"], p["out_bias"],
                                value_bias="token" if value_bias == "bias" else "bias")
    diff = (b - b_other) if value_bias == "bias" else (b_other - b)
    torch.testing.assert_close(diff, p["out_weight"] @ p["v_bias"], rtol=1e-9, atol=1e-12)


def test_block_output_matches_torch_multihead_attention():
    """block_output (and hence the decomposition) agrees with torch's own MHA module."""
    n, d, h = 13, D_MODEL, N_HEADS
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(d, h, bias=True).double().eval()
    torch.nn.init.normal_(mha.in_proj_bias, std=0.3)
    torch.nn.init.normal_(mha.out_proj.bias, std=0.3)
    ln = torch.nn.LayerNorm(d).double()
    torch.nn.init.normal_(ln.weight, 1.0, 0.2)
    torch.nn.init.normal_(ln.bias, 0.0, 0.2)
    x = torch.randn(n, d, dtype=torch.float64)
    y = ln(x).unsqueeze(1)  # (N, 1, d)
    out, attn = mha(y, y, y, need_weights=True, average_attn_weights=False)
    ref = x + out.squeeze(1)
    args = (x, attn[0], ln.weight, ln.bias, ln.eps, mha.in_proj_weight[2 * d:], mha.in_proj_bias[2 * d:],
            mha.out_proj.weight, mha.out_proj.bias)
    with torch.no_grad():
        torch.testing.assert_close(block_output(*args), ref, rtol=1e-7, atol=1e-9)
        for vb in ("bias", "token"):
            fv, b = contribution_vectors(*args, value_bias=vb)
            torch.testing.assert_close(fv.sum(1) + b, ref, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("value_bias", ["bias", "token"])
def test_rows_sum_to_one(value_bias):
    p = _layer(31, seed=5)
    c = contributions(*_args(p), value_bias=value_bias)
    torch.testing.assert_close(c.sum(1), torch.ones(31, dtype=torch.float64), rtol=0, atol=1e-12)


def test_definition_on_tiny_example():
    """C_ij = ||Σ_h A^h_ij LN(x_j) W_V^h W_O^h (+ x_i)|| by hand, one token pair at a time."""
    p = _layer(4, seed=11, d=8, h=2, dtype=torch.float64)
    c = contributions(*_args(p), normalize=False)
    x, a = p["x"], p["attn"]
    ln = torch.nn.functional.layer_norm(x, (8,), p["ln_weight"], p["ln_bias"], p["ln_eps"])
    for i in range(4):
        for j in range(4):
            f = torch.zeros(8, dtype=torch.float64)
            for h in range(2):
                sl = slice(4 * h, 4 * h + 4)
                f += a[h, i, j] * (ln[j] @ p["v_weight"][sl].T) @ p["out_weight"][:, sl].T
            if i == j:
                f += x[i]
            assert abs(float(c[i, j]) - float(f.norm())) < 1e-9 * max(1.0, float(f.norm()))


def test_no_residual_single_token():
    # N = 1, no residual: C = ||LN(x) W_V W_O||, normalised to 1
    p = _layer(1, seed=2)
    assert float(contributions(*_args(p), residual=False)[0, 0]) == pytest.approx(1.0)


def test_bad_inputs():
    p = _layer(5, seed=1)
    with pytest.raises(ValueError):
        contributions(*_args(p), value_bias="nope")
    q = dict(p, attn=p["attn"][:, :4])
    with pytest.raises(ValueError):
        contributions(*_args(q))


@pytest.mark.parametrize("block", [1, 5, 16])
def test_row_blocks(monkeypatch, block):
    """The fast route computes C in row blocks; uneven block splits give the same matrix."""
    import lib.analysis.contributions as mod

    p = _layer(17, seed=42)
    ref = contributions_naive(*_args(p))
    monkeypatch.setattr(mod, "_ROW_BLOCK", block)
    torch.testing.assert_close(mod.contributions(*_args(p)), ref, rtol=1e-5, atol=1e-12)


def test_large_n_block_path():
    p = _layer(300, seed=9, d=16, h=4)  # > one 256-row block
    torch.testing.assert_close(contributions(*_args(p)), contributions_naive(*_args(p)), rtol=1e-5, atol=1e-12)


def test_zero_rows_stay_zero_when_normalised():
    """A row whose contributions are all 0 (no value path: W_V = 0, no residual) is left at 0 by the
    row normalisation (docstring), not divided by 0 into NaN."""
    p = _layer(5, seed=3)
    p["v_weight"] = torch.zeros_like(p["v_weight"])
    p["v_bias"] = torch.zeros_like(p["v_bias"])
    for fn in (contributions, contributions_naive):
        c = fn(*_args(p), residual=False, normalize=True)
        assert torch.equal(c, torch.zeros(5, 5, dtype=torch.float64)), fn.__name__
