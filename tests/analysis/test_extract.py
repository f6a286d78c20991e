"""Tests for lib.analysis.extract: the contributions read off a real (random tiny) model add up to
the attention block output the model's own modules compute, and the transparency .npz lets plain
numpy recompute C."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lib.analysis.contributions import block_output, contribution_vectors, contributions_naive
from lib.analysis.extract import (
    check_identity,
    contribution_matrices,
    layer_contributions,
    layer_tensors,
    save_transparency_npz,
)
from lib.model.s2t_transformer import S2TTransformer, lengths_to_padding_mask, model_config
from lib.model import checkpoint as ckpt
from lib.model.checkpoint import load_model


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _model(seed: int = 0, **overrides) -> S2TTransformer:
    torch.manual_seed(seed)
    cfg = model_config("tiny", vocab_size=20, encoder_layers=3, **overrides)
    m = S2TTransformer(cfg)
    # Non-trivial LN and biases (fresh modules have LN weight 1 / bias 0 and out_proj bias 0).
    with torch.no_grad():
        for layer in m.encoder.layers:
            layer.self_attn_layer_norm.weight.add_(0.3 * torch.randn(cfg.d_model))
            layer.self_attn_layer_norm.bias.add_(0.3 * torch.randn(cfg.d_model))
            layer.self_attn.out_proj.bias.add_(0.5 * torch.randn(cfg.d_model))
            layer.self_attn.v_proj.bias.add_(0.5 * torch.randn(cfg.d_model))
    return m


def _feats(t: int = 57, seed: int = 1) -> torch.Tensor:
    return torch.randn(t, 80, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("value_bias", ["bias", "token"])
def test_contributions_add_up_to_the_modules_block_output(value_bias):
    m = _model()
    m.train()  # layer_tensors must switch to eval (dropout off) and restore the mode
    feats = _feats()
    ut = layer_tensors(m, feats)
    assert m.training
    assert ut.n_tokens == 15 and len(ut.layers) == 3
    m.eval()
    with torch.no_grad():
        for li, (layer, t) in enumerate(zip(m.encoder.layers, ut.layers)):
            x = t.x[None]
            # The block output recomputed by calling the modules afresh: x + self_attn(self_attn_layer_norm(x)).
            real = (x + layer.self_attn(layer.self_attn_layer_norm(x), None).out)[0]
            torch.testing.assert_close(t.block_out, real, rtol=0, atol=1e-6)
            fv, b = contribution_vectors(*t.args(), value_bias=value_bias)
            torch.testing.assert_close(fv.sum(1) + b, real.double(), rtol=0, atol=1e-5)
            assert check_identity(t, value_bias=value_bias) < 1e-5
            # Independent route (contributions.block_output) agrees as well.
            torch.testing.assert_close(block_output(*t.args()), real.double(), rtol=0, atol=1e-5)
            # LN(x) captured from the module is the module's function of x.
            torch.testing.assert_close(t.ln_x, layer.self_attn_layer_norm(t.x))
            # layer_inputs are the residual stream: the next layer's x is this layer's full output.
            if li + 1 < len(ut.layers):
                pad = lengths_to_padding_mask(torch.tensor([ut.n_tokens]), ut.n_tokens)
                nxt, _, _ = layer(x, pad)
                torch.testing.assert_close(ut.layers[li + 1].x, nxt[0], rtol=0, atol=1e-5)


def test_matrices_are_row_normalised_and_match_naive():
    m = _model(3)
    ut = layer_tensors(m, _feats(41, 2))
    mats = contribution_matrices(m, _feats(41, 2))
    assert len(mats) == 3
    for t, c in zip(ut.layers, mats):
        assert c.dtype == torch.float64 and c.shape == (ut.n_tokens, ut.n_tokens)
        torch.testing.assert_close(c.sum(1), torch.ones(ut.n_tokens, dtype=torch.float64))
        torch.testing.assert_close(c, contributions_naive(*t.args()), rtol=1e-6, atol=1e-12)
        torch.testing.assert_close(c, layer_contributions(t))
    only = contribution_matrices(m, _feats(41, 2), layers=[2])
    assert len(only) == 1 and torch.equal(only[0], mats[2])


def test_local_attention_layers_give_banded_contributions():
    m = _model(5, encoder_attention=[{"type": "full"}, {"type": "local", "window": 3}, {"type": "local", "window": 5}])
    ut = layer_tensors(m, _feats(80, 3))
    n = ut.n_tokens
    off = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs()
    for t, half in zip(ut.layers[1:], (1, 2)):
        assert check_identity(t) < 1e-5
        c = layer_contributions(t)
        assert float(c[off > half].abs().max()) == 0.0
        assert float(c[off <= half].min()) > 0.0


def test_load_model_round_trip_and_missing_file(tmp_path):
    m = _model(7)
    path = tmp_path / "runs" / "st" / "en-de" / "seed1" / "model.pt"
    ckpt.save(path, {"model": m.state_dict(), "model_config": m.cfg.to_dict(), "task": "st", "pair": "en-de"})
    loaded, meta = load_model(path)
    assert not loaded.training and meta["task"] == "st"
    feats = _feats(33, 4)
    for a, b in zip(contribution_matrices(m, feats), contribution_matrices(loaded, feats)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(FileNotFoundError, match=r"seed2/model.pt.*train_st"):
        load_model(path.parent.parent / "seed2" / "model.pt", producer="train_st")


# ---------------------------------------------------------------------------------------- npz


def _numpy_layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _numpy_contributions(x, attn, ln_w, ln_b, eps, wv, bv, wo, bo, value_bias, residual, normalize):
    """Plain numpy, head by head, the (N, N, d) way: returns (C, F summed over j plus bias)."""
    x = x.astype(np.float64)
    h_count, n, _ = attn.shape
    d = x.shape[1]
    dh = d // h_count
    ln = _numpy_layer_norm(x, ln_w.astype(np.float64), ln_b.astype(np.float64), float(eps))
    fv = np.zeros((n, n, d))
    for h in range(h_count):
        wv_h = wv[h * dh:(h + 1) * dh].astype(np.float64).T  # (d, dh)
        wo_h = wo[:, h * dh:(h + 1) * dh].astype(np.float64).T  # (dh, d)
        val = ln @ wv_h
        if value_bias == "token":
            val = val + bv[h * dh:(h + 1) * dh]
        u = val @ wo_h  # (N, d)
        fv += attn[h].astype(np.float64)[:, :, None] * u[None, :, :]
    if residual:
        fv[np.arange(n), np.arange(n)] += x
    c = np.linalg.norm(fv, axis=-1)
    if normalize:
        c = c / c.sum(1, keepdims=True)
    bias = bo.astype(np.float64) + (wo.astype(np.float64) @ bv.astype(np.float64) if value_bias == "bias" else 0.0)
    return c, fv.sum(1) + bias


@pytest.mark.parametrize("value_bias", ["bias", "token"])
def test_transparency_npz_recomputes_with_plain_numpy(tmp_path, value_bias):
    m = _model(11)
    ut = layer_tensors(m, _feats(70, 5))
    mats = [layer_contributions(t, value_bias=value_bias) for t in ut.layers]
    path = save_transparency_npz(tmp_path / "sub" / "utt.st.npz", ut, mats,
                                 {"id": "utt", "value_bias": value_bias, "residual": True, "normalize": True})
    assert path.is_file() and not list(path.parent.glob(".*tmp*"))
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        assert "F_i(x_j)" in str(z["README"])
        L, n = z["C"].shape[:2]
        assert (L, n) == (3, ut.n_tokens) and z["attn"].shape == (3, 2, n, n) and z["feats"].shape == (70, 80)
        for l in range(L):
            np.testing.assert_allclose(
                _numpy_layer_norm(z["x"][l].astype(np.float64), z["ln_weight"][l], z["ln_bias"][l], z["ln_eps"][l]),
                z["ln_x"][l], atol=1e-5)
            c, total = _numpy_contributions(z["x"][l], z["attn"][l], z["ln_weight"][l], z["ln_bias"][l], z["ln_eps"][l],
                                            z["v_weight"][l], z["v_bias"][l], z["out_weight"][l], z["out_bias"][l],
                                            meta["value_bias"], meta["residual"], meta["normalize"])
            np.testing.assert_allclose(c, z["C"][l], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(total, z["x"][l] + z["attn_out"][l], atol=1e-5)
