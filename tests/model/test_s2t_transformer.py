"""Tests for the S2T Transformer (lib/model/s2t_transformer.py); tiny config, CPU."""

from __future__ import annotations

import io

import pytest
import torch

from lib.model.checkpoint import load_decoder_layers, load_encoder
from lib.model.attention import ATTENTION_VARIANTS, FullAttention, mask_bias, register_attention
from lib.model.s2t_transformer import (
    MODEL_SIZES,
    EncoderOutput,
    ModelConfig,
    S2TTransformer,
    model_config,
    subsampled_lengths,
)
from lib.model.attention import MultiheadAttention

V = 37
PAD = 1


def _model(seed: int = 0, **overrides) -> S2TTransformer:
    torch.manual_seed(seed)
    return S2TTransformer(model_config("tiny", vocab_size=V, **overrides)).eval()


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(3, 41, 80, generator=g)
    lengths = torch.tensor([41, 23, 9])
    tokens = torch.randint(3, V, (3, 6), generator=g)
    tokens[1, 4:] = PAD
    tokens[2, 2:] = PAD
    return feats, lengths, tokens


# ---------------------------------------------------------------- config


def test_model_config_sizes_and_errors():
    assert set(MODEL_SIZES) >= {"s", "demo", "tiny"}
    s = model_config("s", vocab_size=8000)
    assert (s.d_model, s.n_heads, s.ffn_dim, s.encoder_layers, s.decoder_layers) == (256, 4, 2048, 12, 6)
    assert (s.conv_channels, s.conv_kernel, s.n_mels) == (1024, 5, 80)
    assert (s.dropout, s.attention_dropout, s.activation_dropout) == (0.1, 0.1, 0.1)
    assert s.encoder_attention == [{"type": "full"}] * 12
    demo = model_config("demo")
    assert demo.encoder_layers == 12 and len(demo.encoder_attention) == 12
    assert model_config("tiny", encoder_layers=3).encoder_attention == [{"type": "full"}] * 3
    with pytest.raises(ValueError, match="huge"):
        model_config("huge")
    with pytest.raises(ValueError, match="d_modle"):
        model_config("s", d_modle=3)
    with pytest.raises(ValueError, match="2 specs"):
        model_config("s", encoder_attention=[{"type": "full"}] * 2)
    with pytest.raises(ValueError, match="bogus"):
        S2TTransformer(model_config("tiny", encoder_attention=[{"type": "full"}, {"type": "bogus"}]))
    assert ModelConfig.from_dict(s.to_dict()) == s


