"""S2T Transformer (fairseq ``s2t_transformer_s``) with pluggable encoder self-attention.

Reference: Wang et al. (2020) fairseq S2T, as used by Alastruey et al. (2022), "On the Locality
of Attention in Direct Speech Translation", Section 2 + Appendix B:

    feats (B, T, 80)
      -> Conv1d subsampler: 2 x [Conv1d(k=5, stride=2) + GLU]        (T -> ~T/4)
      -> * sqrt(d) + sinusoidal positions -> dropout
      -> 12 pre-LN encoder layers (self-attention is pluggable, see lib/model/attention/)
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lib.model.attention import SelfAttention, build_attention
from lib.model.attention.decoder import build_decoder_attention
from lib.model.config import MODEL_SIZES, SUBSAMPLER_NORMS, ModelConfig, model_config  # noqa: F401 (re-exported)
from lib.model.dropout import Dropout
from lib.model.cuda_attention import Packing, flash_supported
from lib.model.local_attention import attention_path

__all__ = [
    "MODEL_SIZES",
    "Conv1dSubsampler",
    "DecoderLayer",
    "EncoderLayer",
    "EncoderOutput",
    "ModelConfig",
    "S2TTransformer",
    "S2TTransformerDecoder",
    "S2TTransformerEncoder",
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
        """(B, T, n_mels), (B,) -> (B, N, d), (B,) subsampled lengths. The features are cast to the
        convolutions' dtype (the corpus stores float32; a float64 model, ``amp: fp64``, takes them too;
        under autocast the weights stay float32, so nothing changes there)."""
        x = feats.transpose(1, 2).to(self.conv_layers[0].weight.dtype)  # (B, C, T)
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

    def output_lengths(self, feat_lengths: Tensor) -> Tensor:
        """The encoder's output lengths (B,) for input frame lengths (B,): the subsampler's, on the
        lengths' device (a host tensor gives host lengths, with no wait for the GPU)."""
        return subsampled_lengths(feat_lengths, len(self.subsample.conv_layers))

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
            n_lengths = self.output_lengths(torch.tensor(host, dtype=torch.long))
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

    # -- head selection (docs/variants.md) ------------------------------------------

    def head_selection_layers(self) -> dict[str, list[tuple[int, nn.Module]]]:
        """The head selectors of the self-attention layers per side, ``{"encoder": [(layer, selector),
        ...], "decoder": [...]}`` (1-based layer numbers; a side without any is left out, so an empty
        dict means the model selects no heads). A layer's attention selects heads when it holds a
        selector (``selector``, lib.model.attention.head_selection.HeadSelector): this module never
        imports the variant. What a run makes of them (KL weights, selection.json) is
        lib/train/head_selection.py's."""
        sides = {
            "encoder": [(i + 1, getattr(layer.self_attn, "selector", None)) for i, layer in enumerate(self.encoder.layers)],
            "decoder": [(i + 1, getattr(layer.self_attn, "selector", None)) for i, layer in enumerate(self.decoder.layers)],
        }
        return {side: kept for side, mods in sides.items()
                if (kept := [(i, m) for i, m in mods if getattr(m, "selects_heads", False)])}

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
