"""``local``: centred sliding-window attention, the paper's Section 4 (kernels: lib/model/local_attention.py)."""
from __future__ import annotations

import torch

from lib.model.config import odd_window
from lib.model.attention.base import SelfAttention, band_bias, register_attention


@register_attention("local")
class LocalAttention(SelfAttention):
    """Centred sliding-window attention (the paper's Section 4): query i attends exactly to keys
    j with |i - j| <= (window - 1) / 2, computed blockwise without any N x N tensor
    (:func:`lib.model.local_attention.local_attention`). Same parameters as full attention.

    ``need_weights=True`` (analysis only) scatters the banded weights into a dense (B, H, N, N)
    tensor so that analysis code sees the same shape for every variant.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, *, window: int, rel_pos_max: int = 0) -> None:
        if rel_pos_max:
            raise ValueError("the relative-position bias (model.overrides.rel_pos_bias, a diagnostic control) "
                             "is not implemented for local attention")
        super().__init__(d_model, n_heads, dropout)
        odd_window(window, "local attention window")
        self.window = window

    def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
        from lib.model.cuda_attention import sdpa_band_attention
        from lib.model.local_attention import attention_path, local_attention

        # The kernel for this call (lib.model.local_attention.attention_path): on CPU the blocked kernel,
        # or the dense band for short 16-bit sequences, as before; on CUDA in this (padded) layout SDPA
        # with a band mask (the encoder's packed layout takes FlashAttention-2: forward_packed).
        path = attention_path(q.device.type, q.dtype, q.shape[-1], q.shape[2], need_weights=need_weights)
        if path == "sdpa_band":
            return sdpa_band_attention(q, k, v, self.window, key_padding_mask, dropout_p=self.dropout,
                                       training=self.training), None
        if path == "dense_band":
            # Short sequences in bf16 on CPU: the same band as a dense masked score matrix, through
            # full attention's explicit path (fast dropout mask); the blocked kernel's small matmuls
            # cost more there (lib/model/local_attention.py, DENSE_BAND_MAX_LEN). Padded query rows
            # whose window holds no real key get finite weights here (zeros in the blocked kernel);
            # like full attention's padded rows, they reach no loss.
            band = band_bias(q.shape[2], self.window, q.dtype, q.device)  # (1, 1, N, N)
            weights = self._softmax_weights(q, k, key_padding_mask, extra_bias=band)
            return self._weighted_sum(weights, v), None
        res = local_attention(q, k, v, self.window, key_padding_mask, dropout_p=self.dropout,
                              training=self.training, return_weights=need_weights)
        if not need_weights:
            return res, None
        ctx, band = res  # band: (B, H, N, w), column c <-> key i - (w-1)//2 + c
        n, half = q.shape[2], (self.window - 1) // 2
        dense = band.new_zeros(*band.shape[:3], n + 2 * half)  # (B, H, N, N + w - 1)
        idx = torch.arange(n, device=band.device)[:, None] + torch.arange(self.window, device=band.device)
        dense.scatter_(-1, idx.expand(*band.shape[:2], n, self.window), band)
        return ctx, dense[..., half:half + n]  # (B, H, N, N)

    def packable(self) -> bool:
        return type(self) is LocalAttention and not self.core_fp32 and not self.needs_prev_attn

    def packed_window(self) -> int | None:
        return self.window

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}"
