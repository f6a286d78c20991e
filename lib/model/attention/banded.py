"""``banded``: local attention through a dense band mask (analysis at inference only)."""
from __future__ import annotations

import torch
from torch import Tensor

from lib.model.config import odd_window
from lib.model.attention.base import band_bias, register_attention
from lib.model.attention.full import FullAttention


@register_attention("banded")
class BandedAttention(FullAttention):
    """Full attention with keys outside |i - j| <= (window - 1) / 2 masked: mathematically the
    ``local`` variant, but through a dense (B, H, N, N) score matrix, so it also takes the
    relative-position bias control. For analysis at inference (the band test of
    lib/analysis/health.py on models with ``rel_pos_bias``); training uses ``local``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, *, window: int, rel_pos_max: int = 0) -> None:
        super().__init__(d_model, n_heads, dropout, rel_pos_max=rel_pos_max)
        odd_window(window, "banded attention window")
        self.window = window

    def score_bias(self, key_padding_mask: Tensor | None, n: int, dtype: torch.dtype) -> Tensor | None:
        band = band_bias(n, self.window, dtype, self.q_proj.weight.device)  # (1, 1, N, N)
        bias = super().score_bias(key_padding_mask, n, dtype)
        return band if bias is None else bias + band

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}"
