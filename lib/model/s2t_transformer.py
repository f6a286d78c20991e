"""S2T Transformer (fairseq ``s2t_transformer_s``) with pluggable encoder self-attention.

Reference: Wang et al. (2020) fairseq S2T, as used by Alastruey et al. (2022), "On the Locality
of Attention in Direct Speech Translation", Section 2 + Appendix B:

    feats (B, T, 80)
      -> Conv1d subsampler: 2 x [Conv1d(k=5, stride=2) + GLU]        (T -> ~T/4)
      -> * sqrt(d) + sinusoidal positions -> dropout
      -> 12 pre-LN encoder layers (self-attention is pluggable, see attention.py)
      -> final LayerNorm                                              = encoder output
    prev_tokens (B, L)
      -> token embedding * sqrt(d) + sinusoidal positions -> dropout
      -> 6 pre-LN decoder layers (causal self-attn, cross-attn, FFN) -> final LayerNorm
         (decoder attention: plain SDPA, or smoothed / head-selecting per
         ModelConfig.decoder_self_attention / cross_attention, docs/variants.md)
      -> output projection (no bias, not tied to the input embedding)  = logits (B, L, V)

d=256, 4 heads, FFN 2048, ReLU, dropout 0.1 everywhere; ~31 M parameters with an 8k vocab.

Conventions
-----------
* Target vocabulary follows fairseq: ``pad_idx = 1`` (bos 0, eos 2, unk 3 are the tokenizer's
  business). Embedding row ``pad_idx`` is zero.
* Positions follow fairseq's ``SinusoidalPositionalEmbedding``: the i-th non-pad element (i >= 0)
  gets position ``pad_idx + 1 + i``; padded elements get position ``pad_idx`` whose embedding is
  the zero vector. Channels are [sin | cos] halves (not interleaved). Padded positions therefore
  never matter, and right- and left-padding give the same positions to real elements.
* Padding masks are bool, True = padding. The encoder zeroes padded frames before each
  convolution, padded keys get exactly zero attention weight, and padded encoder output rows
  are zeroed, so a sample's encoder output and logits do not depend on its batch neighbours.
* ``max_source_positions`` / ``max_target_positions`` are informational (for data filtering);
  sinusoidal positions are computed on the fly for any length, as in fairseq.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lib.model.attention import (
    AttentionOutput,
    HeadSelection,
    SelfAttention,
    build_attention,
    explicit_on_cpu,
    gate_bias_init,
    gather_heads,
    mask_bias,
    predicted_gate,
    uniform_prior,
)
from lib.model.config import MODEL_SIZES, SUBSAMPLER_NORMS, ModelConfig, model_config  # noqa: F401 (re-exported)
from lib.model.config import smoothing_options
from lib.model.dropout import Dropout, dropout
from lib.model.local_attention import Packing, attention_path, flash_supported

__all__ = [
    "MODEL_SIZES",
    "Conv1dSubsampler",
    "DecoderLayer",
    "EncoderLayer",
    "EncoderOutput",
    "HeadSelectionMultiheadAttention",
    "LoadReport",
    "ModelConfig",
    "MultiheadAttention",
    "S2TTransformer",
    "S2TTransformerDecoder",
    "S2TTransformerEncoder",
    "SmoothedMultiheadAttention",
    "build_decoder_attention",
    "model_config",
    "subsampled_lengths",
]


# ----------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------


def lengths_to_padding_mask(lengths: Tensor, max_len: int) -> Tensor:
    """(B,) lengths -> (B, max_len) bool, True = padding."""
    return torch.arange(max_len, device=lengths.device)[None, :] >= lengths[:, None]


def make_positions(padding_mask: Tensor, pad_idx: int) -> Tensor:
    """fairseq ``make_positions``: non-pad elements count from pad_idx + 1, pads get pad_idx."""
    keep = (~padding_mask).long()
    return torch.cumsum(keep, dim=1) * keep + pad_idx


def sinusoidal_positions(positions: Tensor, dim: int, pad_idx: int) -> Tensor:
    """fairseq ``SinusoidalPositionalEmbedding`` for integer positions: (..., ) -> (..., dim).

    Row = [sin(p * f_0..f_{h-1}) | cos(p * f_0..f_{h-1})], f_i = 10000^(-i / (h - 1)),
    h = dim // 2; zero vector at ``pad_idx``; float32.
    """
    half = dim // 2
    step = math.log(10000.0) / max(half - 1, 1)
    freqs = torch.exp(torch.arange(half, device=positions.device, dtype=torch.float32) * -step)
    angles = positions.to(torch.float32)[..., None] * freqs
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb.masked_fill((positions == pad_idx)[..., None], 0.0)


def subsampled_lengths(lengths: Tensor, n_layers: int = 2) -> Tensor:
    """Output lengths of the stride-2 conv stack: ``(len - 1) // 2 + 1`` per layer (fairseq)."""
    out = lengths
    for _ in range(n_layers):
        out = torch.div(out - 1, 2, rounding_mode="floor") + 1
    return out


def _embedding(num: int, dim: int, pad_idx: int | None) -> nn.Embedding:
    """fairseq ``Embedding``: N(0, dim^-0.5), zero padding row."""
    emb = nn.Embedding(num, dim, padding_idx=pad_idx)
    nn.init.normal_(emb.weight, mean=0.0, std=dim**-0.5)
    if pad_idx is not None:
        nn.init.zeros_(emb.weight[pad_idx])
    return emb


# ----------------------------------------------------------------------------------------
# Conv1d subsampler
# ----------------------------------------------------------------------------------------


