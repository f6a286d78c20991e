"""The local-attention paths for CUDA (lib/model/local_attention.py, "CUDA paths"): the dispatch table,
SDPA with a band mask, the FlashAttention-2 glue on the packed (varlen) layout against a pure-PyTorch
stand-in of the op, the op's schema, the encoder's packed layout, and CUDA-only twins of each."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch

import lib.model.cuda_attention as ca
import lib.model.local_attention as la
from lib.model.local_attention import (
    attention_path,
    banded_reference,
    local_attention,
)
from lib.model.cuda_attention import (
    Packing,
    packed_attention,
    sdpa_band_attention,
)
from lib.model.s2t_transformer import S2TTransformer, S2TTransformerEncoder, model_config

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
FLASH_POSITIONAL = ["query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p", "is_causal",
                    "return_debug_mask"]


def _qkv(b, h, n, dh, dtype=torch.float64, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, dh, generator=g, dtype=dtype).to(device).requires_grad_(True) for _ in range(3)]


def _padding(lengths, n, device="cpu"):
    return (torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]).to(device)  # (B, N) True = pad


def _valid_rows(kpm):
    return (~kpm)[:, None, :, None]  # (B, 1, N, 1)


# ----------------------------------------------------------------------------- the dispatch table


@pytest.mark.parametrize("device, dtype, dh, n, need_weights, packed, flash, expected", [
    # CPU: the path of before, unchanged (dense band only for short 16-bit sequences)
    ("cpu", torch.float32, 64, 100, False, False, False, "blocked"),
    ("cpu", torch.float64, 64, 100, False, True, True, "blocked"),
    ("cpu", torch.bfloat16, 64, 100, False, False, False, "dense_band"),
    ("cpu", torch.bfloat16, 64, la.DENSE_BAND_MAX_LEN + 1, False, False, False, "blocked"),
    ("cpu", torch.bfloat16, 64, 100, True, False, False, "blocked"),
    ("cpu", torch.bfloat16, 64, 100, False, True, True, "dense_band"),
    # weights asked for: the blocked kernel everywhere
    ("cuda", torch.bfloat16, 64, 100, True, True, True, "blocked"),
    ("cuda", torch.float32, 64, 100, True, False, False, "blocked"),
    # CUDA, packed, 16-bit, head dim <= 256 and a multiple of 8, op usable: FA2
    ("cuda", torch.bfloat16, 64, 1052, False, True, True, "flash"),
    ("cuda", torch.float16, 256, 166, False, True, True, "flash"),
    ("cuda", torch.bfloat16, 8, 5, False, True, True, "flash"),
    # CUDA otherwise: SDPA with a band mask
    ("cuda", torch.float32, 64, 166, False, True, True, "sdpa_band"),
    ("cuda", torch.bfloat16, 64, 166, False, False, True, "sdpa_band"),
    ("cuda", torch.bfloat16, 64, 166, False, True, False, "sdpa_band"),
    ("cuda", torch.bfloat16, 264, 166, False, True, True, "sdpa_band"),
    ("cuda", torch.bfloat16, 60, 166, False, True, True, "sdpa_band"),
    ("cuda", torch.float64, 64, 166, False, True, True, "sdpa_band"),
    # other devices: the blocked kernel
    ("mps", torch.float32, 64, 166, False, True, True, "blocked"),
])
def test_dispatch_table(device, dtype, dh, n, need_weights, packed, flash, expected):
    got = attention_path(device, dtype, dh, n, need_weights=need_weights, packed=packed, flash_available=flash)
    assert got == expected and got in la.ATTENTION_PATHS


def test_flash_is_never_supported_off_cuda():
    assert not ca.flash_supported(torch.device("cpu"))


# ----------------------------------------------------------------------------- the op's schema


def _schema(name):
    op = getattr(torch.ops.aten, name, None)
    if op is None:
        pytest.fail(f"torch {torch.__version__} has no aten::{name}: the packed FA2 path of "
                    "lib/model/local_attention.py needs it")
    return op.default._schema


def test_flash_op_schema_is_what_the_glue_calls():
    """A torch upgrade that renames or reorders the op's arguments fails here, not on a GPU."""
    schema = _schema("_flash_attention_forward")
    names = [a.name for a in schema.arguments]
    assert names[:len(FLASH_POSITIONAL)] == FLASH_POSITIONAL
    for name in ("window_size_left", "window_size_right", "scale"):
        arg = next(a for a in schema.arguments if a.name == name)
        assert arg.kwarg_only, name
    assert set(ca.FLASH_SCHEMA_ARGS) <= set(names)
    assert schema.returns[0].name == "output"
    backward = _schema("_flash_attention_backward")
    assert {"window_size_left", "window_size_right", "cum_seq_q"} <= {a.name for a in backward.arguments}
    # autograd: the forward has a derivative formula (the backward above), registered for Autograd
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::_flash_attention_forward", "Autograd")


