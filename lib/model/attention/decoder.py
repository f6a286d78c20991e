"""The decoder's attention role: :class:`MultiheadAttention`, the attention core of
lib/model/attention/base.py (the same parameters, initialisation, head split and merge, weighted sum)
with what the decoder adds: cross-attention, the causal mask and the incremental cache. Its variants
(``smooth``, ``head_select``) register in the one registry with ``role = "decoder"``;
:func:`build_decoder_attention` builds a layer's module from a validated decoder spec."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lib.model.attention.base import (AttentionOutput, SelfAttention, attention_class, explicit_on_cpu,
                                      mask_bias, register_attention)


@register_attention("full")
class MultiheadAttention(SelfAttention):
    """Plain MHA for the decoder (self- and cross-attention) with an incremental cache: the ``full`` kind
    in the decoder role.

    ``cache`` (a dict owned by the caller, filled in place):
      self-attention:  "k", "v" (B, H, t, dh) grow by one step per call; "pad" (B, t) bool.
      cross-attention: "k", "v" (B, H, S, dh) computed once from the encoder output.

    ``forward`` returns an :class:`AttentionOutput` whose ``weights`` / ``carry`` (B, H, L, S) are
    computed only with ``need_weights`` (the next decoder layer smooths with this one's weights,
    docs/variants.md); otherwise the fused SDPA path runs as before.
    """

    role = "decoder"
    #: When True, the decoder passes the previous layer's carry (same kind: self or cross) as ``prev_attn``.
    needs_prev_attn: bool = False

    def __init__(self, d_model: int, n_heads: int, dropout: float, *, proj_heads: int | None = None) -> None:
        """``proj_heads``: heads produced by q/k/v_proj (default H); only head selection projects
        H' > H candidates (``out_proj`` always merges H heads)."""
        super().__init__(d_model, n_heads, dropout, proj_heads=proj_heads)

    def _project_cached(
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

    def _attend_masked(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Plain attention core: ctx (B, H, L, dh) and, with ``need_weights``, the pre-dropout
        weights (B, H, L, S); the fused SDPA path otherwise."""
        if need_weights or (q.device.type == "cpu" and (self.training and self.dropout > 0 or explicit_on_cpu(q))):
            # explicit weights; on CPU in training also the fast dropout mask (SDPA would fall back
            # to its math path with torch's slow CPU Bernoulli mask, lib.model.dropout); on CPU in
            # eval where SDPA's CPU kernel is the slower one (lib.model.attention.explicit_on_cpu)
            w = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scaling + mask_bias(mask, q.dtype), -1)
            ctx = self._weighted_sum(w, v)
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
        q, k, v, mask = self._project_cached(query, memory, key_padding_mask, causal, cache)
        ctx, w = self._attend_masked(q, k, v, mask, need_weights)
        return AttentionOutput(out=self.out_proj(self._merge(ctx)), weights=w, carry=w)


def build_decoder_attention(spec: dict | None, d_model: int, n_heads: int, dropout: float, *,
                            layer: int) -> MultiheadAttention:
    """The attention module of decoder layer ``layer`` (1-based) from a validated decoder spec
    (:func:`lib.model.config.decoder_attention_spec`): plain :class:`MultiheadAttention` when the
    spec is None or does not list the layer, else the variant with the spec's options."""
    if spec is None or layer not in spec["layers"]:
        return MultiheadAttention(d_model, n_heads, dropout)
    cls = attention_class(spec["type"], "decoder")
    return cls(d_model, n_heads, dropout, **{k: v for k, v in spec.items() if k not in ("type", "layers")})