class Conv1dSubsampler(nn.Module):
    """fairseq ``Conv1dSubsampler``: 2 x [Conv1d(stride 2, padding k//2) + GLU over channels].

    conv0: n_mels -> conv_channels, GLU -> conv_channels // 2
    conv1: conv_channels // 2 -> 2 * d_model, GLU -> d_model
    Padded frames are zeroed before each convolution so the output at valid positions equals
    the output for the unpadded sample (conv zero padding == zeroed neighbour frames).
    """

    def __init__(self, n_mels: int, conv_channels: int, d_model: int, kernel: int = 5) -> None:
        super().__init__()
        self.conv_layers = nn.ModuleList(
            [
                nn.Conv1d(n_mels, conv_channels, kernel, stride=2, padding=kernel // 2),
                nn.Conv1d(conv_channels // 2, 2 * d_model, kernel, stride=2, padding=kernel // 2),
            ]
        )

    def forward(self, feats: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T, n_mels), (B,) -> (B, N, d), (B,) subsampled lengths."""
        x = feats.transpose(1, 2)  # (B, C, T)
        for conv in self.conv_layers:
            x = x.masked_fill(lengths_to_padding_mask(lengths, x.size(-1))[:, None, :], 0.0)
            x = F.glu(conv(x), dim=1)
            lengths = subsampled_lengths(lengths, 1)
        x = x.masked_fill(lengths_to_padding_mask(lengths, x.size(-1))[:, None, :], 0.0)
        return x.transpose(1, 2), lengths


# ----------------------------------------------------------------------------------------
# Encoder
# ----------------------------------------------------------------------------------------


def feed_forward(layer: nn.Module, x: Tensor) -> Tensor:
    """FFN = fc2(drop_act(relu(fc1(x)))), fairseq parameter names fc1 / fc2 on the layer."""
    return layer.fc2(layer.activation_dropout(F.relu(layer.fc1(x))))


class EncoderLayer(nn.Module):
    """Pre-LN: x = x + drop(attn(LN(x))); x = x + drop(FFN(LN(x)))."""

    def __init__(self, cfg: ModelConfig, attention_spec: dict) -> None:
        super().__init__()
        self.self_attn: SelfAttention = build_attention(
            attention_spec, cfg.d_model, cfg.n_heads, cfg.attention_dropout, rel_pos_max=cfg.rel_pos_bias
        )
        self.self_attn.core_fp32 = cfg.attention_fp32
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.activation_dropout = Dropout(cfg.activation_dropout)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor,
        *,
        prev_attn: Tensor | None = None,
        task: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Returns the layer output (B, N, d), the attention weights (effective, pre-dropout) and the
        carry for the next layer's ``prev_attn`` (both (B, H, N, N), None unless ``need_weights``)."""
        a = self.self_attn(
            self.self_attn_layer_norm(x),
            padding_mask,
            prev_attn=prev_attn,
            task=task,
            need_weights=need_weights,
        )
        x = x + self.dropout(a.out)
        x = x + self.dropout(feed_forward(self, self.final_layer_norm(x)))
        return x, a.weights, a.carry


@dataclass
class EncoderOutput:
    out: Tensor  # (B, N, d), final LayerNorm applied, padded rows zeroed
    padding_mask: Tensor  # (B, N) bool, True = padding
    lengths: Tensor  # (B,) valid lengths after subsampling
    layer_inputs: list[Tensor] | None = None  # per layer: residual stream before its pre-LN
    attn_weights: list[Tensor] | None = None  # per layer: (B, H, N, N) effective post-softmax weights
    ctc_logits: Tensor | None = None  # (B, N, ctc_vocab) when the model has a CTC head
    task: Tensor | None = None  # (B,) long task ids the encoder was run with; decode() hands them on

    def reorder(self, new_order: Tensor) -> EncoderOutput:
        """Index the batch dimension (beam search: repeat / reorder hypotheses)."""

        def sel(t: Any) -> Any:
            if t is None:
                return None
            if isinstance(t, list):
                return [x.index_select(0, new_order) for x in t]
            return t.index_select(0, new_order)

        return EncoderOutput(
            out=sel(self.out),
            padding_mask=sel(self.padding_mask),
            lengths=sel(self.lengths),
            layer_inputs=sel(self.layer_inputs),
            attn_weights=sel(self.attn_weights),
            ctc_logits=sel(self.ctc_logits),
            task=sel(self.task),
        )


class S2TTransformerEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.subsample = Conv1dSubsampler(cfg.n_mels, cfg.conv_channels, cfg.d_model, cfg.conv_kernel)
        self.subsample_norm = nn.LayerNorm(cfg.d_model) if cfg.subsampler_norm == "layernorm" else None
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.dropout = Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg, spec) for spec in cfg.encoder_attention)
        self.layer_norm = nn.LayerNorm(cfg.d_model)
        self.ctc_proj = (
            nn.Linear(cfg.d_model, cfg.ctc_vocab_size) if cfg.ctc_vocab_size is not None else None
        )
        if self.ctc_proj is not None and cfg.ctc_zero_init:  # drawn as usual first: the other weights are the same
            nn.init.zeros_(self.ctc_proj.weight)

    def embed(self, feats: Tensor, feat_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The two parts of the first layer's input, before dropout: ``content`` (B, N, d) =
        embed_scale * [LN](subsampler(feats)) and ``pos`` (B, N, d) sinusoidal positions (zero on
        padding); plus the padding mask (B, N) and the lengths (B,). Kept apart so the attention
        health check can measure how much of the input is position."""
        x, lengths = self.subsample(feats, feat_lengths)
        padding_mask = lengths_to_padding_mask(lengths, x.size(1))
        if self.subsample_norm is not None:
            x = self.subsample_norm(x).masked_fill(padding_mask[..., None], 0.0)
        pos = sinusoidal_positions(make_positions(padding_mask, self.cfg.pad_idx), x.size(-1), self.cfg.pad_idx)
        return self.embed_scale * x, pos.to(x.dtype), padding_mask, lengths

    def packing_path(self, content: Tensor, need_weights: bool) -> str | None:
        """``"flash"`` when this forward runs in the packed (varlen) layout: on CUDA, without weights, every
        layer's attention packable (plain full / local), and :func:`lib.model.local_attention.attention_path`
        choosing FlashAttention-2 for the dtype the attention will compute in (autocast's, else the
        activations'). None: the padded layout (always on CPU)."""
        if need_weights or content.device.type != "cuda" or not self.layers:
            return None
        if not all(layer.self_attn.packable() for layer in self.layers):
            return None
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else content.dtype
        attn = self.layers[0].self_attn
        path = attention_path("cuda", dtype, attn.head_dim, content.shape[1], packed=True,
                              flash_available=flash_supported(content.device))
        return path if path == "flash" else None

    def forward(
        self,
        feats: Tensor,
        feat_lengths: Tensor,
        *,
        task: Tensor | None = None,
        need_weights: bool = False,
        feat_lengths_host: Sequence[int] | None = None,
    ) -> EncoderOutput:
        """``feat_lengths_host``: the same lengths as a host list (the training loop has them before the
        batch moves to the GPU), so that the packed layout on CUDA is built without a device sync; when
        absent there, they are read from ``feat_lengths`` (one sync)."""
        content, pos, padding_mask, lengths = self.embed(feats, feat_lengths)
        path = self.packing_path(content, need_weights)
        if path is not None:
            host = list(feat_lengths_host) if feat_lengths_host is not None else feat_lengths.tolist()
            n_lengths = subsampled_lengths(torch.tensor(host, dtype=torch.long), len(self.subsample.conv_layers))
            packing = Packing.build(n_lengths.tolist(), content.shape[1], content.device, path)
            return self._forward_packed(content, pos, padding_mask, lengths, packing, task)
        x = self.dropout(content + pos)

        layer_inputs: list[Tensor] | None = [] if need_weights else None
        attn_weights: list[Tensor] | None = [] if need_weights else None
        prev: Tensor | None = None
        ctc_logits: Tensor | None = None
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            # A layer computes weights only if asked for, or if the next layer consumes its carry.
            want = need_weights or (i + 1 < n and self.layers[i + 1].self_attn.needs_prev_attn)
            if layer_inputs is not None:
                layer_inputs.append(x)
            x, w, carry = layer(
                x,
                padding_mask,
                prev_attn=prev if layer.self_attn.needs_prev_attn else None,
                task=task,
                need_weights=want,
            )
            if attn_weights is not None:
                attn_weights.append(w)
            prev = carry
            if self.ctc_proj is not None and i + 1 == self.cfg.ctc_layer and i + 1 < n:
                # intermediate CTC: layer k's output through the shared final LayerNorm (ESPnet)
                ctc_logits = self.ctc_proj(self.layer_norm(x).masked_fill(padding_mask[..., None], 0.0))

        x = self.layer_norm(x).masked_fill(padding_mask[..., None], 0.0)
        if self.ctc_proj is not None and not 0 < self.cfg.ctc_layer < n:
            ctc_logits = self.ctc_proj(x)
        return EncoderOutput(x, padding_mask, lengths, layer_inputs, attn_weights, ctc_logits, task)

    def _forward_packed(self, content: Tensor, pos: Tensor, padding_mask: Tensor, lengths: Tensor,
                        packing: Packing, task: Tensor | None) -> EncoderOutput:
        """:meth:`forward` in the packed layout (CUDA, FlashAttention-2): the valid rows of the batch are
        packed once after the subsampler, (T, d), and stay packed through every layer -- attention
        (:meth:`SelfAttention.forward_packed`), feed-forward, LayerNorms and dropout all work on T rows
        instead of B * N -- and are unpacked once after the final LayerNorm (padded rows zero, as in the
        padded layout). Same math as :meth:`forward`; other rounding and dropout draws."""
        x = self.dropout(packing.pack(content + pos))  # (T, d)
        ctc_logits: Tensor | None = None
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            x = x + layer.dropout(layer.self_attn.forward_packed(layer.self_attn_layer_norm(x), packing))
            x = x + layer.dropout(feed_forward(layer, layer.final_layer_norm(x)))
            if self.ctc_proj is not None and i + 1 == self.cfg.ctc_layer and i + 1 < n:
                ctc_logits = self.ctc_proj(packing.unpack(self.layer_norm(x)))
        out = packing.unpack(self.layer_norm(x))  # (B, N, d)
        if self.ctc_proj is not None and not 0 < self.cfg.ctc_layer < n:
            ctc_logits = self.ctc_proj(out)
        return EncoderOutput(out, padding_mask, lengths, None, None, ctc_logits, task)


# ----------------------------------------------------------------------------------------
# Decoder
# ----------------------------------------------------------------------------------------


class MultiheadAttention(nn.Module):
    """Plain MHA for the decoder (self- and cross-attention) with an incremental cache.

    ``cache`` (a dict owned by the caller, filled in place):
      self-attention:  "k", "v" (B, H, t, dh) grow by one step per call; "pad" (B, t) bool.
      cross-attention: "k", "v" (B, H, S, dh) computed once from the encoder output.

    ``forward`` returns an :class:`AttentionOutput` whose ``weights`` / ``carry`` (B, H, L, S) are
    computed only with ``need_weights`` (the next decoder layer smooths with this one's weights,
    docs/variants.md); otherwise the fused SDPA path runs as before.
    """

    #: When True, the decoder passes the previous layer's carry (same kind: self or cross) as ``prev_attn``.
    needs_prev_attn: bool = False

    def __init__(self, d_model: int, n_heads: int, dropout: float, *, proj_heads: int | None = None) -> None:
        """``proj_heads``: heads produced by q/k/v_proj (default H); only head selection projects
        H' > H candidates (``out_proj`` always merges H heads)."""
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        proj_dim = d_model if proj_heads is None else proj_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, proj_dim)
        self.k_proj = nn.Linear(d_model, proj_dim)
        self.v_proj = nn.Linear(d_model, proj_dim)
        self.out_proj = nn.Linear(d_model, d_model)
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def _split(self, t: Tensor, heads: int | None = None) -> Tensor:
        """(B, N, heads * dh) -> (B, heads, N, dh); ``heads`` defaults to H."""
        B, N, _ = t.shape
        return t.view(B, N, self.n_heads if heads is None else heads, self.head_dim).transpose(1, 2)

    def _project(
        self,
        query: Tensor,
        memory: Tensor | None,
        key_padding_mask: Tensor | None,
        causal: bool,
        cache: dict[str, Tensor] | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """q (B, H, L, dh), k and v (B, H, S, dh) with the cache applied, and the (B, 1, L, S) bool
        mask of forbidden keys (padding, and the future when ``causal``)."""
        q = self._split(self.q_proj(query))
        if memory is None:  # self-attention
            k, v = self._split(self.k_proj(query)), self._split(self.v_proj(query))
            k, v, key_padding_mask = self._extend_cache(k, v, key_padding_mask, cache)
        else:  # cross-attention
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                k, v = self._split(self.k_proj(memory)), self._split(self.v_proj(memory))
                if cache is not None:
                    k, v = self._cache_form(k), self._cache_form(v)
                    cache["k"], cache["v"] = k, v
        return q, k, v, self._forbidden(q, k, key_padding_mask, causal)

    @staticmethod
    def _extend_cache(k: Tensor, v: Tensor, key_padding_mask: Tensor | None,
                      cache: dict[str, Tensor] | None) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention: prepend the cached keys / values / padding of the earlier steps to this
        call's (B, H, L, dh) and store the result in ``cache`` (when given). Returns k, v (B, H, t, dh)
        and the (B, t) key padding mask."""
        B, L = k.shape[0], k.shape[2]
        if key_padding_mask is None:
            key_padding_mask = torch.zeros(B, L, dtype=torch.bool, device=k.device)
        if cache is not None:
            k, v = MultiheadAttention._cache_form(k), MultiheadAttention._cache_form(v)
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
                key_padding_mask = torch.cat([cache["pad"], key_padding_mask], dim=1)
            cache["k"], cache["v"], cache["pad"] = k, v, key_padding_mask
        return k, v, key_padding_mask

    @staticmethod
    def _cache_form(t: Tensor) -> Tensor:
        """A key / value tensor as the incremental cache keeps it: contiguous, or every decoding
        step's q @ k^T would copy all of k (the split heads are a transposed view)."""
        return t.contiguous()

    @staticmethod
    def _forbidden(q: Tensor, k: Tensor, key_padding_mask: Tensor | None, causal: bool) -> Tensor:
        """(B, 1, L, S) bool mask of the keys query i may not see: padding, and the future when
        ``causal`` (query i sits at absolute position S - L + i)."""
        B, L, S = q.size(0), q.size(2), k.size(2)
        mask = torch.zeros(B, 1, L, S, dtype=torch.bool, device=q.device)
        if key_padding_mask is not None:
            mask = mask | key_padding_mask[:, None, None, :]
        if causal:  # query i (absolute position S - L + i) sees keys <= its position
            qpos = torch.arange(S - L, S, device=q.device)[:, None]
            mask = mask | (torch.arange(S, device=q.device)[None, :] > qpos)
        return mask

    def _merge(self, ctx: Tensor) -> Tensor:
        """(B, H, L, dh) -> out_proj of the merged heads (B, L, d)."""
        B, H, L, dh = ctx.shape
        return self.out_proj(ctx.transpose(1, 2).reshape(B, L, H * dh))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Plain attention core: ctx (B, H, L, dh) and, with ``need_weights``, the pre-dropout
        weights (B, H, L, S); the fused SDPA path otherwise."""
        if need_weights or (q.device.type == "cpu" and (self.training and self.dropout > 0 or explicit_on_cpu(q))):
            # explicit weights; on CPU in training also the fast dropout mask (SDPA would fall back
            # to its math path with torch's slow CPU Bernoulli mask, lib.model.dropout); on CPU in
            # eval where SDPA's CPU kernel is the slower one (lib.model.attention.explicit_on_cpu)
            w = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.head_dim**-0.5 + mask_bias(mask, q.dtype), -1)
            ctx = torch.matmul(dropout(w, self.dropout, self.training), v)
        else:
            w = None
            ctx = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask_bias(mask, q.dtype),
                dropout_p=self.dropout if self.training else 0.0,
            )
        return ctx, (w if need_weights else None)

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: dict[str, Tensor] | None = None,
        prev_attn: Tensor | None = None,
        task: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """query (B, L, d); memory (B, S, d) for cross-attention or None for self-attention.

        key_padding_mask: (B, S) for cross-attention, (B, L) (the new steps) for self-attention.
        prev_attn: unused here (variants that smooth with the layer below take it).
        task: (B,) task ids, unused here (head selection takes them).
        """
        q, k, v, mask = self._project(query, memory, key_padding_mask, causal, cache)
        ctx, w = self._attend(q, k, v, mask, need_weights)
        return AttentionOutput(out=self._merge(ctx), weights=w, carry=w)


class SmoothedMultiheadAttention(MultiheadAttention):
    """Decoder attention smoothed with a prior (Maekaku et al.; docs/variants.md):
    A' = (1 - γ) A + γ P, ctx = dropout(A') V, the math of
    :class:`lib.model.attention.SmoothedAttention` on the decoder's keys.

    * self-attention, ``uniform``: P[i, j] = 1 / (i + 1) over the causal prefix (its non-pad keys);
      cross-attention, ``uniform``: P[b, i, j] = m_b[j] / T_b over the encoder frames (relaxed
      attention, Lohrenz et al.; with ``train_only`` as in their code, but the valid T_b, A1).
    * ``prev``: the previous decoder layer's carry of the same kind and the same query rows (raw A
      for non-recursive, A' for recursive), so incremental decoding needs no extra cache: at each
      step the layer below has just computed the same (B, H, 1, S) row.
    * ``gamma: predicted``: g = σ(q_{b,h,i} · c_h + b_h) with ``gate_vector`` c (H · dh,), zeros at
      init, and ``gate_bias`` b (H,) at logit(``gate_init``): g starts at ``gate_init`` (default γ = 0.1).
    The band prior is encoder-only (the paper defines B for T x T self-attention). Layer 1 with the
    prev prior is refused by the config (no layer below); at run time a missing ``prev_attn`` is a
    ValueError. Always the explicit-weights path, except ``train_only`` at inference, which runs the
    plain module's code.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float,
        *,
        prior: str,
        gamma: float | str = 0.1,
        recursive: bool = False,
        train_only: bool = False,
        gate_init: float | None = None,
    ) -> None:
        super().__init__(d_model, n_heads, dropout)
        if prior == "band":
            raise ValueError("decoder smoothing: the band prior is defined for encoder self-attention only")
        opts = smoothing_options(prior=prior, gamma=gamma, recursive=recursive, train_only=train_only,
                                 gate_init=gate_init, key="smooth")
        self.prior: str = opts["prior"]
        self.gamma: float | str = opts["gamma"]
        self.recursive: bool = opts["recursive"]
        self.train_only: bool = opts["train_only"]
        self.needs_prev_attn = self.prior == "prev"  # per instance (docs/variants.md)
        self.gate_init: float | None = opts["gate_init"]
        self.gate_vector = nn.Parameter(torch.zeros(d_model)) if self.gamma == "predicted" else None
        self.gate_bias = nn.Parameter(gate_bias_init(n_heads, self.gate_init)) if self.gamma == "predicted" else None

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: dict[str, Tensor] | None = None,
        prev_attn: Tensor | None = None,
        task: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        if self.train_only and not self.training:  # relaxed attention at inference: the plain module
            return super().forward(query, memory, key_padding_mask=key_padding_mask, causal=causal, cache=cache,
                                   need_weights=need_weights)
        q, k, v, mask = self._project(query, memory, key_padding_mask, causal, cache)  # mask (B, 1, L, S)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.head_dim**-0.5  # (B, H, L, S)
        raw = torch.softmax(scores + mask_bias(mask, q.dtype), -1).masked_fill(mask, 0.0)  # A
        if self.prior == "uniform":
            prior = uniform_prior(~mask, raw.dtype)  # (B, 1, L, S)
        elif prev_attn is None:
            raise ValueError("smooth (prior: prev) got no prev_attn: the first decoder layer has no layer below "
                             "(docs/variants.md)")
        else:
            prior = prev_attn.to(raw.dtype).masked_fill(mask, 0.0)  # (B, H, L, S)
        gamma = predicted_gate(q, self.gate_vector, self.gate_bias).to(raw.dtype) if self.gamma == "predicted" \
            else self.gamma
        weights = (1 - gamma) * raw + gamma * prior  # A' (B, H, L, S)
        ctx = torch.matmul(dropout(weights, self.dropout, self.training), v)  # (B, H, L, dh)
        carry = raw if self.prior == "prev" and not self.recursive else weights
        return AttentionOutput(out=self._merge(ctx), weights=weights if need_weights else None,
                               carry=carry if need_weights else None)

    def extra_repr(self) -> str:
        return (f"prior={self.prior}, gamma={self.gamma}" + (", recursive=True" if self.recursive else "")
                + (", train_only=True" if self.train_only else ""))


