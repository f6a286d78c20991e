"""Tests for lib.model.local_attention: exactness vs the dense banded reference,
padding/NaN behaviour, weights, dropout and the no-N×N-tensor guarantee."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lib.model.local_attention import (
    band_mask,
    banded_reference,
    choose_block_size,
    local_attention,
)

B, H, DH = 2, 2, 8


def _inputs(n, dtype=torch.float64, seed=0, b=B, h=H, dh=DH):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, dh, generator=g, dtype=dtype).requires_grad_(True) for _ in range(3)]


def _padding(lengths, n):
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]  # (B, N) True = pad


def _grads(out, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad(out, inputs, go)


def _dense_weights(q, k, window, kpm=None):
    """Dense banded probabilities (B, H, N, N) computed independently of the module."""
    n, dh = q.shape[-2], q.shape[-1]
    allowed = band_mask(n, window)[None, None]
    if kpm is not None:
        allowed = allowed & ~kpm[:, None, None, :]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
    s = s.masked_fill(~allowed, -1e30)
    return torch.softmax(s, -1).masked_fill(~allowed, 0.0)


def _band_of(dense, window):
    """(B, H, N, N) -> (B, H, N, w), column c = key i - (w-1)//2 + c (0 outside)."""
    n = dense.shape[-1]
    h = (window - 1) // 2
    out = dense.new_zeros(*dense.shape[:-1], window)
    for c in range(window):
        for i in range(n):
            j = i - h + c
            if 0 <= j < n:
                out[..., i, c] = dense[..., i, j]
    return out


# ----------------------------------------------------------------------------- exactness

WINDOWS = [1, 3, 5, 13, "2N+1"]


@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("block_size", [4, 16, 64, None], ids=lambda b: f"blk{b}")
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w}")
@pytest.mark.parametrize("n", [1, 7, 64, 100], ids=lambda n: f"N{n}")
def test_matches_banded_reference(n, window, block_size, padded):
    w = 2 * n + 1 if window == "2N+1" else window
    q, k, v = _inputs(n, seed=n * 131 + w)
    kpm = _padding([n, max(1, n - 5)], n) if padded else None
    out = local_attention(q, k, v, w, kpm, block_size=block_size)
    ref = banded_reference(q, k, v, w, kpm)
    assert out.shape == (B, H, n, DH)
    torch.testing.assert_close(out, ref, atol=1e-9, rtol=0)
    for got, exp, name in zip(_grads(out, (q, k, v)), _grads(ref, (q, k, v)), "qkv"):
        torch.testing.assert_close(got, exp, atol=1e-9, rtol=0, msg=f"d{name} mismatch")