def fa2_standin(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
                scale=None, window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None):
    """Pure-PyTorch stand-in of ``aten::_flash_attention_forward`` in its varlen layout (no dropout):
    (T, H, dh) packed rows, sequences cut by the cumulative lengths, query i attends keys j with
    i - left <= j <= i + right (-1: unbounded). Records its arguments in ``fa2_standin.calls``."""
    fa2_standin.calls.append({"cu_q": cum_seq_q.tolist(), "cu_k": cum_seq_k.tolist(), "max_q": max_q,
                              "max_k": max_k, "left": window_size_left, "right": window_size_right,
                              "scale": scale, "dropout_p": dropout_p, "is_causal": is_causal})
    assert not is_causal and dropout_p == 0.0 and seqused_k is None and alibi_slopes is None
    assert torch.equal(cum_seq_q, cum_seq_k) and cum_seq_q.dtype == torch.int32
    outs = []
    cu = cum_seq_q.tolist()
    for a, b in zip(cu[:-1], cu[1:]):
        q, k, v = (t[a:b].transpose(0, 1) for t in (query, key, value))  # (H, n, dh)
        i = torch.arange(b - a, device=query.device)
        allowed = torch.ones(b - a, b - a, dtype=torch.bool, device=query.device)
        if window_size_left is not None and window_size_left >= 0:
            allowed &= i[:, None] - i[None, :] <= window_size_left
        if window_size_right is not None and window_size_right >= 0:
            allowed &= i[None, :] - i[:, None] <= window_size_right
        s = (q @ k.transpose(-1, -2)) * scale
        outs.append(torch.softmax(s.masked_fill(~allowed, float("-inf")), -1).matmul(v).transpose(0, 1))
    empty = query.new_empty(0)
    return torch.cat(outs), empty, empty, empty, empty


fa2_standin.calls = []


def test_standin_has_the_ops_signature():
    schema = _schema("_flash_attention_forward")
    params = inspect.signature(fa2_standin).parameters
    assert [a.name for a in schema.arguments] == list(params)
    assert [a.name for a in schema.arguments if a.kwarg_only] == \
        [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]


@pytest.fixture
def standin(monkeypatch):
    fa2_standin.calls.clear()
    monkeypatch.setattr(ca, "_flash_forward", fa2_standin)
    monkeypatch.setattr(ca, "_flash_refused", None)
    return fa2_standin


# ----------------------------------------------------------------------------- SDPA with a band mask


@pytest.mark.parametrize("n, lengths, w", [(23, [23, 17, 4], 5), (40, [40, 31, 9], 13), (9, [9, 3, 1], 1),
                                           (12, [12, 7, 2], 23), (12, [12, 7, 5], 101), (30, [30, 30, 30], 7)])