def test_parameter_count_paper_scale():
    """fairseq s2t_transformer_s, 8k vocabulary, no CTC head: analytic count."""
    cfg = model_config("s", vocab_size=8000)
    d, f, C, k, m, Vt = cfg.d_model, cfg.ffn_dim, cfg.conv_channels, cfg.conv_kernel, cfg.n_mels, cfg.vocab_size
    conv = (m * C * k + C) + ((C // 2) * (2 * d) * k + 2 * d)
    mha = 4 * (d * d + d)
    ln = 2 * d
    ffn = (d * f + f) + (f * d + d)
    enc_layer = mha + ln + ffn + ln
    dec_layer = mha + ln + mha + ln + ffn + ln
    expected = (
        conv
        + cfg.encoder_layers * enc_layer
        + ln  # final encoder LN
        + Vt * d  # decoder input embedding (positions are sinusoidal: no parameters)
        + cfg.decoder_layers * dec_layer
        + ln  # final decoder LN
        + d * Vt  # output projection, no bias, not tied
    )
    model = S2TTransformer(cfg)
    assert model.num_parameters() == expected == 31_072_256
    ctc = S2TTransformer(model_config("tiny", vocab_size=V, ctc_vocab_size=11))
    assert ctc.num_parameters() - _model().num_parameters() == 16 * 11 + 11


# ---------------------------------------------------------------- shapes / masks


def test_shapes_and_lengths():
    model = _model()
    feats, lengths, tokens = _batch()
    logits = model(feats, lengths, tokens)
    assert logits.shape == (3, 6, V)
    enc = model.encode(feats, lengths)
    assert isinstance(enc, EncoderOutput)
    n = (41 - 1) // 2 + 1
    n = (n - 1) // 2 + 1
    assert enc.out.shape == (3, n, 16)
    assert enc.lengths.tolist() == [11, 6, 3] == subsampled_lengths(lengths).tolist()
    assert enc.padding_mask.tolist() == (torch.arange(n)[None] >= enc.lengths[:, None]).tolist()
    assert (enc.out[enc.padding_mask] == 0).all()
    assert enc.layer_inputs is None and enc.attn_weights is None and enc.ctc_logits is None
    assert torch.isfinite(logits).all()


def test_encoder_output_lengths_are_the_subsamplers_on_the_lengths_device():
    model = _model()
    _, lengths, _ = _batch()
    assert model.encoder.output_lengths(lengths).tolist() == [11, 6, 3] == model.encode(*_batch()[:2]).lengths.tolist()


def test_a_float64_model_takes_the_corpus_float32_features():
    """amp: fp64 converts the model, not the data: the subsampler casts the features to its dtype, so
    the fp64 model's output is the fp32 model's to fp32 rounding, in float64, CTC head included."""
    model32 = _model(ctc_vocab_size=V)
    model64 = _model(ctc_vocab_size=V).double()
    feats, lengths, tokens = _batch()
    assert feats.dtype == torch.float32
    out64, out32 = model64(feats, lengths, tokens), model32(feats, lengths, tokens)
    assert out64.dtype == torch.float64 and model64.encode(feats, lengths).ctc_logits.dtype == torch.float64
    torch.testing.assert_close(out64.float(), out32, rtol=1e-4, atol=1e-5)


def test_need_weights_returns_every_layer():
    model = _model(encoder_layers=3)
    feats, lengths, _ = _batch()
    enc = model.encode(feats, lengths, need_weights=True)
    N = enc.out.size(1)
    assert len(enc.attn_weights) == len(enc.layer_inputs) == 3
    for w, xin in zip(enc.attn_weights, enc.layer_inputs):
        assert w.shape == (3, 2, N, N) and xin.shape == (3, N, 16)
        valid_q = ~enc.padding_mask
        sums = w.sum(-1).permute(0, 2, 1)[valid_q]  # (n_valid, H)
        torch.testing.assert_close(sums, torch.ones_like(sums))
        assert (w.masked_select(enc.padding_mask[:, None, None, :].expand_as(w)) == 0).all()
    # weights / inputs are those of the trained modules: recompute layer 1's attention block
    layer = model.encoder.layers[1]
    x = enc.layer_inputs[1]
    a = layer.self_attn(layer.self_attn_layer_norm(x), enc.padding_mask, need_weights=True)
    torch.testing.assert_close(a.weights, enc.attn_weights[1])
    # and need_weights does not change the output
    torch.testing.assert_close(enc.out, model.encode(feats, lengths).out, atol=1e-5, rtol=1e-5)


def test_ctc_head():
    """The CTC head reads the encoder output: its logits are ctc_proj(encoder output), and the CTC
    loss alone trains the encoder (every encoder layer gets a nonzero gradient from it), as the
    auxiliary CTC objective is meant to; a head on a detached output would train only itself."""
    model = _model(ctc_vocab_size=11)
    feats, lengths, _ = _batch()
    enc = model.encode(feats, lengths)
    assert enc.ctc_logits.shape == (3, enc.out.size(1), 11)
    torch.testing.assert_close(enc.ctc_logits, model.encoder.ctc_proj(enc.out), rtol=0, atol=0)
    labels = torch.tensor([[3, 5, 7], [4, 9, 1], [6, 1, 1]])  # ctc vocab 11, blank 0; rows of 3, 2, 1 labels
    lprobs = torch.log_softmax(enc.ctc_logits, -1).transpose(0, 1)  # (N, B, V)
    loss = torch.nn.functional.ctc_loss(lprobs, labels, enc.lengths, torch.tensor([3, 2, 1]), blank=0,
                                        reduction="sum")
    assert torch.isfinite(loss)
    for i, layer in enumerate(model.encoder.layers):
        params = list(layer.parameters())
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        assert all(g is not None for g in grads), f"encoder layer {i + 1}: no gradient from the CTC loss"
        assert sum(float(g.abs().sum()) for g in grads) > 0, f"encoder layer {i + 1}: zero CTC gradient"


def test_ctc_zero_init_changes_the_ctc_weight_only():
    """ctc_zero_init: the CTC head's weight starts at 0 (the same uniform posteriors whatever the seed: its
    bias only shifts every frame alike); every other weight is what the same seed draws without it, and the
    flag stays out of the config dict (and resume fingerprint) of models without it."""
    plain, zero = _model(ctc_vocab_size=11), _model(ctc_vocab_size=11, ctc_zero_init=True)
    a, b = plain.state_dict(), zero.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == ["encoder.ctc_proj.weight"]
    assert not b["encoder.ctc_proj.weight"].any() and a["encoder.ctc_proj.weight"].any()
    feats, lengths, _ = _batch()
    logp = zero.encode(feats, lengths).ctc_logits.log_softmax(-1)
    torch.testing.assert_close(logp, logp[:1, :1].expand_as(logp))  # every frame of every item alike
    assert "ctc_zero_init" not in plain.cfg.to_dict() and zero.cfg.to_dict()["ctc_zero_init"] is True


def test_intermediate_ctc_reads_layer_k_through_the_final_layer_norm():
    """ctc_layer=k: the CTC head sees layer k's output through the shared final LayerNorm (ESPnet's
    intermediate CTC); ctc_layer equal to the depth is the encoder output itself; the encoder output
    does not depend on where the head reads."""
    top = _model(seed=3, ctc_vocab_size=11, encoder_layers=3)
    mid = _model(seed=3, ctc_vocab_size=11, encoder_layers=3, ctc_layer=1)
    last = _model(seed=3, ctc_vocab_size=11, encoder_layers=3, ctc_layer=3)
    feats, lengths, _ = _batch()
    e_top, e_mid, e_last = (m.encode(feats, lengths, need_weights=True) for m in (top, mid, last))
    torch.testing.assert_close(e_mid.out, e_top.out)
    torch.testing.assert_close(e_last.ctc_logits, e_top.ctc_logits)
    enc = mid.encoder
    layer2_input = e_mid.layer_inputs[1]  # = layer 1's output
    mask = e_mid.padding_mask[..., None]
    expected = enc.ctc_proj(enc.layer_norm(layer2_input).masked_fill(mask, 0.0))
    torch.testing.assert_close(e_mid.ctc_logits, expected)
    assert not torch.allclose(e_mid.ctc_logits, e_top.ctc_logits)
    # the config round trip keeps it; the default (0) stays out of the dict (old fingerprints)
    assert mid.cfg.to_dict()["ctc_layer"] == 1 and "ctc_layer" not in top.cfg.to_dict()
    assert ModelConfig.from_dict(mid.cfg.to_dict()).ctc_layer == 1
    for bad in (-1, 4, 1.5, True):
        with pytest.raises(ValueError, match="ctc_layer"):
            model_config("tiny", encoder_layers=3, ctc_layer=bad)


def test_causal_decoder():
    """Changing a future token does not change earlier logits."""
    model = _model()
    feats, lengths, tokens = _batch()
    a = model(feats, lengths, tokens)
    t2 = tokens.clone()
    t2[0, 4] = (t2[0, 4] + 1 - 3) % (V - 3) + 3
    b = model(feats, lengths, t2)
    torch.testing.assert_close(a[0, :4], b[0, :4])
    assert not torch.allclose(a[0, 4:], b[0, 4:])


def test_padding_invariance():
    """A sample alone == the same sample inside a padded batch with a longer neighbour."""
    model = _model(encoder_layers=2)
    feats, lengths, tokens = _batch()
    enc = model.encode(feats, lengths)
    logits = model(feats, lengths, tokens)
    tok_len = (tokens != PAD).sum(1)
    for b in range(3):
        T, L = int(lengths[b]), int(tok_len[b])
        # garbage in padded frames must not matter either
        f = feats[b : b + 1, :T]
        enc1 = model.encode(f, lengths[b : b + 1])
        n = int(enc.lengths[b])
        assert enc1.out.shape[1] == n
        torch.testing.assert_close(enc.out[b, :n], enc1.out[0], atol=1e-5, rtol=1e-5)
        logits1 = model(f, lengths[b : b + 1], tokens[b : b + 1, :L])
        torch.testing.assert_close(logits[b, :L], logits1[0], atol=1e-5, rtol=1e-5)
    noisy = feats.clone()
    for b in range(3):
        noisy[b, int(lengths[b]) :] = 1e3
    torch.testing.assert_close(model(noisy, lengths, tokens), logits, atol=1e-5, rtol=1e-5)


def test_incremental_decoding_matches_full():
    model = _model()
    model.decoder.layers.append(type(model.decoder.layers[0])(model.cfg).eval())  # 2 layers
    feats, lengths, _ = _batch()
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(3, V, (3, 7), generator=g)
    enc = model.encode(feats, lengths)
    full = model.decode(tokens, enc)
    state: dict = {}
    steps = [model.decode(tokens[:, : t + 1], enc, incremental_state=state) for t in range(7)]
    inc = torch.cat(steps, dim=1)
    assert steps[0].shape == (3, 1, V)
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)


def test_reorder_incremental_state():
    model = _model()
    feats, lengths, _ = _batch()
    tokens = torch.randint(3, V, (3, 5), generator=torch.Generator().manual_seed(4))
    enc = model.encode(feats, lengths)
    order = torch.tensor([2, 0, 0])
    state: dict = {}
    for t in range(3):
        model.decode(tokens[:, : t + 1], enc, incremental_state=state)
    model.reorder_incremental_state(state, order)
    enc_r = enc.reorder(order)
    tok_r = tokens[order]
    out = [model.decode(tok_r[:, : t + 1], enc_r, incremental_state=state) for t in range(3, 5)]
    full = model.decode(tok_r, enc_r)
    torch.testing.assert_close(torch.cat(out, 1), full[:, 3:5], atol=1e-5, rtol=1e-5)


def test_reorder_within_sentences_may_skip_the_cross_attention_cache():
    """Beam search's ``cross=False``: rows that repeat one encoder row hold identical cross-attention
    keys / values, so permuting among them without reordering that cache decodes exactly the same."""
    model = _model()
    feats, lengths, _ = _batch()
    enc = model.encode(feats, lengths).reorder(torch.tensor([0, 0, 1, 1, 2, 2]))  # beam 2
    tokens = torch.randint(3, V, (6, 5), generator=torch.Generator().manual_seed(5))
    order = torch.tensor([1, 1, 2, 3, 5, 4])  # each row stays within its sentence's rows
    outs = []
    for cross in (True, False):
        state: dict = {}
        for t in range(3):
            model.decode(tokens[:, : t + 1], enc, incremental_state=state)
        model.reorder_incremental_state(state, order, cross=cross)
        outs.append((state, [model.decode(tokens[order][:, : t + 1], enc, incremental_state=state)
                             for t in range(3, 5)]))
    (full_state, full_out), (skip_state, skip_out) = outs
    for layer in full_state:
        assert torch.equal(full_state[layer]["cross"]["k"], skip_state[layer]["cross"]["k"])
    for a, b in zip(full_out, skip_out):
        assert torch.equal(a, b)
    # the self-attention cache is still reordered: skipping it would change the output
    state = {}
    for t in range(3):
        model.decode(tokens[:, : t + 1], enc, incremental_state=state)
    model.reorder_incremental_state(state, torch.tensor([1, 0, 3, 2, 5, 4]), cross=False)
    assert not torch.equal(state[0]["self"]["k"][0], skip_state[0]["self"]["k"][0])


@pytest.mark.parametrize("L,dtype,explicit", [(1, torch.float32, True), (3, torch.float32, False),
                                              (1, torch.bfloat16, True), (3, torch.bfloat16, True)])
def test_eval_attention_on_cpu_takes_the_faster_path_with_sdpa_math(monkeypatch, L, dtype, explicit):
    """Decoder attention in eval on CPU: the explicit path for one query row (an incremental step) and
    in bf16 (lib.model.attention.explicit_on_cpu), SDPA otherwise; the same numbers either way, with
    padding in the keys."""
    attn = MultiheadAttention(16, 4, 0.1).eval()
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(3, 4, n, 4, generator=g).to(dtype) for n in (L, 9, 9))
    mask = torch.zeros(3, 1, L, 9, dtype=torch.bool)
    mask[1, ..., 6:] = True
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ctx, w = attn._attend_masked(q, k, v, mask, False)
    assert bool(calls) is not explicit and w is None
    ref = real(q.float(), k.float(), v.float(), attn_mask=mask_bias(mask, torch.float32))
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(ctx.float(), ref, **tol)