class HeadSelectionMultiheadAttention(HeadSelection, MultiheadAttention):
    """Decoder self-attention with per-task head selection (Gong et al.; docs/variants.md, B1):
    the logic of :class:`lib.model.attention.HeadSelection` (the encoder's
    :class:`lib.model.attention.HeadSelectionAttention` has the same math) on the decoder's causal
    self-attention, keyed on the target language (the paper's O2M configuration).

    q/k/v_proj project H' candidates; ``head_logits`` (tasks, H'). Training: all H' projected, one
    draw per forward pass, each sample's H heads gathered by its task, straight-through weights on
    the head outputs. Evaluation: deterministic selection and only the selected rows projected;
    the incremental cache ("k", "v" (B, H, t, dh), "pad") holds the H selected heads only, so
    incremental decoding equals full-sequence decoding and costs what a plain H-head layer costs.
    Incremental decoding in training mode is refused (each call would draw a new selection while
    the cache holds the old one). Self-attention only (``memory`` must be None).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, *, strategy: str, candidates: int,
                 tasks: int, estimator: str = "paper") -> None:
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"decoder head_select.candidates: must be a positive integer, got {candidates!r}")
        super().__init__(d_model, n_heads, dropout, proj_heads=candidates)
        self._init_head_selection(strategy=strategy, candidates=candidates, tasks=tasks, key="decoder head_select",
                                  estimator=estimator)

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: dict[str, Tensor] | None = None,
        prev_attn: Tensor | None = None,
        task: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        if memory is not None:
            raise ValueError("head selection is implemented for decoder self-attention only")
        task = self.task_ids(task, query.shape[0], query.device)
        w: Tensor | None = None
        if self.training and cache is not None:
            raise ValueError("decoder head selection: incremental decoding runs in eval mode (a training "
                             "forward draws a new selection, the cache holds the previous one)")
        if self.training and self.estimator == "gumbel":  # every candidate attends, × its 0 / 1 weight
            q, k, v = (self._split(p(query), self.candidates) for p in (self.q_proj, self.k_proj, self.v_proj))
            sel, w = self.sample()
            k, v, key_padding_mask = self._extend_cache(k, v, key_padding_mask, None)
            ctx, weights = self._attend(q, k, v, self._forbidden(q, k, key_padding_mask, causal), need_weights)
            ctx = self.all_candidates(ctx, w, task)
            if weights is not None:
                weights = gather_heads(weights, sel[task])
            self.computed_heads = self.candidates
            return AttentionOutput(out=self._merge(ctx), weights=weights, carry=weights)
        if self.training or not self.pruned_inference:
            q, k, v = (self._split(p(query), self.candidates) for p in (self.q_proj, self.k_proj, self.v_proj))
            sel, w = self.sample() if self.training else (self.eval_selection(), None)
            idx = sel[task]  # (B, H)
            q, k, v = gather_heads(q, idx), gather_heads(k, idx), gather_heads(v, idx)
            self.computed_heads = self.candidates
        else:
            q, k, v = self.project_pruned(query, task)  # (B, H, L, dh)
            idx = self.eval_selection()[task] if self.strategy == "subset" else None
            self.computed_heads = self.n_heads
        k, v, key_padding_mask = self._extend_cache(k, v, key_padding_mask, cache)
        ctx, weights = self._attend(q, k, v, self._forbidden(q, k, key_padding_mask, causal), need_weights)
        if w is not None:
            ctx = ctx * w[task][:, :, None, None]
        if idx is not None:
            ctx = self.slot_merge(ctx, idx)
        return AttentionOutput(out=self._merge(ctx), weights=weights, carry=weights)

    def extra_repr(self) -> str:
        return self.selection_repr()


# Decoder attention variants by spec type (ModelConfig.decoder_self_attention / cross_attention).
DECODER_ATTENTION_VARIANTS: dict[str, type[MultiheadAttention]] = {
    "smooth": SmoothedMultiheadAttention,
    "head_select": HeadSelectionMultiheadAttention,
}


def build_decoder_attention(spec: dict | None, d_model: int, n_heads: int, dropout: float, *,
                            layer: int) -> MultiheadAttention:
    """The attention module of decoder layer ``layer`` (1-based) from a validated decoder spec
    (:func:`lib.model.config.decoder_attention_spec`): plain :class:`MultiheadAttention` when the
    spec is None or does not list the layer, else the variant with the spec's options."""
    if spec is None or layer not in spec["layers"]:
        return MultiheadAttention(d_model, n_heads, dropout)
    cls = DECODER_ATTENTION_VARIANTS[spec["type"]]
    return cls(d_model, n_heads, dropout, **{k: v for k, v in spec.items() if k not in ("type", "layers")})


