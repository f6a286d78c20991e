"""Tests for the pluggable self-attention interface (lib/model/attention/)."""

from __future__ import annotations

import pytest
import torch

from lib.model.attention import (
    ATTENTION_VARIANTS,
    AttentionOutput,
    FullAttention,
    SelfAttention,
    build_attention,
    register_attention,
)

D, H = 16, 2


def _inputs(B: int = 3, N: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, D, generator=g)
    lengths = torch.tensor([N, N - 3, 1][:B])
    mask = torch.arange(N)[None, :] >= lengths[:, None]
    return x, mask, lengths


def test_registry_has_full():
    assert ATTENTION_VARIANTS["full", "encoder"] is FullAttention
    assert issubclass(FullAttention, SelfAttention)
    assert FullAttention.needs_prev_attn is False


def test_one_registry_serves_both_roles():
    """The decoder's attention is the same core in another role: one registry keyed by (kind, role),
    one decorator, and the variants of both roles share the parameter layout and initialisation."""
    from lib.model.attention import MultiheadAttention, attention_class
    from lib.model.attention.head_selection import HeadSelectionAttention, HeadSelectionMultiheadAttention
    from lib.model.attention.smoothing import SmoothedAttention, SmoothedMultiheadAttention

    assert attention_class("full", "decoder") is MultiheadAttention and issubclass(MultiheadAttention, SelfAttention)
    assert attention_class("smooth", "encoder") is SmoothedAttention
    assert attention_class("smooth", "decoder") is SmoothedMultiheadAttention
    assert attention_class("head_select", "decoder") is HeadSelectionMultiheadAttention
    assert attention_class("head_select") is HeadSelectionAttention
    with pytest.raises(ValueError, match=r"unknown attention type 'local' for the decoder role"):
        attention_class("local", "decoder")
    # the same seed gives the two roles the same weights: one initialisation
    torch.manual_seed(3)
    enc = FullAttention(D, H, 0.0)
    torch.manual_seed(3)
    dec = MultiheadAttention(D, H, 0.0)
    assert enc.state_dict().keys() == dec.state_dict().keys()
    for key, val in enc.state_dict().items():
        assert torch.equal(val, dec.state_dict()[key]), key
    # and, for self-attention without a mask, the same output as the encoder's full attention
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(dec.eval()(x, None).out, enc.eval()(x, None).out)


def test_a_decoder_variant_registers_with_the_same_decorator(monkeypatch):
    from lib.model.attention import MultiheadAttention, attention_class, build_decoder_attention

    monkeypatch.setattr("lib.model.attention.base.ATTENTION_VARIANTS", dict(ATTENTION_VARIANTS))

    @register_attention("scaled_toy")
    class Scaled(MultiheadAttention):
        def __init__(self, d_model, n_heads, dropout, *, factor: float):
            super().__init__(d_model, n_heads, dropout)
            self.factor = factor

    assert attention_class("scaled_toy", "decoder") is Scaled
    with pytest.raises(ValueError, match="unknown attention type 'scaled_toy'"):
        attention_class("scaled_toy", "encoder")
    built = build_decoder_attention({"type": "scaled_toy", "factor": 2.0, "layers": [2]}, D, H, 0.0, layer=2)
    assert isinstance(built, Scaled) and built.factor == 2.0
    assert type(build_decoder_attention({"type": "scaled_toy", "factor": 2.0, "layers": [2]}, D, H, 0.0,
                                        layer=1)) is MultiheadAttention
    with pytest.raises(ValueError, match="already registered"):
        register_attention("scaled_toy")(type("Other", (MultiheadAttention,), {}))
    with pytest.raises(TypeError, match="not a SelfAttention subclass"):
        register_attention("plain_toy")(torch.nn.Linear)


def test_a_variant_module_in_the_package_is_found_by_its_kind_without_a_table(tmp_path):
    """A kind not registered yet is found in the package's module sources (``@register_attention("kind")``)
    and only its module is imported: a new variant's module is found by being in the package (a fresh
    process, the package's path extended by a folder holding a toy variant). A plain kind imports no
    variant, and the unknown-kind error imports nothing and names the kinds not loaded yet."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "toy_found.py").write_text(
        "from lib.model.attention.full import FullAttention\n"
        "from lib.model.attention.base import register_attention\n"
        "@register_attention('found_toy')\n"
        "class FoundToy(FullAttention):\n"
        "    pass\n")
    code = f"""