# ---------------------------------------------------------------- pluggable attention


def test_prev_attn_and_task_reach_attention(monkeypatch):
    """A toy variant with needs_prev_attn receives the previous layer's weights and task ids;
    layers followed by full attention don't compute weights unless asked."""
    monkeypatch.setattr("lib.model.attention.base.ATTENTION_VARIANTS", dict(ATTENTION_VARIANTS))
    calls = []

    @register_attention("spy_full")
    class SpyFull(FullAttention):
        def attend(self, q, k, v, key_padding_mask, **kw):
            ctx, w = super().attend(q, k, v, key_padding_mask, **kw)
            calls.append(("full", kw["task"], kw["need_weights"], w))
            return ctx, w

    @register_attention("spy_prev")
    class SpyPrev(FullAttention):
        needs_prev_attn = True

        def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
            ctx, w = super().attend(q, k, v, key_padding_mask, need_weights=True)
            calls.append(("prev", task, prev_attn, w))
            return ctx, w

    specs = [{"type": "spy_full"}, {"type": "spy_full"}, {"type": "spy_prev"}, {"type": "spy_prev"}]
    model = _model(encoder_layers=4, encoder_attention=specs)
    feats, lengths, tokens = _batch()
    task = torch.tensor([2, 0, 1])
    model(feats, lengths, tokens, task=task)
    assert [c[0] for c in calls] == ["full", "full", "prev", "prev"]
    assert all(c[1] is task for c in calls)
    assert calls[0][2] is False and calls[0][3] is None  # layer 0: nobody needs its weights
    assert calls[1][2] is True and calls[1][3] is not None  # layer 1 feeds layer 2
    assert calls[2][2] is calls[1][3]  # layer 2 got layer 1's weights
    assert calls[3][2] is calls[2][3]  # layer 3 got layer 2's (possibly smoothed) weights
    # the first layer never gets prev_attn even if it asks for it
    calls.clear()
    model2 = _model(encoder_layers=2, encoder_attention=[{"type": "spy_prev"}, {"type": "spy_full"}])
    model2.encode(feats, lengths)
    assert calls[0][0] == "prev" and calls[0][2] is None