def test_sdpa_band_equals_reference_fp64(n, lengths, w):
    """Forward on every row (all-padding windows: zero, as the reference) and gradients of the valid
    rows' outputs, against the dense reference and the blocked kernel, in fp64."""
    q, k, v = _qkv(len(lengths), 2, n, 8)
    kpm = _padding(lengths, n)
    out = sdpa_band_attention(q, k, v, w, kpm)
    ref = banded_reference(q, k, v, w, kpm)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    blocked = local_attention(q, k, v, w, kpm)
    torch.testing.assert_close(out, blocked, atol=1e-12, rtol=1e-10)
    g = torch.Generator().manual_seed(3)
    go = torch.randn(out.shape, generator=g, dtype=out.dtype) * _valid_rows(kpm)  # loss on valid rows only
    got = torch.autograd.grad(out, (q, k, v), go)
    exp = torch.autograd.grad(ref, (q, k, v), go)
    for a, b in zip(got, exp):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


def test_sdpa_band_all_padding_rows_are_zero_without_gradient():
    n, w = 30, 3
    q, k, v = _qkv(2, 2, n, 8)
    kpm = _padding([30, 5], n)
    out = sdpa_band_attention(q, k, v, w, kpm)
    # queries 7.. of the second sequence see only padded keys within |i - j| <= 1
    assert torch.equal(out[1, :, 7:], torch.zeros_like(out[1, :, 7:]))
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.equal(dq[1, :, 7:], torch.zeros_like(dq[1, :, 7:]))
    assert torch.equal(dk[1, :, 6:], torch.zeros_like(dk[1, :, 6:])) and torch.equal(dv[1, :, 6:], torch.zeros_like(dv[1, :, 6:]))


def test_sdpa_band_full_window_and_no_mask():
    q, k, v = _qkv(2, 2, 10, 8)
    torch.testing.assert_close(sdpa_band_attention(q, k, v, None), banded_reference(q, k, v, 19), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(sdpa_band_attention(q, k, v, 19), banded_reference(q, k, v, 19), atol=1e-12, rtol=1e-10)
    with pytest.raises(ValueError, match="odd"):
        sdpa_band_attention(q, k, v, 4)


# ----------------------------------------------------------------------------- the packed layout


def test_packing_layout():
    p = Packing.build([3, 1, 4], 5, torch.device("cpu"))
    assert p.index.tolist() == [0, 1, 2, 5, 10, 11, 12, 13]
    assert p.cu_seqlens.tolist() == [0, 3, 4, 8] and p.cu_seqlens.dtype == torch.int32
    assert p.max_len == 4 and p.total == 8 and p.lengths == [3, 1, 4]
    x = torch.arange(3 * 5 * 2, dtype=torch.float64).view(3, 5, 2)
    packed = p.pack(x)
    assert packed.shape == (8, 2) and torch.equal(packed[3], x[1, 0])
    back = p.unpack(packed)
    mask = p.padding_mask("cpu")
    assert torch.equal(back[~mask], x[~mask]) and torch.equal(back[mask], torch.zeros_like(back[mask]))
    with pytest.raises(ValueError, match="lengths"):
        Packing.build([6], 5, torch.device("cpu"))


@pytest.mark.parametrize("w", [None, 1, 5, 13, 41])
def test_flash_glue_against_standin(standin, w):
    """Packing, cumulative lengths, window mapping ((w - 1) / 2 each side; -1 for full attention) and
    the scatter back, compared with the reference on the valid rows; gradients too."""
    lengths, n = [20, 13, 6], 20
    q, k, v = _qkv(3, 2, n, 8)
    kpm = _padding(lengths, n)
    p = Packing.build(lengths, n, torch.device("cpu"))

    def pack(t):  # (B, H, N, dh) -> (T, H, dh)
        return p.pack(t.transpose(1, 2))

    out = packed_attention(pack(q), pack(k), pack(v), p, w)
    assert out.shape == (sum(lengths), 2, 8)
    call = standin.calls[-1]
    half = -1 if w is None else (w - 1) // 2
    assert (call["left"], call["right"]) == (half, half)
    assert call["cu_q"] == [0, 20, 33, 39] and call["max_q"] == call["max_k"] == 20
    assert call["scale"] == pytest.approx(8 ** -0.5)
    ref = banded_reference(q, k, v, 2 * n - 1 if w is None else w, kpm)
    got = p.unpack(out).transpose(1, 2)  # (B, H, N, dh), zeros on padding
    valid = _valid_rows(kpm).expand_as(ref)
    torch.testing.assert_close(got[valid], ref[valid], atol=1e-12, rtol=1e-10)
    assert torch.equal(got[~valid], torch.zeros_like(got[~valid]))
    go = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=ref.dtype) * valid
    for a, b in zip(torch.autograd.grad(got, (q, k, v), go), torch.autograd.grad(ref, (q, k, v), go)):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


