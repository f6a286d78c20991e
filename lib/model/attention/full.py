"""``full``: standard softmax attention over all (non-padded) keys, Eq. 1-2 of the paper."""
from __future__ import annotations

import torch.nn.functional as F

from lib.model.attention.base import SelfAttention, explicit_on_cpu, register_attention


@register_attention("full")
class FullAttention(SelfAttention):
    """Standard softmax attention over all (non-padded) keys: Eq. 1-2 of the paper.

    ``need_weights=False``: fused ``F.scaled_dot_product_attention`` (fast path).
    ``need_weights=True``: explicit softmax, identical math, weights returned pre-dropout.
    """

    def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
        if need_weights or (q.device.type == "cpu" and (self.training and self.dropout > 0 or explicit_on_cpu(q))):
            # (on CPU, training: the explicit path with the fast dropout mask, lib.model.dropout;
            # in eval where SDPA's CPU kernel is the slower one, explicit_on_cpu)
            weights = self._softmax_weights(q, k, key_padding_mask)
            return self._weighted_sum(weights, v), weights
        ctx = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=self.score_bias(key_padding_mask, q.shape[2], q.dtype),
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.scaling,
        )
        return ctx, None

    def packable(self) -> bool:
        return type(self) is FullAttention and self.rel_pos_bias is None and not self.core_fp32 \
            and not self.needs_prev_attn