def test_carry_is_what_the_next_layer_receives(monkeypatch):
    """docs/variants.md: a variant returning (ctx, weights, carry) hands ``carry`` (not its
    weights) to the next layer as prev_attn; ``attn_weights`` still report the weights."""
    monkeypatch.setattr("lib.model.attention.base.ATTENTION_VARIANTS", dict(ATTENTION_VARIANTS))
    seen = []

    @register_attention("carry_toy")
    class CarryToy(FullAttention):
        def __init__(self, d_model, n_heads, dropout, *, consume: bool = False):
            super().__init__(d_model, n_heads, dropout)
            self.needs_prev_attn = consume  # per instance (docs/variants.md)

        def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
            seen.append((need_weights, prev_attn))
            ctx, w = super().attend(q, k, v, key_padding_mask, need_weights=need_weights)
            return ctx, w, None if w is None else 0.5 * w

    specs = [{"type": "carry_toy"}, {"type": "carry_toy", "consume": True}, {"type": "carry_toy"}]
    model = _model(encoder_layers=3, encoder_attention=specs)
    feats, lengths, _ = _batch()
    enc = model.encode(feats, lengths, need_weights=True)
    assert [s[0] for s in seen] == [True, True, True]
    assert seen[0][1] is None and seen[2][1] is None  # layers 1 and 3 do not consume
    torch.testing.assert_close(seen[1][1], 0.5 * enc.attn_weights[0], rtol=0, atol=0)
    seen.clear()
    model.encode(feats, lengths)  # weights only where the next layer consumes the carry
    assert [s[0] for s in seen] == [True, False, False]
    # the module output carries the carry only when weights are asked for
    layer = model.encoder.layers[0]
    x = torch.randn(2, 5, 16)
    a = layer.self_attn(x, None, need_weights=True)
    torch.testing.assert_close(a.carry, 0.5 * a.weights, rtol=0, atol=0)
    assert layer.self_attn(x, None).carry is None
    # a two-element attend (full attention): the carry is the weights themselves
    b = FullAttention(16, 2, 0.0)(x, None, need_weights=True)
    assert b.carry is b.weights