def test_flash_refusal_falls_back_once_with_a_warning(monkeypatch):
    calls = []

    def refuses(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")

    monkeypatch.setattr(ca, "_flash_forward", refuses)
    monkeypatch.setattr(ca, "_flash_refused", None)
    lengths, n, w = [11, 4], 11, 5
    q, k, v = _qkv(2, 2, n, 8)
    p = Packing.build(lengths, n, torch.device("cpu"))
    pack = lambda t: p.pack(t.transpose(1, 2))  # noqa: E731
    with pytest.warns(RuntimeWarning, match="Ampere"):
        out = packed_attention(pack(q), pack(k), pack(v), p, w)
    ref = pack(banded_reference(q, k, v, w, _padding(lengths, n)))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    assert p.path == "sdpa_band" and ca._flash_refused
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the second call is silent and skips the op
        p2 = Packing.build(lengths, n, torch.device("cpu"))
        packed_attention(pack(q), pack(k), pack(v), p2, w)
    assert len(calls) == 1


# ----------------------------------------------------------------------------- the encoder, packed


def _model(specs, ctc=False, seed=0):
    cfg = model_config("tiny", vocab_size=11, encoder_attention=specs, ctc_vocab_size=11 if ctc else None)
    torch.manual_seed(seed)
    return S2TTransformer(cfg)


def _feats(lengths, n_mels=80, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    feats = torch.randn(len(lengths), t, n_mels, generator=g, dtype=dtype)
    feats = feats.masked_fill(_padding(lengths, t)[..., None], 0.0)
    return feats, torch.tensor(lengths)


@pytest.mark.parametrize("ctc_layer", [0, 1])
def test_encoder_packed_equals_padded(standin, monkeypatch, ctc_layer):
    """The encoder packed once after the subsampler (the FA2 op replaced by the stand-in) gives the
    padded layout's output, CTC logits and gradients in fp64; padded rows zero."""
    specs = [{"type": "full"}, {"type": "local", "window": 3}]
    model = _model(specs, ctc=True).double().eval()
    model.encoder.cfg.ctc_layer = ctc_layer
    feats, lengths = _feats([61, 40, 13])
    ref = model.encode(feats, lengths)
    ref_grads = torch.autograd.grad((ref.out ** 2).sum() + ref.ctc_logits.sum(), list(model.parameters()),
                                    allow_unused=True, retain_graph=True)
    monkeypatch.setattr(S2TTransformerEncoder, "packing_path", lambda self, content, need_weights: "flash")
    got = model.encode(feats, lengths, feat_lengths_host=[61, 40, 13])
    assert len(standin.calls) == 2 and standin.calls[0]["left"] == -1 and standin.calls[1]["left"] == 1
    assert torch.equal(got.padding_mask, ref.padding_mask) and torch.equal(got.lengths, ref.lengths)
    torch.testing.assert_close(got.out, ref.out, atol=1e-10, rtol=1e-9)
    assert torch.equal(got.out[got.padding_mask], torch.zeros_like(got.out[got.padding_mask]))
    torch.testing.assert_close(got.ctc_logits, ref.ctc_logits, atol=1e-10, rtol=1e-9)
    grads = torch.autograd.grad((got.out ** 2).sum() + got.ctc_logits.sum(), list(model.parameters()),
                                allow_unused=True, retain_graph=True)
    for (name, _), a, b in zip(model.named_parameters(), grads, ref_grads):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-8, msg=name)
    # the CTC logits alone reach the encoder layers below the head in both layouts, alike (the head
    # reads the live output, not a detached copy)
    layer_params = list(model.encoder.layers[:ctc_layer or None].parameters())
    ctc_grads = [torch.autograd.grad(enc.ctc_logits.pow(2).sum(), layer_params, allow_unused=True)
                 for enc in (ref, got)]
    for a, b in zip(*ctc_grads):
        assert a is not None and b is not None
        torch.testing.assert_close(b, a, atol=1e-9, rtol=1e-8)
    assert sum(float(g.abs().sum()) for g in ctc_grads[1]) > 0
    # without host lengths the encoder reads them from the tensor (the same packing)
    again = model.encode(feats, lengths)
    torch.testing.assert_close(again.out, got.out, atol=0, rtol=0)


def test_encoder_packs_only_what_it_can():
    """CPU never packs; weights, smoothing, head selection or the fp32 core keep the padded layout."""
    model = _model([{"type": "full"}, {"type": "local", "window": 3}])
    content = torch.zeros(2, 5, 16)
    assert model.encoder.packing_path(content, False) is None  # CPU
    assert all(layer.self_attn.packable() for layer in model.encoder.layers)
    banded = _model([{"type": "banded", "window": 3}, {"type": "full"}])
    assert not banded.encoder.layers[0].self_attn.packable()
    model.encoder.layers[0].self_attn.core_fp32 = True
    assert not model.encoder.layers[0].self_attn.packable()


# ----------------------------------------------------------------------------- CUDA twins


@CUDA
@pytest.mark.parametrize("w", [1, 13, 61])
def test_cuda_sdpa_band_matches_blocked_kernel(w):
    q, k, v = _qkv(3, 4, 166, 64, dtype=torch.float32, device="cuda")
    kpm = _padding([166, 120, 9], 166, "cuda")
    out = sdpa_band_attention(q, k, v, w, kpm)
    ref = local_attention(q, k, v, w, kpm)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    go = torch.randn_like(out) * _valid_rows(kpm)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), go), torch.autograd.grad(ref, (q, k, v), go)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("w", [None, 1, 3, 13, 61])