import sys
import lib.model.attention as pkg
from lib.model.attention.base import attention_class, unloaded_kinds
pkg.__path__.append({str(tmp_path)!r})
on_demand = set(unloaded_kinds())  # every variant module's kinds, read from the sources (the toy's included)
variants = set(unloaded_kinds().values())
assert {{'found_toy', 'head_select', 'smooth'}} <= on_demand, on_demand
assert {{'lib.model.attention.smoothing', 'lib.model.attention.head_selection',
        'lib.model.attention.toy_found'}} <= variants, variants
assert attention_class('local').__name__ == 'LocalAttention'
assert not variants & set(sys.modules)
try:
    attention_class('nope', 'decoder')
except ValueError as e:
    assert f"known: {{sorted(on_demand | {{'full'}})}}" in str(e), e
else:
    raise AssertionError('no error')
assert not variants & set(sys.modules)  # the error imported nothing
assert attention_class('smooth', 'decoder').__module__ == 'lib.model.attention.smoothing'
assert variants & set(sys.modules) == {{'lib.model.attention.smoothing'}}  # only the kind's module
assert attention_class('found_toy').__module__ == 'lib.model.attention.toy_found'
"""
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def test_every_registration_in_the_package_is_found_by_its_source():
    """base.load_variant finds a kind by a line ``@register_attention("kind")`` at the start of a line of
    its module (a literal, not a constant or a keyword): every module of the package registers exactly the
    kinds its source shows that way, so a model file naming any of them loads in a fresh process."""
    import importlib
    from pathlib import Path

    import lib.model.attention as pkg
    from lib.model.attention.base import _REGISTERS

    for path in sorted(Path(pkg.__path__[0]).glob("[!_]*.py")):
        module = importlib.import_module(f"lib.model.attention.{path.stem}")
        registered = {kind for (kind, _), cls in ATTENTION_VARIANTS.items() if cls.__module__ == module.__name__}
        assert registered == set(_REGISTERS.findall(path.read_text(encoding="utf-8"))), path.name


def test_a_variant_without_rel_pos_max_refuses_the_bias_by_name(monkeypatch):
    """``model.overrides.rel_pos_bias`` reaches every encoder layer as ``rel_pos_max``: a variant whose
    ``__init__`` does not take it is refused with a ValueError naming the kind, not a TypeError."""
    monkeypatch.setattr("lib.model.attention.base.ATTENTION_VARIANTS", dict(ATTENTION_VARIANTS))

    @register_attention("no_bias_toy")
    class NoBias(FullAttention):
        def __init__(self, d_model, n_heads, dropout, *, scale: float = 1.0):
            super().__init__(d_model, n_heads, dropout)

    assert isinstance(build_attention({"type": "no_bias_toy"}, D, H, 0.0), NoBias)
    with pytest.raises(ValueError, match="rel_pos_bias.*not implemented for attention type 'no_bias_toy'"):
        build_attention({"type": "no_bias_toy"}, D, H, 0.0, rel_pos_max=4)
    assert build_attention({"type": "full"}, D, H, 0.0, rel_pos_max=4).rel_pos_max == 4


def test_build_attention_full():
    attn = build_attention({"type": "full"}, D, H, 0.1)
    assert isinstance(attn, FullAttention)
    assert attn.n_heads == H and attn.head_dim == D // H and attn.dropout == 0.1
    names = {n for n, _ in attn.named_parameters()}
    assert names == {f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for w in ("weight", "bias")}
    for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
        lin = getattr(attn, p)
        assert lin.weight.shape == (D, D) and lin.bias.shape == (D,)


@pytest.mark.parametrize(
    "spec, needle",
    [
        ({"type": "nope"}, "nope"),
        ({"window": 3}, "type"),
        ({"type": "full", "window": 3}, "window"),
        ({"type": "full", "foo": 1, "bar": 2}, "bar"),
        ("full", "dict"),
    ],
)
def test_build_attention_errors(spec, needle):
    with pytest.raises(ValueError, match=needle):
        build_attention(spec, D, H, 0.0)


def test_build_attention_variant_keys(monkeypatch):
    """Variant keys come from the subclass __init__: unknown / missing keys are named."""
    monkeypatch.setattr("lib.model.attention.base.ATTENTION_VARIANTS", dict(ATTENTION_VARIANTS))

    @register_attention("windowed_toy")
    class Windowed(FullAttention):
        def __init__(self, d_model, n_heads, dropout, *, window: int, scale: float = 1.0):
            super().__init__(d_model, n_heads, dropout)
            self.window, self.scale = window, scale

    a = build_attention({"type": "windowed_toy", "window": 13}, D, H, 0.0)
    assert isinstance(a, Windowed) and a.window == 13 and a.scale == 1.0
    with pytest.raises(ValueError, match="window"):
        build_attention({"type": "windowed_toy"}, D, H, 0.0)
    with pytest.raises(ValueError, match="proj_heads"):  # base-only params are not spec keys
        build_attention({"type": "windowed_toy", "window": 3, "proj_heads": 4}, D, H, 0.0)


def test_shapes_and_padding_weights():
    attn = build_attention({"type": "full"}, D, H, 0.0).eval()
    x, mask, lengths = _inputs()
    res = attn(x, mask, need_weights=True)
    assert isinstance(res, AttentionOutput)
    assert res.out.shape == x.shape
    w = res.weights
    assert w.shape == (3, H, 7, 7)
    assert torch.isfinite(w).all() and torch.isfinite(res.out).all()
    # padded keys get exactly zero weight
    assert (w.masked_select(mask[:, None, None, :].expand_as(w)) == 0).all()
    # every row (padded queries included: finite bias -> no NaN) sums to 1
    torch.testing.assert_close(w.sum(-1), torch.ones(3, H, 7))
    assert attn(x, mask).weights is None


def test_fast_path_equals_explicit_path():
    attn = build_attention({"type": "full"}, D, H, 0.0).eval()
    x, mask, lengths = _inputs()
    fast = attn(x, mask).out
    slow = attn(x, mask, need_weights=True).out
    valid = ~mask
    torch.testing.assert_close(fast[valid], slow[valid], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(attn(x, None).out, attn(x, None, need_weights=True).out, atol=1e-6, rtol=1e-5)


def test_bf16_eval_on_cpu_takes_the_explicit_path(monkeypatch):
    """In eval on CPU, bf16 attention skips SDPA (slower than two bf16 matmuls there,
    lib.model.attention.explicit_on_cpu) and fp32 keeps it; the bf16 result matches fp32's."""
    attn = build_attention({"type": "full"}, D, H, 0.0).eval()
    x, mask, _ = _inputs()
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    ref = attn(x, mask).out
    assert len(calls) == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = attn(x, mask).out
    assert len(calls) == 1
    valid = ~mask
    torch.testing.assert_close(low.float()[valid], ref[valid], atol=5e-2, rtol=5e-2)