def test_variant_checkpoint_compatible(monkeypatch):
    """Same parameter names in every variant: a full-attention state dict loads unchanged."""
    monkeypatch.setattr("lib.model.attention.base.ATTENTION_VARIANTS", dict(ATTENTION_VARIANTS))

    @register_attention("other_toy")
    class Other(FullAttention):
        pass

    a = _model()
    b = _model(seed=1, encoder_attention=[{"type": "other_toy"}, {"type": "full"}])
    b.load_state_dict(a.state_dict(), strict=True)
    assert isinstance(b.encoder.layers[0].self_attn, Other)


# ---------------------------------------------------------------- checkpoints / modes


def test_checkpoint_round_trip(tmp_path):
    model = _model(ctc_vocab_size=5)
    feats, lengths, tokens = _batch()
    path = tmp_path / "ckpt.pt"
    torch.save({"config": model.cfg.to_dict(), "model": model.state_dict()}, path)
    ckpt = torch.load(path, weights_only=True, map_location="cpu")
    restored = S2TTransformer(ModelConfig.from_dict(ckpt["config"])).eval()
    restored.load_state_dict(ckpt["model"])
    torch.testing.assert_close(restored(feats, lengths, tokens), model(feats, lengths, tokens))


def test_load_encoder_from_asr():
    asr = _model(seed=1, ctc_vocab_size=7)
    st = _model(seed=2)
    feats, lengths, tokens = _batch()
    dec_before = {k: v.clone() for k, v in st.decoder.state_dict().items()}
    buf = io.BytesIO()
    torch.save({"model": asr.state_dict()}, buf)
    buf.seek(0)
    report = load_encoder(st, torch.load(buf, weights_only=True))
    assert "ctc_proj.weight" in report.skipped and report.missing == []
    torch.testing.assert_close(st.encode(feats, lengths).out, asr.encode(feats, lengths).out)
    for k, v in st.decoder.state_dict().items():
        assert torch.equal(v, dec_before[k])
    # bare encoder state dicts work too; mismatching ones are refused with the key named
    load_encoder(st, asr.encoder.state_dict())
    bigger = S2TTransformer(model_config("tiny", vocab_size=V, ffn_dim=48))
    with pytest.raises(ValueError, match="fc1.weight"):
        load_encoder(st, bigger.state_dict())