def test_cuda_flash_packed_matches_reference(dtype, w):
    if not ca.flash_supported(torch.device("cuda")):
        pytest.skip("FlashAttention-2 is not usable on this card / torch")
    lengths, n, dh = [166, 120, 9, 1], 166, 64
    q, k, v = _qkv(len(lengths), 4, n, dh, dtype=torch.float64, device="cuda")
    kpm = _padding(lengths, n, "cuda")
    p = Packing.build(lengths, n, torch.device("cuda"))
    low = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    out = packed_attention(*(p.pack(t.transpose(1, 2)) for t in low), p, w)
    assert p.path == "flash" and out.dtype == dtype
    ref = banded_reference(*(t.detach().double() for t in low), 2 * n - 1 if w is None else w, kpm)
    got = p.unpack(out).transpose(1, 2).double()
    valid = _valid_rows(kpm).expand_as(ref)
    assert (got[valid] - ref[valid]).abs().max() < 2e-2
    # backward through the op against the float64 reference's, with one upstream gradient on the valid
    # query rows: a backward without the window, or of another op, lands far outside this tolerance
    g_ref = torch.randn(ref.shape, dtype=torch.float64, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    g_ref = g_ref * _valid_rows(kpm)
    grads = torch.autograd.grad(out, low, p.pack(g_ref.transpose(1, 2)).to(dtype))
    exact = [t.detach().double().requires_grad_(True) for t in low]
    ref_out = banded_reference(*exact, 2 * n - 1 if w is None else w, kpm)
    ref_grads = torch.autograd.grad(ref_out, exact, g_ref)
    for name, g, r in zip("qkv", grads, ref_grads):
        err = (g.double() - r).abs().max().item()
        # the figure docs/gpu.md quotes (pytest -rP shows it): the largest error relative to the largest entry
        scale = r.abs().max().item()  # 0 for dq at w = 1: a query sees only itself, its softmax is constant
        print(f"FA2 {str(dtype).split('.')[-1]} w={w or 'full'} d{name}: "
              + (f"max |err| / max |ref| = {err / scale:.2e}" if scale else f"max |err| = {err:.2e} (ref is 0)"))
        assert err <= 3e-2 * r.abs().max().item() + 1e-3, f"d{name}: max error {err} (scale {r.abs().max().item()})"
    # with dropout: runs, differs from the exact output
    drop = packed_attention(*(p.pack(t.transpose(1, 2)) for t in low), p, w, dropout_p=0.1, training=True)
    assert drop.shape == out.shape and not torch.equal(drop, out)
    # and the backward replays the forward's dropout mask: for O = A_drop V, dV = A_drop^T dO, so
    # sum(V * dV) = sum(dO * O) with the forward's mask only; with dO = O, another mask would give
    # sum(O * O') instead, short of sum(O * O) by about p / (1 - p) of it (11 %), far outside 1 %
    dv = torch.autograd.grad(drop, low[2], drop.detach())[0]
    lhs = (low[2].detach().double() * dv.double()).sum().item()
    rhs = drop.detach().double().pow(2).sum().item()
    print(f"FA2 {str(dtype).split('.')[-1]} w={w or 'full'} dropout 0.1: |sum(V dV) - sum(dO O)| / sum(dO O) = "
          f"{abs(lhs - rhs) / rhs:.2e}")
    assert abs(lhs - rhs) <= 1e-2 * rhs, f"sum(V dV) {lhs} vs sum(dO O) {rhs}: the backward's dropout mask differs"


@CUDA
def test_cuda_encoder_packed_matches_padded_bf16(monkeypatch):
    """Paper-size layers (d = 256, 4 heads), bf16 autocast: the packed layout (FA2) against the padded
    one (SDPA with a band mask; full layers: SDPA) and the blocked kernel (need_weights), valid rows."""
    if not ca.flash_supported(torch.device("cuda")):
        pytest.skip("FlashAttention-2 is not usable on this card / torch")
    cfg = model_config("s", vocab_size=11, encoder_layers=4, decoder_layers=1,
                       encoder_attention=[{"type": "full"}] + [{"type": "local", "window": 13}] * 3)
    torch.manual_seed(0)
    model = S2TTransformer(cfg).cuda().eval()
    feats, lengths = _feats([660, 400, 37], dtype=torch.float32)
    feats, lengths = feats.cuda(), lengths.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert model.encoder.packing_path(torch.zeros(1, 1, 256, device="cuda"), False) == "flash"
        packed = model.encode(feats, lengths, feat_lengths_host=[660, 400, 37])
        synced = model.encode(feats, lengths)  # host lengths read from the tensor: the same packing
        reference = model.encode(feats, lengths, need_weights=True)  # the blocked kernel, padded
        monkeypatch.setattr(S2TTransformerEncoder, "packing_path", lambda self, content, need_weights: None)
        padded = model.encode(feats, lengths)  # SDPA with a band mask, padded
    assert torch.equal(packed.out, synced.out)
    valid = ~packed.padding_mask
    for other in (padded, reference):
        diff = (packed.out[valid].float() - other.out[valid].float()).abs().max().item()
        assert diff < 0.1, diff
    assert torch.equal(packed.out[~valid], torch.zeros_like(packed.out[~valid]))


@CUDA
def test_cuda_encoder_packed_forward_has_no_sync():
    if not ca.flash_supported(torch.device("cuda")):
        pytest.skip("FlashAttention-2 is not usable on this card / torch")
    model = _model([{"type": "full"}, {"type": "local", "window": 3}]).cuda().train()
    feats, lengths = _feats([61, 40, 13], dtype=torch.float32)
    feats, lengths = feats.cuda(), lengths.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            enc = model.encode(feats, lengths, feat_lengths_host=[61, 40, 13])
        enc.out.float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert math.isfinite(float(enc.out.float().sum()))