def test_padding_invariance():
    """A sequence's output does not depend on the padding appended to it."""
    attn = build_attention({"type": "full"}, D, H, 0.0).eval()
    x, mask, lengths = _inputs()
    out = attn(x, mask).out
    for b, n in enumerate(lengths.tolist()):
        alone = attn(x[b : b + 1, :n], None).out
        torch.testing.assert_close(out[b, :n], alone[0], atol=1e-5, rtol=1e-5)


def test_dropout_train_vs_eval():
    attn = build_attention({"type": "full"}, D, H, 0.5)
    x, mask, _ = _inputs()
    attn.eval()
    torch.testing.assert_close(attn(x, mask).out, attn(x, mask).out)
    attn.train()
    torch.manual_seed(0)
    a = attn(x, mask).out
    torch.manual_seed(1)
    b = attn(x, mask).out
    assert not torch.allclose(a, b)
    # returned weights are pre-dropout even in training
    w = attn(x, mask, need_weights=True).weights
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_helpers_project_merge_roundtrip():
    attn = build_attention({"type": "full"}, D, H, 0.0)
    x, _, _ = _inputs()
    q, k, v = attn._project(x)
    assert q.shape == (3, H, 7, D // H)
    torch.testing.assert_close(attn._merge(v), attn.v_proj(x))


def test_subclass_overrides_only_attend(monkeypatch):
    """A variant implementing only attend() gets projections/merge/out_proj for free and
    receives prev_attn / task; weights only returned on request."""
    monkeypatch.setattr("lib.model.attention.base.ATTENTION_VARIANTS", dict(ATTENTION_VARIANTS))
    seen = {}

    @register_attention("uniform_toy")
    class Uniform(SelfAttention):
        needs_prev_attn = True

        def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
            seen.update(prev_attn=prev_attn, task=task)
            B, _, N, _ = q.shape
            w = torch.full((B, self.n_heads, N, N), 1.0 / N)
            return self._weighted_sum(w, v), w

    a = build_attention({"type": "uniform_toy"}, D, H, 0.0)
    x, _, _ = _inputs()
    task = torch.tensor([0, 1, 2])
    prev = torch.rand(3, H, 7, 7)
    res = a(x, None, prev_attn=prev, task=task)
    assert res.weights is None and res.out.shape == x.shape
    assert seen["prev_attn"] is prev and seen["task"] is task
    expected = a.out_proj(a.v_proj(x).mean(1, keepdim=True)).expand_as(x)
    torch.testing.assert_close(res.out, expected)


def test_base_attend_is_abstract():
    a = SelfAttention(D, H, 0.0)
    with pytest.raises(NotImplementedError):
        a(torch.randn(1, 3, D), None)


def test_constructor_errors():
    with pytest.raises(ValueError, match="divisible"):
        SelfAttention(10, 3, 0.0)
    with pytest.raises(ValueError, match="dropout"):
        SelfAttention(D, H, 1.5)


def test_proj_heads_candidate_pool():
    """Head-selection hook: q/k/v project H' candidate heads, out_proj merges H heads."""
    a = SelfAttention(D, H, 0.0, proj_heads=4)
    assert a.q_proj.weight.shape == (4 * D // H, D) and a.out_proj.weight.shape == (D, D)
    q, k, v = a._project(torch.randn(2, 5, D))
    assert q.shape == (2, 4, 5, D // H)
    assert a._merge(v[:, :H]).shape == (2, 5, D)


def test_half_precision_mask_is_finite():
    """Finite padding bias does not overflow in float16/bfloat16 (CPU bf16 as proxy)."""
    attn = build_attention({"type": "full"}, D, H, 0.0).eval().to(torch.bfloat16)
    x, mask, _ = _inputs()
    res = attn(x.to(torch.bfloat16) * 10, mask, need_weights=True)
    assert torch.isfinite(res.weights).all() and torch.isfinite(res.out).all()
    w = res.weights
    assert (w.masked_select(mask[:, None, None, :].expand_as(w)) == 0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fast_and_explicit_paths_agree():
    attn = build_attention({"type": "full"}, D, H, 0.0).eval().cuda()
    x, mask, _ = _inputs()
    x, mask = x.cuda(), mask.cuda()
    valid = ~mask
    torch.testing.assert_close(attn(x, mask).out[valid], attn(x, mask, need_weights=True).out[valid], atol=1e-5, rtol=1e-4)
    ref = attn(x, mask).out  # fp32
    with torch.autocast("cuda", dtype=torch.float16):
        res = attn(x, mask, need_weights=True)
        fast = attn(x, mask)
    assert torch.isfinite(res.weights).all() and torch.isfinite(fast.out).all()
    # fp16: the two paths agree on the real query rows, and both stay near fp32. Tolerance: outputs
    # are O(1) (|out| < 1.3 here) and fp16's unit roundoff is 2^-11 ≈ 5e-4; both paths share the fp16
    # projections and differ only in the core (SDPA's fused kernel vs matmul, fp32 softmax, matmul), a
    # few roundings: this test under CPU fp16 autocast measured 5e-4 between the paths and 9e-4 from
    # fp32. 2e-2 / 3e-2 leave a >20x margin: a one-shot GPU run should not fail on rounding, while a
    # wrong mask or scale would be off by O(0.1-1).
    torch.testing.assert_close(fast.out[valid].float(), res.out[valid].float(), atol=2e-2, rtol=2e-2)
    for out in (fast.out, res.out):
        torch.testing.assert_close(out[valid].float(), ref[valid], atol=3e-2, rtol=3e-2)


def test_banded_equals_local_attention():
    """`banded` (dense band mask, for the band test of models with the relative-position control)
    computes exactly what `local` computes, padding included."""
    x, mask, _ = _inputs(N=11)
    for w in (1, 3, 7, 23):
        torch.manual_seed(0)
        banded = build_attention({"type": "banded", "window": w}, D, H, 0.0).eval()
        local = build_attention({"type": "local", "window": w}, D, H, 0.0).eval()
        local.load_state_dict(banded.state_dict())
        a, b = banded(x, mask, need_weights=True), local(x, mask, need_weights=True)
        valid = ~mask
        torch.testing.assert_close(a.out[valid], b.out[valid], atol=1e-5, rtol=1e-5)
        q_valid = valid[:, None, :, None] & valid[:, None, None, :]  # valid queries and keys
        torch.testing.assert_close(a.weights * q_valid, b.weights * q_valid, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="odd"):
        build_attention({"type": "banded", "window": 4}, D, H, 0.0)


def test_training_path_with_dropout_uses_the_fast_mask_and_is_seeded():
    """On CPU in training, full attention takes the explicit path (lib.model.dropout's masks):
    same torch seed, same output, and that output is out_proj(merge(dropout(A) v)) with A the eval
    softmax weights and the fast mask drawn from the same seed. SDPA's own dropout (torch's Bernoulli
    mask) would give another output for that seed."""
    from lib.model.dropout import dropout

    attn = build_attention({"type": "full"}, D, H, 0.3)
    x, mask, _ = _inputs()
    weights = attn.eval()(x, mask, need_weights=True).weights  # pre-dropout A; eval draws no mask
    _, _, v = attn._project(x)
    attn.train()
    torch.manual_seed(3)
    a = attn(x, mask).out
    torch.manual_seed(3)
    torch.testing.assert_close(attn(x, mask).out, a, rtol=0, atol=0)
    torch.manual_seed(3)
    expected = attn.out_proj(attn._merge(torch.matmul(dropout(weights, 0.3, True), v)))
    torch.testing.assert_close(a, expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(a, attn.eval()(x, mask).out, atol=1e-3)  # the mask did drop something



@pytest.mark.parametrize("spec", [{"type": "full"}, {"type": "local", "window": 3}])
def test_core_fp32_runs_the_core_in_fp32_under_bf16_autocast(spec):
    """core_fp32 (model.overrides.attention_fp32): projections in bf16 (autocast), scores / softmax /
    weighted sum in fp32; the weights equal the fp32 softmax of the bf16-rounded projections and the
    output is out_proj (bf16) of that core. Without it the core stays in bf16 (CPU autocast)."""
    torch.manual_seed(0)
    attn = build_attention(spec, D, H, 0.0).eval()
    x, mask, _ = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attn(x, mask, need_weights=True).weights.dtype == torch.bfloat16  # default: autocast's policy
        attn.core_fp32 = True
        res = attn(x, mask, need_weights=True)
        q, k, v = attn._project(x)
    assert q.dtype == torch.bfloat16  # autocast is on for the projections
    assert res.weights.dtype == torch.float32  # ...and off for the core
    with torch.autocast("cpu", enabled=False):
        ctx, weights = attn.attend(q.float(), k.float(), v.float(), mask, need_weights=True)[:2]
    torch.testing.assert_close(res.weights, weights, rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn.out_proj(attn._merge(ctx.to(torch.bfloat16)))
    torch.testing.assert_close(res.out, out, rtol=0, atol=0)
    attn.train()  # gradients flow back through the casts to every parameter
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attn(x, mask).out.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())


def test_attention_fp32_reaches_every_encoder_layer_and_stays_out_of_default_configs():
    from lib.model.config import ModelConfig
    from lib.model.s2t_transformer import S2TTransformer, model_config

    cfg = model_config("demo", vocab_size=20, attention_fp32=True)
    model = S2TTransformer(cfg)
    assert all(layer.self_attn.core_fp32 for layer in model.encoder.layers)
    assert cfg.to_dict()["attention_fp32"] is True
    assert ModelConfig.from_dict(cfg.to_dict()).attention_fp32 is True
    default = model_config("demo", vocab_size=20)
    assert "attention_fp32" not in default.to_dict()  # old checkpoints' configs and fingerprints hold
    assert not any(layer.self_attn.core_fp32 for layer in S2TTransformer(default).encoder.layers)
    with pytest.raises(ValueError, match="attention_fp32"):
        model_config("demo", vocab_size=20, attention_fp32="yes")


def test_dense_band_is_cheaper_only_for_short_16_bit_sequences_on_cpu():
    from lib.model.local_attention import (
    DENSE_BAND_MAX_LEN,
    dense_band_is_cheaper,
)

    cpu = torch.device("cpu")
    assert dense_band_is_cheaper(DENSE_BAND_MAX_LEN, torch.bfloat16, cpu)
    assert dense_band_is_cheaper(1, torch.float16, cpu)
    assert not dense_band_is_cheaper(DENSE_BAND_MAX_LEN + 1, torch.bfloat16, cpu)
    assert not dense_band_is_cheaper(10, torch.float32, cpu)
    assert not dense_band_is_cheaper(10, torch.bfloat16, torch.device("cuda"))


def _local_pair(w: int, dropout: float = 0.0):
    torch.manual_seed(0)
    local = build_attention({"type": "local", "window": w}, D, H, dropout)
    banded = build_attention({"type": "banded", "window": w}, D, H, dropout)
    banded.load_state_dict(local.state_dict())
    return local, banded


def test_local_dense_band_path_equals_banded_attention_and_the_blocked_kernel(monkeypatch):
    """LocalAttention's dense path (forced here in fp32) computes BandedAttention's dense masked
    attention (which takes SDPA here: last bits differ) and the blocked kernel's result on every
    real query, forward and backward."""
    import lib.model.local_attention as la

    x, mask, _ = _inputs(N=11)
    valid = ~mask
    for w in (1, 3, 7, 23):
        local, banded = _local_pair(w)
        outs, grads = [], []
        for dense in (True, False):
            monkeypatch.setattr(la, "dense_band_is_cheaper", lambda n, dtype, device, dense=dense: dense)
            xx = x.clone().requires_grad_()
            out = local.train()(xx, mask).out
            out[valid].sum().backward()
            outs.append(out)
            grads.append(xx.grad)
        xb = x.clone().requires_grad_()
        ref = banded.train()(xb, mask).out
        ref[valid].sum().backward()
        torch.testing.assert_close(outs[0][valid], ref[valid], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(grads[0], xb.grad, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(outs[0][valid], outs[1][valid], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)


def test_local_attention_takes_the_dense_band_path_in_bf16_on_cpu_only_for_short_sequences(monkeypatch):
    """Under CPU bf16 autocast, N <= DENSE_BAND_MAX_LEN: the dense path (the blocked kernel is not
    called), close to the blocked kernel's bf16 result; fp32, longer sequences and need_weights
    (analysis) keep the blocked kernel. Training with dropout stays seeded."""
    import lib.model.local_attention as la

    calls = []
    real = la.local_attention
    monkeypatch.setattr(la, "local_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    x, mask, _ = _inputs(N=11)
    valid = ~mask
    local, _ = _local_pair(5)
    local.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dense = local(x, mask).out
        assert calls == []
        local(x, mask, need_weights=True)
        assert len(calls) == 1
        monkeypatch.setattr(la, "DENSE_BAND_MAX_LEN", 10)  # N = 11 is now "long"
        blocked = local(x, mask).out
        assert len(calls) == 2
    torch.testing.assert_close(dense.float()[valid], blocked.float()[valid], atol=3e-2, rtol=3e-2)
    local(x, mask)  # fp32
    assert len(calls) == 3

    monkeypatch.setattr(la, "DENSE_BAND_MAX_LEN", 128)
    local, _ = _local_pair(5, dropout=0.3)
    local.train()
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs.append(local(x, mask).out)
    assert len(calls) == 3
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    # ...and the dropout is applied: the training output is the band-masked softmax weights through
    # lib.model.dropout's fast mask (drawn from the same seed) times v, not the eval output.
    from lib.model.attention.base import band_bias
    from lib.model.dropout import dropout

    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = local._project(x)
        band = band_bias(x.shape[1], 5, q.dtype, q.device)
        weights = local._softmax_weights(q, k, mask, extra_bias=band)
        torch.manual_seed(7)
        expected = local.out_proj(local._merge(torch.matmul(dropout(weights, 0.3, True), v)))
        plain = local.eval()(x, mask).out
    assert len(calls) == 3
    torch.testing.assert_close(runs[0][valid], expected[valid], rtol=0, atol=0)
    assert not torch.allclose(runs[0][valid].float(), plain[valid].float(), atol=5e-2)


@pytest.mark.parametrize("bad", [0, 2, -3, 4.0, True, "13", None])
def test_every_kind_checks_its_window_with_one_rule(bad):
    """lib.model.config.odd_window: one rule (a positive odd int), the key named, for every kind."""
    from lib.model.config import odd_window

    for spec, what in (({"type": "local"}, "local attention window"), ({"type": "banded"}, "banded attention window")):
        with pytest.raises(ValueError, match=f"{what} must be a positive odd integer, got"):
            build_attention({**spec, "window": bad}, 16, 4, 0.0)
    if bad is not None:
        with pytest.raises(ValueError, match="smooth.window: must be a positive odd integer or None"):
            odd_window(bad, "smooth.window:", optional=True)
    assert odd_window(None, "x", optional=True) is None and odd_window(13, "x") == 13