def test_load_decoder_layers_keeps_the_vocabulary_parts():
    """train_st.init_decoder: decoder layers + final LN from the ASR model, embeddings and output
    projection (another vocabulary) untouched."""
    asr = S2TTransformer(model_config("tiny", vocab_size=11))
    torch.manual_seed(5)
    st = _model(seed=2)
    before = {k: v.clone() for k, v in st.decoder.state_dict().items()}
    loaded = load_decoder_layers(st, {"model": asr.state_dict()})
    assert loaded and all(k.startswith(("layers.", "layer_norm.")) for k in loaded)
    for k, v in st.decoder.state_dict().items():
        if k in loaded:
            assert torch.equal(v, asr.decoder.state_dict()[k]), k
        else:
            assert k.startswith(("embed_tokens", "output_projection")) and torch.equal(v, before[k]), k
    deeper = S2TTransformer(model_config("tiny", vocab_size=11, ffn_dim=48))
    with pytest.raises(ValueError, match="fc1.weight"):
        load_decoder_layers(st, deeper.state_dict())


def test_encoder_input_options():
    """scale_embedding / subsampler_norm change the first layer's input as documented; the LN
    version is still padding-invariant."""
    feats, lengths, _ = _batch()
    base = _model(seed=3)
    plain = _model(seed=3, scale_embedding=False)
    c1, p1, pad, _ = base.encoder.embed(feats, lengths)
    c2, p2, _, _ = plain.encoder.embed(feats, lengths)
    torch.testing.assert_close(c1, c2 * 4.0)  # sqrt(d) = 4 for d = 16
    torch.testing.assert_close(p1, p2)
    normed = _model(seed=3, scale_embedding=False, subsampler_norm="layernorm")
    c3, _, pad, _ = normed.encoder.embed(feats, lengths)
    valid = c3[~pad]
    torch.testing.assert_close(valid.mean(-1), torch.zeros(valid.shape[0]), atol=1e-5, rtol=0)
    assert c3[pad].abs().max() == 0
    one = normed.encode(feats[2:, :9], lengths[2:]).out[0, :3]
    torch.testing.assert_close(normed.encode(feats, lengths).out[2, :3], one, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="subsampler_norm"):
        model_config("tiny", vocab_size=V, subsampler_norm="batchnorm")