class DecoderLayer(nn.Module):
    """Pre-LN: causal self-attn, cross-attn, FFN, each x = x + drop(sublayer(LN(x)))."""

    def __init__(self, cfg: ModelConfig, layer: int = 1) -> None:
        """``layer``: 1-based index (which decoder attention specs apply)."""
        super().__init__()
        self.self_attn = build_decoder_attention(cfg.decoder_self_attention, cfg.d_model, cfg.n_heads,
                                                 cfg.attention_dropout, layer=layer)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.encoder_attn = build_decoder_attention(cfg.cross_attention, cfg.d_model, cfg.n_heads,
                                                    cfg.attention_dropout, layer=layer)
        self.encoder_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.activation_dropout = Dropout(cfg.activation_dropout)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        self_padding_mask: Tensor,
        enc_out: Tensor,
        enc_padding_mask: Tensor | None,
        cache: dict[str, dict[str, Tensor]] | None = None,
        *,
        prev_self: Tensor | None = None,
        prev_cross: Tensor | None = None,
        need_self: bool = False,
        need_cross: bool = False,
        task: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Returns the layer output (B, L, d) and the self- / cross-attention carries for the next
        layer ((B, H, L, L_keys) / (B, H, L, S); None unless ``need_self`` / ``need_cross``).
        ``task`` (B,) task ids reach both attention modules (head selection uses them)."""
        a = self.self_attn(
            self.self_attn_layer_norm(x),
            None,
            key_padding_mask=self_padding_mask,
            causal=True,
            cache=None if cache is None else cache.setdefault("self", {}),
            prev_attn=prev_self,
            task=task,
            need_weights=need_self,
        )
        x = x + self.dropout(a.out)
        c = self.encoder_attn(
            self.encoder_attn_layer_norm(x),
            enc_out,
            key_padding_mask=enc_padding_mask,
            cache=None if cache is None else cache.setdefault("cross", {}),
            prev_attn=prev_cross,
            task=task,
            need_weights=need_cross,
        )
        x = x + self.dropout(c.out)
        return x + self.dropout(feed_forward(self, self.final_layer_norm(x))), a.carry, c.carry


IncrementalState = dict[int, dict[str, dict[str, Tensor]]]


class S2TTransformerDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = _embedding(cfg.vocab_size, cfg.d_model, cfg.pad_idx)
        self.embed_scale = math.sqrt(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)
        self.layers = nn.ModuleList(DecoderLayer(cfg, layer=i + 1) for i in range(cfg.decoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)
        # share_decoder_input_output_embed=False: separate output matrix, no bias.
        self.output_projection = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.output_projection.weight, mean=0.0, std=cfg.d_model**-0.5)

    def forward(
        self,
        tokens: Tensor,
        enc_out: Tensor,
        enc_padding_mask: Tensor | None,
        incremental_state: IncrementalState | None = None,
        *,
        task: Tensor | None = None,
    ) -> Tensor:
        """tokens (B, L) -> logits (B, L, V); ``task`` (B,) task ids for the decoder attention.

        With ``incremental_state`` (a dict, empty at the first step, filled in place) ``tokens``
        is the whole prefix so far, only its last token is processed, and the logits for that
        step are returned as (B, 1, V). Equal to the last row of the full-sequence logits.
        """
        pad = self.cfg.pad_idx
        padding_mask = tokens.eq(pad)
        positions = make_positions(padding_mask, pad)
        if incremental_state is not None:
            tokens, padding_mask, positions = tokens[:, -1:], padding_mask[:, -1:], positions[:, -1:]

        x = self.embed_scale * self.embed_tokens(tokens)
        x = self.dropout(x + sinusoidal_positions(positions, x.size(-1), pad).to(x.dtype))
        prev_self: Tensor | None = None
        prev_cross: Tensor | None = None
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            cache = None if incremental_state is None else incremental_state.setdefault(i, {})
            # Attention weights only where the next layer smooths with them (the same query rows
            # in incremental decoding, so nothing extra is cached).
            nxt = self.layers[i + 1] if i + 1 < n else None
            x, prev_self, prev_cross = layer(
                x, padding_mask, enc_out, enc_padding_mask, cache,
                prev_self=prev_self if layer.self_attn.needs_prev_attn else None,
                prev_cross=prev_cross if layer.encoder_attn.needs_prev_attn else None,
                need_self=nxt is not None and nxt.self_attn.needs_prev_attn,
                need_cross=nxt is not None and nxt.encoder_attn.needs_prev_attn,
                task=task,
            )
        return self.output_projection(self.layer_norm(x))

    @staticmethod
    def reorder_incremental_state(state: IncrementalState, new_order: Tensor, *,
                                  cross: bool = True) -> IncrementalState:
        """Index the batch dimension of every cached tensor (in place; also returned).

        ``cross=False`` leaves the cross-attention caches ("cross") as they are. Beam search passes
        it when ``new_order`` only permutes hypotheses among the rows of their own sentence: those
        rows' cross-attention keys / values come from the same encoder rows, so they hold the same
        values and reordering them would copy (B * beam, H, S, dh) per layer per step for nothing.
        """
        for layer_cache in state.values():
            for kind, sub in layer_cache.items():
                if kind == "cross" and not cross:
                    continue
                for key, t in sub.items():
                    sub[key] = t.index_select(0, new_order)
        return state


# ----------------------------------------------------------------------------------------
# Full model
# ----------------------------------------------------------------------------------------


@dataclass
class LoadReport:
    loaded: list[str]  # target keys that received a value
    skipped: list[str]  # source keys not loaded (CTC head / variant-specific attention params)
    missing: list[str]  # target keys left at their initialisation (same categories only)
    expanded: list[str] = field(default_factory=list)  # target keys filled by tiling H source heads into H' candidates


class S2TTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = S2TTransformerEncoder(cfg)
        self.decoder = S2TTransformerDecoder(cfg)

    def encode(
        self,
        feats: Tensor,
        feat_lengths: Tensor,
        *,
        task: Tensor | None = None,
        need_weights: bool = False,
        feat_lengths_host: Sequence[int] | None = None,
    ) -> EncoderOutput:
        """feats (B, T, n_mels), feat_lengths (B,), task (B,) long or None; ``feat_lengths_host`` the
        lengths as a host list, when the caller has them (CUDA: the packed layout needs no sync)."""
        return self.encoder(feats, feat_lengths, task=task, need_weights=need_weights,
                            feat_lengths_host=feat_lengths_host)

    def decode(
        self,
        prev_tokens: Tensor,
        enc: EncoderOutput,
        incremental_state: IncrementalState | None = None,
    ) -> Tensor:
        """Logits (B, L, V) of ``prev_tokens`` given the encoder output; the task ids the encoder ran
        with (``enc.task``, reordered with it in beam search) reach the decoder attention."""
        return self.decoder(prev_tokens, enc.out, enc.padding_mask, incremental_state, task=enc.task)

    def forward(
        self,
        feats: Tensor,
        feat_lengths: Tensor,
        prev_tokens: Tensor,
        *,
        task: Tensor | None = None,
    ) -> Tensor:
        """Teacher-forced logits (B, L, V)."""
        return self.decode(prev_tokens, self.encode(feats, feat_lengths, task=task))

    def reorder_incremental_state(self, state: IncrementalState, new_order: Tensor, *,
                                  cross: bool = True) -> IncrementalState:
        return self.decoder.reorder_incremental_state(state, new_order, cross=cross)

    def load_encoder_from(self, state_dict: dict[str, Tensor], *, expand_candidate_heads: bool = False) -> LoadReport:
        """Initialise the encoder (subsampler + layers + final LN) from another checkpoint,
        e.g. ST from a pre-trained ASR model (the decoder stays randomly initialised).

        ``state_dict`` is a full ``S2TTransformer`` state dict (``encoder.*`` keys are used), a
        bare encoder state dict, or a checkpoint dict with a ``"model"`` entry. All core keys
        must match in name and shape (ValueError otherwise). Tolerated differences: the CTC head
        (loaded only if both have one of the same shape) and attention parameters specific to a
        variant (anything under ``.self_attn.`` other than q/k/v/out_proj, e.g. ``head_logits``).

        ``expand_candidate_heads`` (head selection, docs/variants.md): a target
        ``q/k/v_proj`` weight of shape (H' · dh, d) (bias (H' · dh,)) whose source has H · dh rows is
        filled by tiling, candidate row-block j <- source head (j mod H); ``out_proj`` loads
        unchanged. With strided groups every group then holds copies of one source head, so any
        group selection reproduces the source encoder exactly. Such keys are listed in
        ``LoadReport.expanded`` (and in ``loaded``).
        """
        if "model" in state_dict and isinstance(state_dict["model"], dict):
            state_dict = state_dict["model"]
        if any(k.startswith("encoder.") for k in state_dict):
            src = {k[len("encoder.") :]: v for k, v in state_dict.items() if k.startswith("encoder.")}
        else:
            src = dict(state_dict)
        target = self.encoder.state_dict()

        def optional(key: str) -> bool:
            if key.startswith("ctc_proj."):
                return True
            if ".self_attn." in key:
                return key.split(".self_attn.", 1)[1].split(".")[0] not in (
                    "q_proj",
                    "k_proj",
                    "v_proj",
                    "out_proj",
                )
            return False

        def expandable(key: str, val: Tensor) -> bool:
            """A q/k/v projection whose target has a whole multiple of the source's heads."""
            if not expand_candidate_heads or ".self_attn." not in key:
                return False
            if key.split(".self_attn.", 1)[1] not in {f"{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")}:
                return False
            tgt = target[key]
            return (tgt.dim() == val.dim() and tgt.shape[1:] == val.shape[1:] and val.shape[0] > 0
                    and tgt.shape[0] > val.shape[0] and tgt.shape[0] % val.shape[0] == 0)

        to_load, skipped, expanded, errors = {}, [], [], []
        for key, val in src.items():
            if key in target and target[key].shape == val.shape:
                to_load[key] = val
            elif key in target and expandable(key, val):
                # rows are [head 0 | head 1 | ...] blocks of dh: repeating the whole matrix r times
                # puts source head (j mod H) into candidate j
                to_load[key] = val.repeat(target[key].shape[0] // val.shape[0], *([1] * (val.dim() - 1)))
                expanded.append(key)
            elif optional(key):
                skipped.append(key)
            elif key in target:
                errors.append(f"{key}: shape {tuple(val.shape)} vs {tuple(target[key].shape)}")
            else:
                errors.append(f"{key}: unexpected")
        missing = [k for k in target if k not in to_load]
        errors += [f"{k}: missing" for k in missing if not optional(k)]
        if errors:
            raise ValueError("encoder state dict does not match: " + "; ".join(errors))
        self.encoder.load_state_dict(to_load, strict=False)
        return LoadReport(loaded=sorted(to_load), skipped=sorted(skipped), missing=sorted(missing),
                          expanded=sorted(expanded))

    def load_decoder_layers_from(self, state_dict: dict[str, Tensor]) -> list[str]:
        """Initialise the decoder's layers and final LayerNorm from another model's (e.g. the ASR
        model's, whose decoder has learned to align with the encoder), leaving the token embedding
        and the output projection (vocabulary-specific) at their initialisation. A demo option
        (``train_st.init_decoder``), not in the paper. Returns the keys loaded; ValueError when the
        shapes differ. Parameters of decoder attention variants (anything under ``.self_attn.`` /
        ``.encoder_attn.`` other than q/k/v/out_proj, e.g. ``gate_vector``) may be absent from the
        source and keep their initialisation."""
        if "model" in state_dict and isinstance(state_dict["model"], dict):
            state_dict = state_dict["model"]
        target = self.decoder.state_dict()
        wanted = [k for k in target if k.startswith(("layers.", "layer_norm."))]
        src = {k: state_dict[f"decoder.{k}"] for k in wanted if f"decoder.{k}" in state_dict}

        def optional(key: str) -> bool:
            for sub in (".self_attn.", ".encoder_attn."):
                if sub in key:
                    return key.split(sub, 1)[1].split(".")[0] not in ("q_proj", "k_proj", "v_proj", "out_proj")
            return False

        errors = [f"{k}: missing" for k in wanted if k not in src and not optional(k)]
        errors += [f"{k}: shape {tuple(v.shape)} vs {tuple(target[k].shape)}" for k, v in src.items()
                   if v.shape != target[k].shape]
        if errors:
            raise ValueError("decoder state dict does not match: " + "; ".join(errors))
        self.decoder.load_state_dict(src, strict=False)
        return sorted(src)

    # -- head selection (docs/variants.md) ------------------------------------------

    def head_selection_layers(self) -> dict[str, list[tuple[int, HeadSelection]]]:
        """The head-selecting attention modules per side, ``{"encoder": [(layer, module), ...],
        "decoder": [...]}`` (1-based layer numbers; a side without any is left out, so an empty dict
        means the model selects no heads)."""
        sides = {
            "encoder": [(i + 1, layer.self_attn) for i, layer in enumerate(self.encoder.layers)
                        if isinstance(layer.self_attn, HeadSelection)],
            "decoder": [(i + 1, layer.self_attn) for i, layer in enumerate(self.decoder.layers)
                        if isinstance(layer.self_attn, HeadSelection)],
        }
        return {side: mods for side, mods in sides.items() if mods}

    def head_selection_kl_per_task(self) -> dict[str, Tensor]:
        """K_t per side: (tasks,) the Bernoulli KL of σ(φ) to the prior H / H', averaged over that
        side's selecting layers and their H' candidates (docs/variants.md)."""
        return {side: torch.cat([m.kl() for _, m in mods], dim=1).mean(dim=1)
                for side, mods in self.head_selection_layers().items()}

    def head_selection_kl(self, task: Tensor, n_tokens: Tensor,
                          weight: float | Mapping[str, float | Sequence[float] | Tensor] = 1.0) -> Tensor:
        """The KL term of one batch: Σ_side Σ_t λ_{side,t} · n_t · K_t^side (docs/variants.md), n_t the
        target tokens (eos included) of the batch's samples of task t (fairseq's per-task token
        weighting; the caller divides the update's summed loss by its token count as for the CE).

        ``task`` (B,) long, ``n_tokens`` (B,) target lengths. ``weight`` λ: a float for every side
        and task, or ``{side: float | (tasks,) per task}`` for both sides (e.g. from
        :meth:`elbo_kl_weights`). A model without head selection gives 0."""
        per_task = self.head_selection_kl_per_task()
        if not per_task:
            return torch.zeros((), device=n_tokens.device)
        total: Tensor | None = None
        for side, k_t in per_task.items():
            n_t = torch.zeros_like(k_t).index_add_(0, task.to(k_t.device), n_tokens.to(k_t))
            if isinstance(weight, Mapping):
                if side not in weight:
                    raise ValueError(f"head_selection_kl: no weight for side {side!r} (have {sorted(weight)})")
                lam = torch.as_tensor(weight[side], dtype=k_t.dtype, device=k_t.device)
            else:
                lam = torch.as_tensor(float(weight), dtype=k_t.dtype, device=k_t.device)
            term = (lam * n_t * k_t).sum()
            total = term if total is None else total + term
        return total  # type: ignore[return-value]

    def elbo_kl_weights(self, train_tokens_per_task: Sequence[int]) -> dict[str, list[float]]:
        """λ_{side,t} = C_s / N_t (``kl_weight: elbo``, reading B4): with C_s the number of selection
        logits of side s per task (Σ over its selecting layers of H'; L_s · H') and N_t the train
        target tokens of task t, summing λ n_t K_t over an epoch gives C_s K_t = Σ_{l,h} KL, the
        seed's Eq. 3 (one KL per task for the whole data set)."""
        out: dict[str, list[float]] = {}
        for side, mods in self.head_selection_layers().items():
            tasks = mods[0][1].tasks
            if len(train_tokens_per_task) != tasks:
                raise ValueError(f"elbo_kl_weights: {len(train_tokens_per_task)} token counts for {tasks} tasks")
            if any(n <= 0 for n in train_tokens_per_task):
                raise ValueError(f"elbo_kl_weights: token counts must be positive, got {list(train_tokens_per_task)}")
            logits = sum(m.candidates for _, m in mods)
            out[side] = [logits / n for n in train_tokens_per_task]
        return out

    def head_selections(self) -> dict[str, dict[str, list]]:
        """Evaluation selections and logits per side, JSON-ready: ``{side: {"layers": [l, ...],
        "selected": [task][layer index] -> [candidate, ...] (slot order), "head_logits": [task][layer
        index] -> [φ_h, ...]}}`` (selection.json of the pipeline, docs/variants.md)."""
        out: dict[str, dict[str, list]] = {}
        for side, mods in self.head_selection_layers().items():
            sel = [m.eval_selection().tolist() for _, m in mods]  # [layer][task][slot]
            phi = [m.head_logits.detach().cpu().tolist() for _, m in mods]  # [layer][task][candidate]
            tasks = mods[0][1].tasks
            out[side] = {"layers": [layer for layer, _ in mods],
                         "selected": [[s[t] for s in sel] for t in range(tasks)],
                         "head_logits": [[p[t] for p in phi] for t in range(tasks)]}
        return out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