@pytest.mark.parametrize("n,window,block_size", [(100, 13, None), (100, 25, 16), (37, 5, 8), (256, 5, None)])
def test_float32_within_1e5(n, window, block_size):
    q, k, v = _inputs(n, dtype=torch.float32, seed=3)
    kpm = _padding([n, n // 2], n)
    out = local_attention(q, k, v, window, kpm, block_size=block_size)
    ref = banded_reference(q, k, v, window, kpm)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    for got, exp in zip(_grads(out, (q, k, v)), _grads(ref, (q, k, v))):
        torch.testing.assert_close(got, exp, atol=1e-5, rtol=0)


def test_window_one_is_identity_on_values():
    q, k, v = _inputs(10)
    out = local_attention(q, k, v, 1)
    torch.testing.assert_close(out, v.detach(), atol=1e-12, rtol=0)


def test_non_contiguous_inputs():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, 50, H, 3 * DH, generator=g, dtype=torch.float64, requires_grad=True)
    q, k, v = x.transpose(1, 2).split(DH, dim=-1)  # non-contiguous (B, H, N, dh) views
    assert not q.is_contiguous()
    kpm = _padding([50, 31], 50)
    out = local_attention(q, k, v, 7, kpm, block_size=16)
    ref = banded_reference(q, k, v, 7, kpm)
    torch.testing.assert_close(out, ref, atol=1e-9, rtol=0)
    (gx,) = _grads(out, (x,))
    (gx_ref,) = _grads(ref, (x,))
    torch.testing.assert_close(gx, gx_ref, atol=1e-9, rtol=0)


def test_is_centred_exactly():
    """Perturbing key j changes query i's output iff |i - j| <= h (no lopsided blocks)."""
    n, w = 40, 7
    h = (w - 1) // 2
    q, k, v = (t.detach() for t in _inputs(n))
    base = local_attention(q, k, v, w, block_size=8)
    for j in (0, 5, 8, 15, 16, 39):
        v2 = v.clone()
        v2[..., j, :] += 1.0
        changed = (local_attention(q, k, v2, w, block_size=8) - base).abs().amax(dim=(0, 1, 3)) > 0
        expected = (torch.arange(n) - j).abs() <= h
        assert torch.equal(changed, expected), j


# ----------------------------------------------------------------------------- padding / NaN


@pytest.mark.parametrize("window", [1, 5, 13, 301], ids=lambda w: f"w{w}")
def test_fully_padded_windows_are_nan_free_and_zero(window):
    n = 64
    q, k, v = _inputs(n)
    lengths = [64, 10, 0]  # third sequence is entirely padding
    q, k, v = (torch.cat([t, t[:1]]).detach().requires_grad_(True) for t in (q, k, v))
    kpm = _padding(lengths, n)
    out = local_attention(q, k, v, window, kpm, block_size=16)
    assert torch.isfinite(out).all()
    h = (window - 1) // 2
    # query i has no valid key iff every key within the window is padding
    for b, length in enumerate(lengths):
        dead = torch.arange(n) - h >= length
        assert (out[b, :, dead] == 0).all()
    grads = _grads(out, (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    ref = banded_reference(q, k, v, window, kpm)
    torch.testing.assert_close(out, ref, atol=1e-9, rtol=0)
    for got, exp in zip(grads, _grads(ref, (q, k, v))):
        torch.testing.assert_close(got, exp, atol=1e-9, rtol=0)


@pytest.mark.parametrize("window,block_size", [(5, None), (13, 4), (201, None)])
def test_no_gradient_reaches_padded_keys(window, block_size):
    n = 100
    q, k, v = _inputs(n, dtype=torch.float32)
    lengths = [100, 63]
    kpm = _padding(lengths, n)
    out = local_attention(q, k, v, window, kpm, block_size=block_size)
    dq, dk, dv = _grads(out, (q, k, v))
    assert (dk[1, :, 63:] == 0).all() and (dv[1, :, 63:] == 0).all()
    assert (dk[1, :, :63] != 0).any() and (dv[1, :, :63] != 0).any()


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("window", [0, -1, -3, 2, 4, 12, 2.5])
def test_bad_window_raises(window):
    q, k, v = _inputs(8)
    with pytest.raises(ValueError, match=str(window)):
        local_attention(q, k, v, window)
    with pytest.raises(ValueError, match=str(window)):
        band_mask(8, window)


def test_bad_shapes_raise():
    q, k, v = _inputs(8)
    with pytest.raises(ValueError):
        local_attention(q, k, v, 3, torch.zeros(B, 7, dtype=torch.bool))
    with pytest.raises(ValueError):
        local_attention(q, k[:, :, :5], v, 3)


def test_choose_block_size():
    assert choose_block_size(1000, 5) == 16
    assert choose_block_size(1000, 41) == 40  # halo never exceeds the block
    assert choose_block_size(10, 41) == 10  # never more than N
    assert choose_block_size(1000, 41, 4) == 4  # explicit sizes are honoured


# ----------------------------------------------------------------------------- weights


@pytest.mark.parametrize("n,window,block_size", [(30, 5, 8), (30, 13, None), (30, 61, None), (7, 3, 4)])
def test_return_weights(n, window, block_size):
    q, k, v = _inputs(n)
    kpm = _padding([n, n - 4], n)
    out, wts = local_attention(q, k, v, window, kpm, block_size=block_size, return_weights=True)
    assert wts.shape == (B, H, n, window)
    torch.testing.assert_close(out, banded_reference(q, k, v, window, kpm), atol=1e-9, rtol=0)
    dense = _dense_weights(q, k, window, kpm)
    torch.testing.assert_close(wts, _band_of(dense, window), atol=1e-9, rtol=0)
    has_key = (dense.sum(-1) > 0)
    torch.testing.assert_close(wts.sum(-1)[has_key], torch.ones_like(wts.sum(-1)[has_key]))
    # gradients through the weights (e.g. an attention-entropy regulariser)
    g = torch.Generator().manual_seed(7)
    cw = torch.randn(wts.shape, generator=g, dtype=wts.dtype)
    loss = (wts * cw).sum() + out.sum()
    loss_ref = (_band_of(dense, window) * cw).sum() + banded_reference(q, k, v, window, kpm).sum()
    for got, exp in zip(torch.autograd.grad(loss, (q, k, v)), torch.autograd.grad(loss_ref, (q, k, v))):
        torch.testing.assert_close(got, exp, atol=1e-9, rtol=0)


# ----------------------------------------------------------------------------- dropout


def test_dropout_identity_in_eval_and_p0():
    q, k, v = _inputs(40)
    ref = local_attention(q, k, v, 5)
    torch.testing.assert_close(local_attention(q, k, v, 5, dropout_p=0.3, training=False), ref)
    torch.testing.assert_close(local_attention(q, k, v, 5, dropout_p=0.0, training=True), ref)


@pytest.mark.parametrize("window", [5, 81], ids=["w5", "w>=2N-1"])
def test_dropout_deterministic_with_generator(window):
    q, k, v = _inputs(40)
    kw = dict(dropout_p=0.3, training=True, block_size=8)
    a = local_attention(q, k, v, window, generator=torch.Generator().manual_seed(1), **kw)
    b = local_attention(q, k, v, window, generator=torch.Generator().manual_seed(1), **kw)
    c = local_attention(q, k, v, window, generator=torch.Generator().manual_seed(2), **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.allclose(a, local_attention(q, k, v, window))
    # inverted dropout keeps the expectation: average over many masks ~ no-dropout output
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        mean = sum(local_attention(q, k, v, window, generator=gen, **kw) for _ in range(300)) / 300
    torch.testing.assert_close(mean, local_attention(q, k, v, window).detach(), atol=0.15, rtol=0)


def test_dropout_backward_gradcheck():
    q, k, v = (t.detach()[:1, :1, :, :4].clone().requires_grad_(True) for t in _inputs(11))
    kpm = _padding([8], 11)

    def f(q, k, v):
        gen = torch.Generator().manual_seed(0)
        return local_attention(q, k, v, 5, kpm, dropout_p=0.4, training=True, generator=gen, block_size=4)

    assert torch.autograd.gradcheck(f, (q, k, v))


# ----------------------------------------------------------------------------- memory / shapes


class _MaxNumel(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.max_numel = 0
        self.worst = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.max_numel:
                self.max_numel, self.worst = t.numel(), (func, tuple(t.shape))
        return out


@pytest.mark.parametrize("padded", [False, True])
def test_no_quadratic_tensor_forward_or_backward(padded):
    b, h, n, dh, w = 2, 2, 256, 16, 5
    q, k, v = _inputs(n, dtype=torch.float32, b=b, h=h, dh=dh)
    kpm = _padding([n, 200], n) if padded else None
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with _MaxNumel() as mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = local_attention(q, k, v, w, kpm)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert len(grads) == 3 and saved
    for shape in saved:
        assert math.prod(shape) < b * h * n * n, shape
    # every intermediate of the forward and backward is O(N * (blk + w)), far below N^2
    blk = choose_block_size(n, w)
    assert mode.max_numel <= b * h * n * (blk + w - 1), mode.worst
    assert mode.max_numel < b * h * n * n // 8, mode.worst


# ----------------------------------------------------------------------------- device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_reference():
    q, k, v = (t.detach().cuda().float().requires_grad_(True) for t in _inputs(300))
    kpm = _padding([300, 211], 300).cuda()
    out = local_attention(q, k, v, 13, kpm)
    ref = banded_reference(q, k, v, 13, kpm)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for got, exp in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))):
        torch.testing.assert_close(got, exp, atol=1e-5, rtol=1e-4)


def _autocast_bf16_matches_reference(device: str) -> None:
    """Under bf16 autocast with a value tensor of another dtype (CUDA's autocast returns softmax
    in fp32, the same kind of mismatch): forward and backward run, in q's dtype, and match the
    dense reference computed on the same bf16 inputs."""
    q, k, v = (t.detach().to(device) for t in _inputs(150))
    kpm = _padding([150, 97], 150).to(device)
    qb, kb = (t.bfloat16().requires_grad_(True) for t in (q, k))
    vf = v.float().requires_grad_(True)  # fp32: the function must cast it, not fail on out= buffers
    with torch.autocast(device, dtype=torch.bfloat16):
        out = local_attention(qb, kb, vf, 9, kpm, training=True, dropout_p=0.0)
    assert out.dtype == torch.bfloat16
    grads = torch.autograd.grad(out.float().sum(), (qb, kb, vf))
    assert grads[2].dtype == torch.float32 and all(torch.isfinite(g).all() for g in grads)
    ref = banded_reference(qb.detach().float(), kb.detach().float(), vf.detach().bfloat16().float(), 9, kpm)
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


def test_cpu_autocast_bf16_with_mixed_input_dtypes():
    _autocast_bf16_matches_reference("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_autocast_bf16_with_mixed_input_dtypes():
    _autocast_bf16_matches_reference("cuda")


@pytest.mark.parametrize("extra", [0, 2, 10])
def test_any_window_covering_the_sequence_takes_the_full_attention_path(monkeypatch, extra):
    """w >= 2N - 1 sees the whole sequence: the call is plain full attention (module docstring), for
    w = 2N - 1 and for any wider window alike, with the same result as the dense reference."""
    import lib.model.local_attention as la

    calls = []
    real = la._full_attention
    monkeypatch.setattr(la, "_full_attention", lambda *a: calls.append(1) or real(*a))
    n = 6
    q, k, v = (t.detach() for t in _inputs(n))
    w = 2 * n - 1 + extra
    out = local_attention(q, k, v, w)
    assert calls == [1]
    torch.testing.assert_close(out, banded_reference(q, k, v, 2 * n - 1))