def test_relative_position_bias_control():
    """rel_pos_bias: zero at init (the plain model's output), a learned (H, 2K+1) table per layer."""
    plain, rel = _model(seed=4), _model(seed=4, rel_pos_bias=3)
    feats, lengths, tokens = _batch()
    torch.testing.assert_close(rel(feats, lengths, tokens), plain(feats, lengths, tokens))
    att = rel.encoder.layers[0].self_attn
    assert att.rel_pos_bias.shape == (2, 7)
    with torch.no_grad():
        att.rel_pos_bias[:, 3 + 1] = 5.0  # every head favours the next token
    w = rel.encode(feats, lengths, need_weights=True).attn_weights[0]
    n = int(rel.encode(feats, lengths).lengths[0])
    diag1 = torch.diagonal(w[0, 0, :n, :n], offset=1)
    assert diag1.mean() > 0.5
    spec = [{"type": "full"}, {"type": "local", "window": 3}]
    with pytest.raises(ValueError, match="not implemented for local"):
        S2TTransformer(model_config("tiny", vocab_size=V, rel_pos_bias=2, encoder_layers=2, encoder_attention=spec))


def test_eval_is_deterministic_and_train_is_not():
    model = _model()
    feats, lengths, tokens = _batch()
    torch.testing.assert_close(model(feats, lengths, tokens), model(feats, lengths, tokens), rtol=0, atol=0)
    model.train()
    torch.manual_seed(0)
    a = model(feats, lengths, tokens)
    torch.manual_seed(1)
    b = model(feats, lengths, tokens)
    assert not torch.allclose(a, b)


def test_backward_and_padding_embedding():
    model = _model(ctc_vocab_size=5).train()
    feats, lengths, tokens = _batch()
    logits = model(feats, lengths, tokens)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tokens.reshape(-1), ignore_index=PAD)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None and "ctc_proj" not in n]
    assert missing == []
    assert torch.equal(model.decoder.embed_tokens.weight[PAD], torch.zeros(16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    """fp32 on CUDA equals the CPU result; fp16 autocast stays within fp16 rounding of it, logits on
    real target positions and attention weights on real (query, key) pairs.

    fp16 tolerance: the logits are O(1) (|logit| < 4 here), the weights in [0, 1]. The same tiny
    model cast wholly to fp16 on CPU (weights and LayerNorms included, coarser than autocast) is off
    by 2.2e-3 (logits) and 2.6e-4 (weights); atol = rtol = 3e-2 for the logits and atol 1e-2 for the
    weights leave a >10x margin, so a one-shot GPU run does not fail on rounding, while a wrong mask,
    scale or layer would be off by O(0.1-1)."""
    model = _model()
    feats, lengths, tokens = _batch()
    cpu = model(feats, lengths, tokens)
    cpu_enc = model.encode(feats, lengths, need_weights=True)
    model.cuda()
    gpu = model(feats.cuda(), lengths.cuda(), tokens.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-4)
    with torch.autocast("cuda", dtype=torch.float16):
        enc = model.encode(feats.cuda(), lengths.cuda(), need_weights=True)
        half = model(feats.cuda(), lengths.cuda(), tokens.cuda())
    assert torch.isfinite(half).all() and all(torch.isfinite(w).all() for w in enc.attn_weights)
    real = tokens.ne(PAD)
    torch.testing.assert_close(half.float().cpu()[real], cpu[real], atol=3e-2, rtol=3e-2)
    assert torch.equal(enc.padding_mask.cpu(), cpu_enc.padding_mask)
    keep = ~cpu_enc.padding_mask
    pairs = keep[:, None, :, None] & keep[:, None, None, :]  # (B, 1, N, N): real queries and keys
    assert len(enc.attn_weights) == len(cpu_enc.attn_weights)
    for w16, w32 in zip(enc.attn_weights, cpu_enc.attn_weights):
        m = pairs.expand_as(w32)
        torch.testing.assert_close(w16.float().cpu()[m], w32[m], atol=1e-2, rtol=0)
