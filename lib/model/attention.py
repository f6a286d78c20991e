"""Pluggable encoder self-attention.

Every encoder layer owns one ``SelfAttention`` module built from a small spec dict
(``{"type": "full"}``, ``{"type": "local", "window": 13}``, ...) by ``build_attention``.
All variants share the same parameters -- ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``
(``nn.Linear(d, d, bias=True)``, fairseq's ``MultiheadAttention`` names) -- so a checkpoint
trained with one variant loads into another with no key remapping, and the contribution
analysis (Kobayashi et al., 2021) can read W_V / W_O from the very modules that trained.

Anatomy of a forward pass (the base class does everything except the core):

    q, k, v = self._project(x)                       # (B, H, N, dh) each
    ctx, w  = self.attend(q, k, v, key_padding_mask,  # variant-specific core
                          prev_attn=..., task=..., need_weights=...)
    out     = self.out_proj(self._merge(ctx))         # (B, N, d)

Precision: under bf16 / fp16 autocast the projections run in low precision; the core (``attend``:
scores, softmax, weighted sum, and their backward) follows the device's autocast (on CPU: bf16
throughout) unless ``core_fp32`` (``ModelConfig.attention_fp32``) runs it in fp32 with autocast off,
casting the context back before ``out_proj``.

A new variant subclasses ``SelfAttention``, overrides ``attend`` only, declares its spec
keys as keyword arguments of ``__init__`` and registers itself with
``@register_attention("name")``. Example (the local-attention variant)::

    @register_attention("local")
    class LocalAttention(SelfAttention):
        def __init__(self, d_model, n_heads, dropout, *, window: int) -> None:
            super().__init__(d_model, n_heads, dropout)
            self.window = int(window)

        def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None,
                   need_weights=False):
            res = local_attention(q, k, v, self.window, key_padding_mask,
                                  dropout_p=self.dropout, training=self.training,
                                  return_weights=need_weights)
            return res if need_weights else (res, None)

Registered variants: ``full``, ``local`` (the paper's Section 4), ``banded`` (local through a dense
mask, analysis only), ``smooth`` (attention-weight smoothing with prior distributions, Maekaku et al.:
:class:`SmoothedAttention`, docs/variants.md) and ``head_select`` (per-task selection of H of H'
candidate heads, Gong et al.: :class:`HeadSelectionAttention`, docs/variants.md).

Hooks for the later systems:

* ``prev_attn`` -- what the previous encoder layer handed on as its ``carry`` (B, H, N, N). The
  encoder only computes and forwards it when the receiving module sets ``needs_prev_attn = True``
  (attention smoothing with the previous layer as prior; read on the instance, so a variant may
  set it per instance in ``__init__``), so full models never materialise weights they do not
  need. ``attend`` returns ``(ctx, weights)`` or ``(ctx, weights, carry)``: ``weights`` are the
  *effective* weights that multiplied V (analysis, contributions), ``carry`` what the next layer
  receives as ``prev_attn`` (default: ``weights``; non-recursive smoothing hands on the *raw*
  softmax instead, docs/variants.md).
* ``task`` -- a (B,) long tensor of task ids (target-language index) that reaches every encoder
  attention module (per-task head selection). ``proj_heads`` lets a head-selection variant
  project more candidate heads (H' > H) than it merges.

Padding convention: ``key_padding_mask`` is a (B, N) bool tensor, True = padding. Padded keys
receive exactly zero weight; a large *finite* negative bias is used instead of -inf so that a
fully-masked query row yields finite (uniform) weights instead of NaN.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lib.model.config import BAND_INIT_LOGIT, head_selection_options, smoothing_options
from lib.model.dropout import dropout

__all__ = [
    "ATTENTION_VARIANTS",
    "AttentionOutput",
    "FullAttention",
    "HeadSelection",
    "HeadSelectionAttention",
    "SelfAttention",
    "SmoothedAttention",
    "band_bias",
    "band_logit_matrix",
    "bernoulli_kl",
    "build_attention",
    "explicit_on_cpu",
    "gather_heads",
    "logistic_noise",
    "mask_bias",
    "predicted_gate",
    "register_attention",
    "select_heads",
    "set_head_selection_tau",
    "straight_through",
    "uniform_prior",
]


# ----------------------------------------------------------------------------------------
# Masks
# ----------------------------------------------------------------------------------------


def mask_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Turn a bool mask (True = forbidden) into an additive float bias of ``dtype``.

    Uses ``finfo(dtype).min / 2`` rather than -inf: forbidden entries still get exactly zero
    probability whenever the row has at least one allowed entry (exp underflows to 0), a row
    with no allowed entry gets finite uniform weights instead of NaN, and adding the bias to a
    score does not overflow to -inf even in float16.
    """
    neg = torch.finfo(dtype).min / 2
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, neg)


def band_bias(n: int, window: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(1, 1, N, N) additive bias that forbids keys outside |i - j| <= (window - 1) / 2."""
    pos = torch.arange(n, device=device)
    return mask_bias((pos[None, :] - pos[:, None]).abs() > (window - 1) // 2, dtype)[None, None]


def explicit_on_cpu(q: Tensor) -> bool:
    """Whether attention in eval on CPU takes the explicit path (q k^T, softmax, weights v) rather
    than ``F.scaled_dot_product_attention``: for one query row (an incremental decoding step), where
    SDPA's CPU flash kernel has a large fixed cost per call, and in bf16, where it is slower than two
    bf16 matmuls. ``python benchmarks/attention_core.py`` prints both paths for the demo's shapes
    (docs/benchmarks.md). Same math; the last bits differ."""
    return q.size(-2) == 1 or q.dtype == torch.bfloat16


def key_padding_bias(key_padding_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """(B, N) bool padding mask -> (B, 1, 1, N) additive bias broadcastable over heads/queries."""
    if key_padding_mask is None:
        return None
    return mask_bias(key_padding_mask[:, None, None, :], dtype)


# ----------------------------------------------------------------------------------------
# Interface
# ----------------------------------------------------------------------------------------


@dataclass
class AttentionOutput:
    out: Tensor  # (B, N, d)
    weights: Tensor | None  # (B, H, N, N) post-softmax, pre-dropout; only when need_weights
    carry: Tensor | None = None  # (B, H, N, N) the next layer's prev_attn (default: weights); only when need_weights


class SelfAttention(nn.Module):
    """Base multi-head self-attention (pre-LN Transformer encoder, fairseq parameter names).

    Parameters q_proj, k_proj, v_proj, out_proj (``nn.Linear(d, d, bias=True)``) have the SAME
    names in every variant, so a checkpoint trained with one variant loads into another with no
    key remapping. Subclasses override only :meth:`attend`.

    Args:
        d_model: model width d.
        n_heads: number of heads H merged into the output; head width dh = d // H.
        dropout: dropout probability on the attention weights (training only).
        proj_heads: number of heads produced by the q/k/v projections (default H). Only for
            variants that select H of H' > H candidate heads (head selection); for them q/k/v
            map d -> H' * dh while out_proj still maps H * dh -> d.
    """

    #: When True, the encoder passes the previous layer's attention weights as ``prev_attn``.
    needs_prev_attn: bool = False
    #: When True, under bf16 / fp16 autocast the core runs in fp32 (``forward``); set per instance by
    #: the encoder from ``ModelConfig.attention_fp32``.
    core_fp32: bool = False

    def __init__(
        self, d_model: int, n_heads: int, dropout: float, *, proj_heads: int | None = None,
        rel_pos_max: int = 0,
    ) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.proj_heads = n_heads if proj_heads is None else int(proj_heads)
        self.dropout = float(dropout)
        self.scaling = self.head_dim**-0.5
        proj_dim = self.proj_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, proj_dim, bias=True)
        self.k_proj = nn.Linear(d_model, proj_dim, bias=True)
        self.v_proj = nn.Linear(d_model, proj_dim, bias=True)
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=True)
        # Diagnostic control (model.overrides.rel_pos_bias, not in the paper): a learned bias per
        # head and clipped relative offset j - i in [-K, K] added to the scores (T5 / Shaw et al.
        # style), zero at initialisation so the model starts as the plain one.
        self.rel_pos_max = int(rel_pos_max)
        if self.rel_pos_max < 0:
            raise ValueError(f"rel_pos_max must be >= 0, got {rel_pos_max}")
        self.rel_pos_bias = nn.Parameter(torch.zeros(self.proj_heads, 2 * self.rel_pos_max + 1)) if self.rel_pos_max else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """fairseq ``MultiheadAttention`` init: xavier (gain 1/sqrt 2) for q/k/v, xavier for
        out_proj, zero out_proj bias."""
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    # -- shared plumbing ------------------------------------------------------------------

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, N, d) -> q, k, v each (B, H_proj, N, dh). Scaling is applied in ``attend``."""
        B, N, _ = x.shape

        def split(t: Tensor) -> Tensor:
            return t.view(B, N, self.proj_heads, self.head_dim).transpose(1, 2)

        return split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))

    def _merge(self, ctx: Tensor) -> Tensor:
        """(B, H, N, dh) -> (B, N, H * dh)."""
        B, H, N, dh = ctx.shape
        return ctx.transpose(1, 2).reshape(B, N, H * dh)

    def relative_bias(self, n: int, dtype: torch.dtype) -> Tensor | None:
        """(H, N, N) learned bias b[h, clip(j - i, -K, K)] when ``rel_pos_max`` K > 0, else None."""
        if self.rel_pos_bias is None:
            return None
        pos = torch.arange(n, device=self.rel_pos_bias.device)
        offset = (pos[None, :] - pos[:, None]).clamp(-self.rel_pos_max, self.rel_pos_max) + self.rel_pos_max
        return self.rel_pos_bias[:, offset].to(dtype)  # (H, N, N)

    def score_bias(self, key_padding_mask: Tensor | None, n: int, dtype: torch.dtype) -> Tensor | None:
        """Additive score bias: padding (B, 1, 1, N) plus the relative-position bias (H, N, N)."""
        bias = key_padding_bias(key_padding_mask, dtype)
        rel = self.relative_bias(n, dtype)
        if rel is None:
            return bias
        return rel[None] if bias is None else bias + rel[None]

    def _softmax_weights(self, q: Tensor, k: Tensor, key_padding_mask: Tensor | None,
                         extra_bias: Tensor | None = None) -> Tensor:
        """Explicit softmax(q k^T / sqrt(dh) + bias): (B, H, N, N), rows sum to 1. ``extra_bias`` is
        added to :meth:`score_bias`'s (LocalAttention's dense path: its band, :func:`band_bias`)."""
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scaling
        bias = self.score_bias(key_padding_mask, q.shape[2], scores.dtype)
        if extra_bias is not None:
            bias = extra_bias + (0 if bias is None else bias)
        if bias is not None:
            scores = scores + bias
        return torch.softmax(scores, dim=-1)

    def _weighted_sum(self, weights: Tensor, v: Tensor) -> Tensor:
        """Dropout (training only) on the weights, then weights @ v -> (B, H, N, dh)."""
        return torch.matmul(dropout(weights, self.dropout, self.training), v)

    # -- variant core ---------------------------------------------------------------------

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        *,
        prev_attn: Tensor | None = None,
        task: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None] | tuple[Tensor, Tensor | None, Tensor | None]:
        """Core attention on split heads.

        Args:
            q, k, v: (B, H_proj, N, dh), unscaled.
            key_padding_mask: (B, N) bool, True = padding, or None.
            prev_attn: previous encoder layer's carry (B, H, N, N) if ``needs_prev_attn``.
            task: (B,) long task ids, or None.
            need_weights: whether the caller wants the weights back.

        Returns:
            ctx (B, H, N, dh) and the post-softmax, pre-dropout weights (B, H, N, N) when
            ``need_weights`` (None otherwise is fine); optionally a third element, the carry
            (B, H, N, N) handed to the next layer as ``prev_attn`` (default: the weights).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement attend()")

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None,
        *,
        prev_attn: Tensor | None = None,
        task: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        q, k, v = self._project(x)
        if self.core_fp32 and q.dtype in (torch.bfloat16, torch.float16):
            # The projections ran in low precision under autocast; the core (scores, softmax,
            # weighted sum, and their backward) runs in fp32 with autocast off, as CUDA's autocast
            # keeps softmax (CPU's leaves all of it in bf16). Opt-in (model.overrides.attention_fp32):
            # measured (docs/pipeline.md, precision), it costs ≈ 11 % of a bf16 step of the
            # full-attention model and moved 5-seed BLEU by no more than the seeds' spread.
            dtype = q.dtype
            if prev_attn is not None:
                prev_attn = prev_attn.float()
            with torch.autocast(q.device.type, enabled=False):
                res = self.attend(q.float(), k.float(), v.float(), key_padding_mask, prev_attn=prev_attn,
                                  task=task, need_weights=need_weights)
            res = (res[0].to(dtype), *res[1:])
        else:
            res = self.attend(q, k, v, key_padding_mask, prev_attn=prev_attn, task=task, need_weights=need_weights)
        ctx, weights = res[0], res[1]
        carry = res[2] if len(res) == 3 else weights
        out = self.out_proj(self._merge(ctx))
        if not need_weights:
            return AttentionOutput(out=out, weights=None, carry=None)
        return AttentionOutput(out=out, weights=weights, carry=carry)

    # -- the encoder's packed (varlen) layout on CUDA (lib/model/local_attention.py, "CUDA paths") -------

    def packable(self) -> bool:
        """Whether :meth:`forward_packed` can stand in for :meth:`forward` (no weights asked for): only the
        plain ``full`` and ``local`` variants (not their subclasses), without the relative-position bias,
        fp32 core or previous-layer input. Others keep the encoder in the padded layout."""
        return False

    def packed_window(self) -> int | None:
        """The window of the packed core (None: full attention)."""
        return None

    def forward_packed(self, x: Tensor, packing) -> Tensor:
        """x (T, d), the valid rows of the batch end to end (``packing``: a
        :class:`lib.model.local_attention.Packing`) -> (T, d): the same projections and output projection
        as :meth:`forward`, the core by :func:`lib.model.local_attention.packed_attention`."""
        from lib.model.local_attention import packed_attention

        T = x.shape[0]

        def split(t: Tensor) -> Tensor:
            return t.view(T, self.proj_heads, self.head_dim)

        ctx = packed_attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)), packing,
                               self.packed_window(), dropout_p=self.dropout, training=self.training)
        return self.out_proj(ctx.reshape(T, self.n_heads * self.head_dim))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout}"
            + (f", proj_heads={self.proj_heads}" if self.proj_heads != self.n_heads else "")
        )


# ----------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------

ATTENTION_VARIANTS: dict[str, type[SelfAttention]] = {}

_S = TypeVar("_S", bound=type[SelfAttention])


def register_attention(name: str) -> Callable[[_S], _S]:
    """Class decorator: ``@register_attention("local")`` adds the class to the registry."""

    def deco(cls: _S) -> _S:
        if not (isinstance(cls, type) and issubclass(cls, SelfAttention)):
            raise TypeError(f"{cls!r} is not a SelfAttention subclass")
        if name in ATTENTION_VARIANTS and ATTENTION_VARIANTS[name] is not cls:
            raise ValueError(f"attention variant {name!r} is already registered")
        ATTENTION_VARIANTS[name] = cls
        return cls

    return deco


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
        if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % 2 == 0:
            raise ValueError(f"local attention window must be a positive odd integer, got {window!r}")
        self.window = window

    def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
        from lib.model.local_attention import attention_path, local_attention, sdpa_band_attention

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


@register_attention("banded")
class BandedAttention(FullAttention):
    """Full attention with keys outside |i - j| <= (window - 1) / 2 masked: mathematically the
    ``local`` variant, but through a dense (B, H, N, N) score matrix, so it also takes the
    relative-position bias control. For analysis at inference (the band test of
    lib/analysis/health.py on models with ``rel_pos_bias``); training uses ``local``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, *, window: int, rel_pos_max: int = 0) -> None:
        super().__init__(d_model, n_heads, dropout, rel_pos_max=rel_pos_max)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % 2 == 0:
            raise ValueError(f"banded attention window must be a positive odd integer, got {window!r}")
        self.window = window

    def score_bias(self, key_padding_mask: Tensor | None, n: int, dtype: torch.dtype) -> Tensor | None:
        band = band_bias(n, self.window, dtype, self.q_proj.weight.device)  # (1, 1, N, N)
        bias = super().score_bias(key_padding_mask, n, dtype)
        return band if bias is None else bias + band

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}"


# ----------------------------------------------------------------------------------------
# Smoothing with prior distributions (Maekaku et al. 2022; docs/variants.md)
# ----------------------------------------------------------------------------------------


def band_logit_matrix(b: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The paper's band matrix of the truncated prior (docs/variants.md), closed form.

    Seed construction (0-based): a zero matrix Z (N, N + k - 1), row i gets ``b`` in columns
    i .. i + k - 1, keep N columns from c0 = ceil(k / 2) - 1. Equivalently
    ``Bl[i, j] = b[j - i + c0]`` if ``0 <= j - i + c0 < k``, else 0 (logit 0, not -inf: reading A3).
    Odd k = 2m + 1: centred, b[m] on the diagonal; even k (only reachable by calling this
    directly; specs reject it): lopsided one step to the future.

    Args:
        b: (..., k) band logits (a leading head dimension is kept).
        n: sequence length N.

    Returns:
        Bl (..., N, N) and the in-band mask (N, N) bool.
    """
    k = b.shape[-1]
    c0 = (k + 1) // 2 - 1  # ceil(k / 2) - 1
    pos = torch.arange(n, device=b.device)
    offset = pos[None, :] - pos[:, None] + c0  # (N, N): index into b
    inside = (offset >= 0) & (offset < k)  # (N, N)
    logits = b[..., offset.clamp(0, k - 1)]  # (..., N, N)
    return logits.masked_fill(~inside, 0.0), inside


def uniform_prior(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """Uniform prior over the allowed keys (docs/variants.md): ``allowed`` (..., N_q, N_k)
    bool -> (..., N_q, N_k) with 1 / #allowed on the allowed keys (1 / T_b over valid frames, 1 / (i+1)
    over a causal prefix, 1 / |W_i| on a window), 0 elsewhere, all-zero rows where nothing is allowed."""
    m = allowed.to(dtype)
    return m / m.sum(-1, keepdim=True).clamp_min(1.0)


def predicted_gate(q: Tensor, c: Tensor, b: Tensor | None = None) -> Tensor:
    """Predicted interpolation coefficient g_{b,h,i} = σ(q_{b,h,i} · c_h) (docs/variants.md, reading A6): the paper's
    σ(X' W^q c) split into per-head partial dot products. q (B, H, N, dh) unscaled (bias included),
    c (H · dh,) -> g (B, H, N, 1). ``b`` (H,): a per-head bias inside the sigmoid, σ(q · c_h + b_h)
    (``gate_bias``, initialised to logit(gate_init) so that g starts at γ; None: no bias)."""
    H, dh = q.shape[1], q.shape[3]
    z = (q * c.view(H, dh)[None, :, None, :]).sum(-1, keepdim=True)  # (B, H, N, 1)
    if b is not None:
        z = z + b.to(z.dtype)[None, :, None, None]
    return torch.sigmoid(z)


def gate_bias_init(n_heads: int, gate_init: float) -> Tensor:
    """(H,) the predicted gate's bias at initialisation: logit(gate_init), so that with the gate
    vector c = 0 every g = σ(b_h) = gate_init exactly where the fixed-γ systems start."""
    return torch.full((n_heads,), math.log(gate_init) - math.log1p(-gate_init))


def band_logits_init(shape: tuple[int, ...], width: int) -> Tensor:
    """The band prior's logits b (..., k) at initialisation: :data:`BAND_INIT_LOGIT` (ln 100) on the
    centred ``width`` entries (offsets |j - i| <= (width - 1) / 2), 0 on the rest, so the prior starts
    as a band of that width instead of uniform (b = 0, the paper's zero init)."""
    k = shape[-1]
    b = torch.zeros(shape)
    lo = (k - width) // 2  # both odd: the centre entry m = (k - 1) / 2 and (width - 1) / 2 either side
    b[..., lo:lo + width] = BAND_INIT_LOGIT
    return b


@register_attention("smooth")
class SmoothedAttention(SelfAttention):
    """Attention-weight smoothing with a prior (Maekaku et al.; docs/variants.md):

        A'_l = (1 - γ) A_l + γ P_l            ctx = dropout(A'_l) V

    with A_l = softmax(q k^T / sqrt(dh) + bias) the raw weights over the allowed keys (not padding,
    inside the window when ``window`` is set) and P_l a row-stochastic prior over the same keys:

    * ``uniform`` (relaxed attention): P[b, i, j] = m_b[j] / T_b with T_b the *valid* length
      (reading A1; the paper's "length of the subsampling", which Espresso reads as the padded length).
    * ``band`` (truncated prior): P[i, :] = masked softmax of the band logits Bl[i, :]
      (:func:`band_logit_matrix`), ``band_logits`` b (k,) per layer shared by the heads, or (H, k)
      with ``per_head`` (A4). At init b is a band (:func:`band_logits_init`): ln 100 on the centred
      ``band_init_width`` entries (default k; the layer's local window, Algorithm 1's, when the
      definition smooths the local model: lib.model.spec.smoothing_spec), 0 elsewhere; the paper's
      b = 0 would start (and, under Adam's step cap, stay near) the uniform prior. ``band_outside:
      masked`` puts -inf instead of 0 off the band (a true box prior).
    * ``prev``: P = the previous layer's carry, head h with head h (A5): its raw weights A_{l-1}
      (``recursive: false``), or Ā_{l-1} (``recursive: true``: Ā_l = A'_l for smoothed layers, A_l
      otherwise). Layer 1 has no layer below (A2): ValueError at run time if no prev_attn arrives.
    * ``gamma: predicted`` (with ``prev``, recursive): γ is replaced per head and query by
      g = σ(q_{b,h,i} · c_h + b_h) (B, H, N, 1), q the unscaled projected query (bias included, W^q
      shared with attention, not detached), ``gate_vector`` c (H·dh,) zeros at init and ``gate_bias``
      b (H,) at logit(``gate_init``), so g starts at ``gate_init`` (default γ = 0.1, where the fixed-γ
      systems are; the paper's bias-free gate starts at 0.5; A6).

    ``window`` w (local attention underneath): A_l and P_l are both restricted to
    W_i = {j valid: |i - j| <= (w - 1) / 2} and P renormalised there (uniform -> 1/|W_i|, band ->
    softmax over W_i, prev -> A_{l-1} renormalised), so A' is exactly 0 outside the window. Dense
    O(N^2) path: no speed is claimed.

    ``train_only`` (relaxed attention, Q5/A8): smoothing in training only; at inference the layer
    is exactly the plain full (or local) attention. Default False as in docs/variants.md's class signature
    (the relaxed defs of params.yaml set it to true explicitly).

    Returned ``weights`` are A' before dropout; the ``carry`` to the next layer is the raw A_l for
    non-recursive ``prev`` (A9) and A'_l otherwise. Gradients flow through the prior (nothing
    detached). Padding: valid rows of A' sum to 1 over the valid keys, padded keys get exactly 0 in
    every row, rows without any allowed key (an all-padding sample, a padded query whose window is
    all padding) are all-zero and finite. Parameter names ``band_logits`` / ``gate_vector`` /
    ``gate_bias`` are variant-only (:data:`VARIANT_PARAMETER_NAMES`: their own optimizer group,
    lib.train.loop.make_optimizer), so a full-attention checkpoint loads with them reported as missing.

    Deviations from the paper (readings in docs/variants.md): T_b is the valid length (A1); layer 1 takes
    no ``prev`` prior (A2); off-band logits are 0 (A3); k must be odd (A3).
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
        k: int | None = None,
        band_outside: str = "literal",
        per_head: bool = False,
        gate_init: float | None = None,
        band_init_width: int | None = None,
        window: int | None = None,
        rel_pos_max: int = 0,
    ) -> None:
        opts = smoothing_options(prior=prior, gamma=gamma, recursive=recursive, train_only=train_only, k=k,
                                 band_outside=band_outside, per_head=per_head, gate_init=gate_init,
                                 band_init_width=band_init_width, key="smooth")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1
                                   or window % 2 == 0):
            raise ValueError(f"smooth.window: must be a positive odd integer or None, got {window!r}")
        if window is not None and rel_pos_max:
            raise ValueError("the relative-position bias (model.overrides.rel_pos_bias) is not implemented for "
                             "local attention (smooth.window)")
        super().__init__(d_model, n_heads, dropout, rel_pos_max=rel_pos_max)
        self.prior: str = opts["prior"]
        self.gamma: float | str = opts["gamma"]
        self.recursive: bool = opts["recursive"]
        self.train_only: bool = opts["train_only"]
        self.k: int | None = opts["k"]
        self.band_outside: str = opts["band_outside"]
        self.per_head: bool = opts["per_head"]
        self.window: int | None = window
        self.needs_prev_attn = self.prior == "prev"  # per instance (docs/variants.md)
        self.gate_init: float | None = opts["gate_init"]
        self.band_init_width: int | None = opts["band_init_width"]
        band_shape = (n_heads, self.k) if self.per_head else (self.k,)
        self.band_logits = nn.Parameter(band_logits_init(band_shape, self.band_init_width)) \
            if self.prior == "band" else None
        self.gate_vector = nn.Parameter(torch.zeros(n_heads * self.head_dim)) if self.gamma == "predicted" else None
        self.gate_bias = nn.Parameter(gate_bias_init(n_heads, self.gate_init)) if self.gamma == "predicted" else None

    @property
    def active(self) -> bool:
        """False for ``train_only`` smoothing at inference (then the layer is plain attention)."""
        return self.training or not self.train_only

    def allowed_keys(self, key_padding_mask: Tensor | None, n: int, device: torch.device) -> Tensor:
        """(B | 1, 1, N, N) bool: key j may be attended from query i (not padding, inside the window)."""
        allowed = torch.ones(1, 1, n, n, dtype=torch.bool, device=device)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, None, None, :]  # (B, 1, N, N)
        if self.window is not None:
            pos = torch.arange(n, device=device)
            allowed = allowed & ((pos[None, :] - pos[:, None]).abs() <= (self.window - 1) // 2)
        return allowed

    def raw_weights(self, q: Tensor, k: Tensor, allowed: Tensor) -> Tensor:
        """A_l = softmax(q k^T / sqrt(dh) [+ rel. bias]) over the allowed keys: (B, H, N, N), exactly
        0 on the other keys (all-zero rows where nothing is allowed)."""
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scaling  # (B, H, N, N)
        rel = self.relative_bias(q.shape[2], scores.dtype)
        if rel is not None:
            scores = scores + rel[None]
        scores = scores + mask_bias(~allowed, scores.dtype)
        return torch.softmax(scores, dim=-1).masked_fill(~allowed, 0.0)

    def prior_weights(self, allowed: Tensor, prev_attn: Tensor | None, dtype: torch.dtype) -> Tensor:
        """P_l (B | 1, H | 1, N, N) of docs/variants.md, row-stochastic over the allowed keys (renormalised on
        the window), exactly 0 on the other keys."""
        n = allowed.shape[-1]
        if self.prior == "uniform":
            return uniform_prior(allowed, dtype)  # m_b[j] / T_b (or 1 / |W_i|)
        if self.prior == "band":
            logits, inside = band_logit_matrix(self.band_logits.to(dtype), n)  # (N, N) or (H, N, N)
            if logits.dim() == 2:
                logits = logits[None]  # (1, N, N): shared by the heads
            ok = allowed & inside if self.band_outside == "masked" else allowed  # (B | 1, 1, N, N)
            return torch.softmax(logits[None] + mask_bias(~ok, dtype), dim=-1).masked_fill(~ok, 0.0)
        if prev_attn is None:
            raise ValueError("smooth (prior: prev) got no prev_attn: the first encoder layer has no layer below "
                             "(docs/variants.md)")
        p = prev_attn.to(dtype).masked_fill(~allowed, 0.0)  # (B, H, N, N)
        if self.window is None:
            return p  # rows of A_{l-1} already sum to 1 over the valid keys
        total = p.sum(-1, keepdim=True)  # (B, H, N, 1); 0 only for rows without allowed mass
        return p / torch.where(total > 0, total, torch.ones_like(total))  # all-zero rows stay 0, no 0/0

    def gate(self, q: Tensor) -> Tensor:
        """Predicted coefficient g = σ(q_{b,h,i} · c_h + b_h): q (B, H, N, dh) unscaled -> (B, H, N, 1)."""
        return predicted_gate(q, self.gate_vector, self.gate_bias)

    def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
        if not self.active:  # relaxed attention at inference: the very code of the plain layer
            plain = FullAttention if self.window is None else LocalAttention
            return plain.attend(self, q, k, v, key_padding_mask, need_weights=need_weights)
        allowed = self.allowed_keys(key_padding_mask, q.shape[2], q.device)  # (B | 1, 1, N, N)
        raw = self.raw_weights(q, k, allowed)  # A_l (B, H, N, N)
        prior = self.prior_weights(allowed, prev_attn, raw.dtype)  # P_l (B | 1, H | 1, N, N)
        gamma = self.gate(q).to(raw.dtype) if self.gamma == "predicted" else self.gamma  # (B, H, N, 1) or float
        weights = (1 - gamma) * raw + gamma * prior  # A'_l (B, H, N, N)
        carry = raw if self.prior == "prev" and not self.recursive else weights
        return self._weighted_sum(weights, v), weights, carry

    def extra_repr(self) -> str:
        extra = f", prior={self.prior}, gamma={self.gamma}"
        if self.recursive:
            extra += ", recursive=True"
        if self.train_only:
            extra += ", train_only=True"
        if self.prior == "band":
            extra += f", k={self.k}, band_outside={self.band_outside}" + (", per_head=True" if self.per_head else "")
            extra += f", band_init_width={self.band_init_width}"
        if self.gate_init is not None:
            extra += f", gate_init={self.gate_init}"
        if self.window is not None:
            extra += f", window={self.window}"
        return super().extra_repr() + extra


# ----------------------------------------------------------------------------------------
# Attention head selection (Gong et al. 2021; docs/variants.md)
# ----------------------------------------------------------------------------------------

#: The selector temperature of the paper's public code (its constructor default); reading B5.
DEFAULT_HEAD_SELECTION_TAU = 5.0


def logistic_noise(shape: tuple[int, ...], *, device: torch.device, dtype: torch.dtype) -> Tensor:
    """ε = log u − log(1 − u), u ~ U(0, 1) from the global torch RNG (so a resumed run replays it).

    This is the difference of two independent Gumbel(0, 1) draws (a Logistic(0, 1) variable), i.e.
    exactly the noise of the paper's two-class Gumbel-softmax (its Eq. 4) once the two logits are
    folded into one, φ = φ(1) − φ(0) (docs/variants.md). u = 0 (possible: ``torch.rand`` is in [0, 1)) is
    nudged to the smallest normal number so that ε stays finite."""
    u = torch.rand(shape, device=device, dtype=dtype).clamp_min_(torch.finfo(dtype).tiny)
    return torch.log(u) - torch.log1p(-u)


def select_heads(scores: Tensor, n_heads: int, strategy: str) -> Tensor:
    """Selected candidates per task in output-slot order: (T, H') scores -> (T, H) long.

    * ``subset`` (the paper's Eq. 5): the H highest scores, ordered by their out_proj slot c mod H,
      then by index (each candidate feeds its own slot, :func:`merge_slots`; an aligned subset, one
      candidate per slot, then lists slot j's candidate j-th, the order of the source heads, so its
      projections are the source layer's rows in the source's order). The order no longer decides a
      slot: the paper's "sorted ascending, slot j <- the j-th smallest index" (reading B6) did, and the
      public code's order by value made the slot layout flip under tiny logit changes.
    * ``group`` (Eq. 6-7): strided groups G_g = {g, g + H, ..., g + (r − 1) H} (reading B7, as the
      public code's ``view(r, H).max(0)``); slot g <- the best member of G_g.

    Ties go to the lower index in both (a stable descending sort; ``argmax`` returns the first
    maximum), so the selection is a deterministic function of the scores. The scores are the
    noisy logits φ + ε in training and φ at evaluation: since σ(· / τ) is increasing, ranking the
    logits is ranking the posteriors σ((φ + ε) / τ) for any τ, without ties from saturation."""
    T, n_cand = scores.shape
    if strategy == "subset":
        top = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :n_heads]
        return top.gather(1, ((top % n_heads) * n_cand + top).argsort(dim=-1))  # by (slot, index)
    if strategy == "group":
        member = scores.view(T, n_cand // n_heads, n_heads).argmax(dim=1)  # (T, H): r-index within each group
        return member * n_heads + torch.arange(n_heads, device=scores.device)
    raise ValueError(f"unknown head-selection strategy {strategy!r}")


def straight_through(y: Tensor) -> Tensor:
    """The straight-through weights w = 1 − stopgrad(y) + y: forward value exactly 1.0, gradient
    ∂w/∂y = 1 (so ∂w/∂φ = σ'((φ + ε)/τ)/τ). Computed as (y − stopgrad(y)) + 1, whose forward is
    exactly 1 in floating point (1 − y + y is not, for y < 0.5)."""
    return (y - y.detach()) + 1.0


#: Subset's aligned initialisation (:func:`aligned_subset_logits_`): the leading candidate of each
#: out_proj slot starts at least this far (in logit units) above every other candidate.
SUBSET_INIT_GAP = 1.0


def gumbel_noise(shape: tuple[int, ...], *, device: torch.device, dtype: torch.dtype) -> Tensor:
    """g = −log(−log u) ~ Gumbel(0, 1), u ~ U(0, 1) from the global torch RNG (one uniform per element,
    as :func:`logistic_noise`); u = 0 is nudged to the smallest normal number so that g stays finite."""
    u = torch.rand(shape, device=device, dtype=dtype).clamp_min_(torch.finfo(dtype).tiny)
    return -torch.log(-torch.log(u))


def relaxed_selection(scores: Tensor, n_heads: int, strategy: str) -> Tensor:
    """The Gumbel-softmax relaxation of :func:`select_heads` (estimator ``gumbel``): (T, H') scores
    (φ + s·g) / τ -> (T, H') weights: ``group`` a softmax within each strided group {g, g + H, ...}
    (one member per group is selected; each group's weights sum to 1), ``subset`` H · softmax over
    all H' candidates (H are selected; the weights sum to H). Their gradient reaches every candidate."""
    T, n = scores.shape
    if strategy == "group":
        return torch.softmax(scores.view(T, n // n_heads, n_heads), dim=1).reshape(T, n)
    if strategy == "subset":
        return n_heads * torch.softmax(scores, dim=-1)
    raise ValueError(f"unknown head-selection strategy {strategy!r}")


def candidate_slots(n_candidates: int, n_heads: int, device: torch.device | None = None) -> Tensor:
    """(H',) long: candidate c's ``out_proj`` slot, c mod H -- the slot of the source head it is tiled
    from (``expand_candidate_heads``), and for ``group`` the slot of its group."""
    return torch.arange(n_candidates, device=device) % n_heads


def merge_slots(ctx: Tensor, slots: Tensor, n_heads: int) -> Tensor:
    """Heads into their ``out_proj`` slots: ctx (B, K, N, dh) with slots (B, K) or (K,) long in [0, H)
    -> (B, H, N, dh), slot s the sum of the heads whose slot is s (0 where none). One head per slot gives
    exactly those heads (x + 0 = x): a group selection, an aligned subset."""
    B, K, N, dh = ctx.shape
    slots = slots.expand(B, K) if slots.dim() == 1 else slots
    return ctx.new_zeros(B, n_heads, N, dh).scatter_add(1, slots[:, :, None, None].expand(B, K, N, dh), ctx)


def aligned_subset_logits_(phi: Tensor, n_heads: int, gap: float = SUBSET_INIT_GAP) -> Tensor:
    """Subset's aligned initialisation, in place on φ (T, H') drawn U(ln 0.01, 0): per task the highest
    logit of each slot's candidates {s, s + H, ...} is raised by −ln 0.01 + ``gap``, to [gap, gap + ln 100),
    above every other candidate (< 0) by at least ``gap``. The evaluated top-H is then one candidate per
    slot: with the tiled ASR initialisation (candidate c a copy of source head c mod H) exactly the ASR
    layer. Returns φ."""
    with torch.no_grad():
        rows = torch.arange(phi.shape[0], device=phi.device)
        for slot in range(n_heads):
            members = torch.arange(slot, phi.shape[1], n_heads, device=phi.device)
            best = members[phi[:, members].argmax(dim=1)]  # (T,)
            phi[rows, best] += gap - math.log(0.01)
    return phi


def bernoulli_kl(logits: Tensor, prior: float) -> Tensor:
    """KL(Bernoulli(σ(φ)) || Bernoulli(π)) elementwise (docs/variants.md, reading B3):
    q ln(q / π) + (1 − q) ln((1 − q) / (1 − π)), q = σ(φ), with ln q = logsigmoid(φ) so that
    saturated logits stay finite. π = 1 (H' = H: every head is always selected, nothing to
    learn) gives 0 by definition instead of the infinite divergence of a degenerate prior."""
    if prior >= 1.0:
        return torch.zeros_like(logits)
    q = torch.sigmoid(logits)
    return q * (F.logsigmoid(logits) - math.log(prior)) + (1 - q) * (F.logsigmoid(-logits) - math.log1p(-prior))


def gather_heads(t: Tensor, idx: Tensor) -> Tensor:
    """Per-sample head gather: t (B, H', N, dh), idx (B, H) long -> (B, H, N, dh)."""
    return t.gather(1, idx[:, :, None, None].expand(-1, -1, t.shape[2], t.shape[3]))


def head_rows(idx: Tensor, head_dim: int) -> Tensor:
    """Row indices of the selected heads in a (H' · dh, d) projection: (T, H) -> (T, H · dh)."""
    return (idx[..., None] * head_dim + torch.arange(head_dim, device=idx.device)).flatten(-2)


def pruned_linear(x: Tensor, weight: Tensor, bias: Tensor, task: Tensor, single: int | None) -> Tensor:
    """Projection with per-task pruned weights: x (B, N, d), weight (T, H · dh, d), bias (T, H · dh).

    One task in the batch (``single``, the decoding case): a plain ``F.linear`` with that task's
    rows, i.e. exactly the cost of an H-head projection. Mixed tasks: a batched matmul with each
    sample's own rows, the same FLOPs per sample."""
    if single is not None:
        return F.linear(x, weight[single], bias[single])
    return torch.baddbmm(bias[task][:, None, :], x, weight[task].transpose(1, 2))


def set_subset_lead_(phi: Tensor, n_heads: int, lead: float) -> Tensor:
    """In place on subset logits φ (T, H'): per task, its top-H candidates (the aligned subset right after
    :func:`aligned_subset_logits_`) are set to exactly ``lead`` above the task's best other candidate,
    the others kept. The top-H selection is unchanged; only its margin is. Returns φ."""
    with torch.no_grad():
        top = phi.topk(n_heads, dim=1).indices  # (T, H)
        rest = phi.scatter(1, top, float("-inf"))
        phi.scatter_(1, top, (rest.max(dim=1, keepdim=True).values + lead).expand_as(top).contiguous())
    return phi


def set_subset_lead(model: nn.Module, lead: float) -> int:
    """:func:`set_subset_lead_` on every subset head-selection module of ``model``; how many."""
    modules = [m for m in model.modules() if isinstance(m, HeadSelection) and m.strategy == "subset"]
    for m in modules:
        set_subset_lead_(m.head_logits.data, m.n_heads, lead)
    return len(modules)


class HeadSelection:
    """Per-task selection of H out of H' candidate heads (a mixin for an ``nn.Module`` with
    ``q_proj`` / ``k_proj`` / ``v_proj`` of H' · dh rows, ``n_heads`` = H and ``head_dim`` = dh):
    the state and logic shared by the encoder's :class:`HeadSelectionAttention` and the decoder's
    ``HeadSelectionMultiheadAttention`` (lib/model/s2t_transformer.py). docs/variants.md

    * ``head_logits`` φ (tasks, H') -- one logit per task and candidate (φ(1) − φ(0) of the paper's
      Eq. 4), initialised U(ln 0.01, ln 1) as the public code; ``subset`` then raises the best
      candidate of each out_proj slot above the rest (:func:`aligned_subset_logits_`).
    * Slots: a selected candidate c feeds ``out_proj`` slot c mod H (:func:`candidate_slots`), the slot
      of the source head it is tiled from. For ``group`` that is its group's slot (the layout of
      before); for ``subset`` two selected candidates of one slot add up and a slot without any is 0
      (:func:`merge_slots`), so a selection never moves a head to another head's slot -- the paper's
      index-ordered slots (B6) reshuffled them at every change of the selection.
    * Training, ``estimator: paper`` (:meth:`sample`): one draw ε per (task, head) of this layer per
      forward pass, shared by all samples of a task; selection by rank of φ + ε (:func:`select_heads`);
      the selected heads are scaled by the straight-through weights w = 1 − sg(y) + y,
      y = σ((φ + ε) / τ). Which heads are drawn does not depend on τ (the ranking of φ + ε); τ only
      scales the gradient of φ; unselected candidates get no gradient.
    * Training, ``estimator: gumbel``: Gumbel noise g scaled by ``noise_scale`` s (annealed by the
      training loop, ``set_head_selection_noise``), selection by rank of φ + s·g as above, and every
      candidate attends: candidate c's output enters its slot scaled by w_c = hard_c − sg(y_c) + y_c with
      y = :func:`relaxed_selection` ((φ + s·g) / τ) -- forward exactly the drawn selection (unselected
      candidates × 0), backward ∂L/∂w_c = ⟨∂L/∂slot, head_c⟩ for every candidate: how the loss would
      change with c in its slot, compared with the selected one through the softmax. Costs H' heads of
      attention in training (H at evaluation, pruned as for ``paper``).
    * Evaluation (:meth:`eval_selection`): no noise, selection by φ; the gathered q/k/v rows of
      each task's selected heads are cached (:meth:`pruned_projections`) and only those H heads are
      projected and attended (``pruned_inference``; False = project all H' then gather, the
      reference the tests compare with).
    * :meth:`kl`: per-head KL of Bernoulli(σ(φ)) to the prior p(z = 1) = H / H' (reading B2).

    ``tau`` is a plain attribute (set each update by ``set_head_selection_tau``), not state: the
    training loop's schedule recomputes it on resume. ``computed_heads`` reports how many heads per
    sample the last forward pass projected (H' in training, H at pruned evaluation).
    """

    n_heads: int
    head_dim: int
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear

    def _init_head_selection(self, *, strategy: str, candidates: int, tasks: int, key: str,
                             estimator: str = "paper") -> None:
        opts = head_selection_options(strategy=strategy, candidates=candidates, tasks=tasks,
                                      n_heads=self.n_heads, estimator=estimator, key=key)
        self.strategy: str = opts["strategy"]
        self.candidates: int = opts["candidates"]
        self.tasks: int = opts["tasks"]
        self.estimator: str = opts["estimator"]
        self.tau: float = DEFAULT_HEAD_SELECTION_TAU
        self.noise_scale: float = 1.0  # s of the gumbel estimator (set each update by set_head_selection_noise)
        self.pruned_inference: bool = True
        self.computed_heads: int = 0
        self.last_selection: Tensor | None = None  # (tasks, H) of the last training forward pass
        self._pruned: tuple[tuple, tuple[Tensor, ...]] | None = None
        self.head_logits = nn.Parameter(torch.empty(self.tasks, self.candidates).uniform_(math.log(0.01), 0.0))
        if self.strategy == "subset":
            aligned_subset_logits_(self.head_logits.data, self.n_heads)

    @property
    def prior(self) -> float:
        """π = p(z = 1) = H / H' (the paper prints H'/H, a typo; reading B2)."""
        return self.n_heads / self.candidates

    def task_ids(self, task: Tensor | None, batch: int, device: torch.device) -> Tensor:
        """(B,) long task ids; None is task 0 for a single-task model and an error otherwise."""
        if task is None:
            if self.tasks == 1:
                return torch.zeros(batch, dtype=torch.long, device=device)
            raise ValueError(f"head selection with {self.tasks} tasks needs task ids (model.encode(..., task=...))")
        if task.shape != (batch,):
            raise ValueError(f"task ids must have shape ({batch},), got {tuple(task.shape)}")
        return task.to(device=device, dtype=torch.long)

    def sample(self, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Training draw: selected candidates (tasks, H) in :func:`select_heads` order and the
        straight-through weights w. ``paper``: w (tasks, H) of the selected heads (value 1.0, gradient
        σ'((φ + ε)/τ)/τ into φ of the selected heads), ε logistic. ``gumbel``: w (tasks, H') of every
        candidate (value exactly 1.0 selected, 0.0 not; gradient that of :func:`relaxed_selection`
        ((φ + s·g)/τ), which reaches every candidate), g Gumbel, s = ``noise_scale``. ``noise``
        (tasks, H'), ε or g, replaces the draw from the global RNG (tests)."""
        phi = self.head_logits
        gumbel = self.estimator == "gumbel"
        if noise is None:
            noise = (gumbel_noise if gumbel else logistic_noise)(tuple(phi.shape), device=phi.device, dtype=phi.dtype)
        if not gumbel:
            z = phi + noise.to(phi.dtype)
            idx = select_heads(z.detach(), self.n_heads, self.strategy)
            w = straight_through(torch.sigmoid(z / self.tau)).gather(1, idx)
        else:
            z = phi + self.noise_scale * noise.to(phi.dtype)
            idx = select_heads(z.detach(), self.n_heads, self.strategy)
            y = relaxed_selection(z / self.tau, self.n_heads, self.strategy)
            w = (y - y.detach()) + torch.zeros_like(y).scatter_(1, idx, 1.0)  # forward exactly 0 / 1
        self.last_selection = idx
        return idx, w

    def eval_selection(self) -> Tensor:
        """Deterministic selection by φ (no noise): (tasks, H) long, slot order."""
        return select_heads(self.head_logits.detach(), self.n_heads, self.strategy)

    def kl(self) -> Tensor:
        """(tasks, H') Bernoulli KL of the posterior σ(φ) to the prior π = H / H'."""
        return bernoulli_kl(self.head_logits, self.prior)

    def _cache_key(self) -> tuple:
        params = (self.head_logits, self.q_proj.weight, self.q_proj.bias, self.k_proj.weight, self.k_proj.bias,
                  self.v_proj.weight, self.v_proj.bias)
        return (torch.is_inference_mode_enabled(),) + tuple(
            (p.data_ptr(), p._version, p.dtype, p.device) for p in params)

    def pruned_projections(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(Wq, bq, Wk, bk, Wv, bv): each task's selected rows, weights (tasks, H · dh, d) and
        biases (tasks, H · dh). Cached while nothing they depend on changes: the cache is dropped
        by ``train()``, and keyed on the parameters' version counters (an optimizer step or
        ``load_state_dict`` bumps them) and storage. With autograd recording the rows are gathered
        afresh (differentiable, nothing cached)."""
        key = self._cache_key()
        if self._pruned is not None and self._pruned[0] == key and not torch.is_grad_enabled():
            return self._pruned[1]  # type: ignore[return-value]
        rows = head_rows(self.eval_selection(), self.head_dim)  # (tasks, H * dh)
        out = tuple(t for proj in (self.q_proj, self.k_proj, self.v_proj) for t in (proj.weight[rows], proj.bias[rows]))
        if not torch.is_grad_enabled():
            self._pruned = (key, out)
        return out  # type: ignore[return-value]

    def project_pruned(self, x: Tensor, task: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Only the selected heads of each sample's task: x (B, N, d) -> q, k, v (B, H, N, dh)."""
        lo, hi = torch.stack([task.min(), task.max()]).tolist()
        single = int(lo) if lo == hi else None
        wq, bq, wk, bk, wv, bv = self.pruned_projections()
        B, N, _ = x.shape

        def split(t: Tensor) -> Tensor:
            return t.view(B, N, self.n_heads, self.head_dim).transpose(1, 2)

        return tuple(split(pruned_linear(x, w, b, task, single)) for w, b in ((wq, bq), (wk, bk), (wv, bv)))  # type: ignore[return-value]

    def train(self, mode: bool = True):  # noqa: ANN201 (nn.Module.train's signature)
        self._pruned = None
        return super().train(mode)  # type: ignore[misc]

    def selection_repr(self) -> str:
        return (f"strategy={self.strategy}, candidates={self.candidates}, tasks={self.tasks}, tau={self.tau}"
                + (f", estimator={self.estimator}, noise_scale={self.noise_scale}" if self.estimator != "paper" else ""))

    def slot_merge(self, ctx: Tensor, idx: Tensor) -> Tensor:
        """ctx (B, H, N, dh) of the selected heads idx (B, H) -> the H out_proj slots: unchanged for
        ``group`` (the selected head of group g already sits in slot g), :func:`merge_slots` by c mod H
        for ``subset``."""
        if self.strategy == "group":
            return ctx
        return merge_slots(ctx, idx % self.n_heads, self.n_heads)

    def all_candidates(self, ctx: Tensor, w: Tensor, task: Tensor) -> Tensor:
        """The ``gumbel`` estimator's merge: ctx (B, H', N, dh) of every candidate, w (tasks, H') ->
        (B, H, N, dh), candidate c × w_c into slot c mod H."""
        slots = candidate_slots(self.candidates, self.n_heads, ctx.device)
        return merge_slots(ctx * w[task][:, :, None, None], slots, self.n_heads)


@register_attention("head_select")
class HeadSelectionAttention(HeadSelection, SelfAttention):
    """Encoder self-attention with per-task head selection (Gong et al. 2021;
    docs/variants.md): H of H' candidate heads per task (target language id), strategies
    ``subset`` and ``group`` (see :func:`select_heads`), Gumbel-sigmoid latent variables with the
    straight-through estimator in training, deterministic and pruned at evaluation (the logic is
    :class:`HeadSelection`'s).

    Spec keys: ``strategy``, ``candidates`` (H'), ``tasks``, ``window`` (None = full attention over
    the selected heads, else local attention with that window: the MAY of docs/variants.md).

    Parameters: q/k/v_proj map d -> H' · dh (``proj_heads = H'``), ``out_proj`` H · dh -> d, plus the
    variant-only ``head_logits`` (tasks, H'). An H-head checkpoint (the ASR encoder) loads with
    ``S2TTransformer.load_encoder_from(..., expand_candidate_heads=True)``: candidate j <- head
    j mod H, after which any group selection reproduces the source layer exactly.

    Forward for a sample of task t: x^(h) = softmax(q_h k_h^T / sqrt(dh) + pad) v_h for the selected
    h in slot order, scaled by w (training; 1 at evaluation), concatenated, ``out_proj``.
    Training projects all H' candidates and gathers each sample's H heads by its task before the
    attention (cost: H heads of attention, H' of projections); evaluation projects only the H
    selected rows (pruned: the cost of a plain H-head layer for any H'). Mixed-task batches give
    each sample what it gets alone; ``need_weights`` returns the selected heads' weights
    (B, H, N, N) in slot order (what was merged).

    Where this code departs from the paper (and from its public code): no noise and real
    pruning at inference (reading B8); subset slots by candidate, c mod H, instead of index order (B6,
    :func:`merge_slots`); strided groups (B7); prior
    H / H' (B2); exact Bernoulli KL (B3). ``rel_pos_max`` (a diagnostic control) is not implemented.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float,
        *,
        strategy: str,
        candidates: int,
        tasks: int,
        estimator: str = "paper",
        window: int | None = None,
        rel_pos_max: int = 0,
    ) -> None:
        if rel_pos_max:
            raise ValueError("head_select: the relative-position bias (model.overrides.rel_pos_bias) is not "
                             "implemented for head selection")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1
                                   or window % 2 == 0):
            raise ValueError(f"head_select.window: must be a positive odd integer or None, got {window!r}")
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"head_select.candidates: must be a positive integer, got {candidates!r}")
        super().__init__(d_model, n_heads, dropout, proj_heads=candidates)
        self.window: int | None = window
        self._init_head_selection(strategy=strategy, candidates=candidates, tasks=tasks, key="head_select",
                                  estimator=estimator)

    def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
        """The attention core on the *selected* heads (q, k, v (B, H, N, dh)): full attention (SDPA
        fast path) or local attention with ``window``, the very code of those variants."""
        plain = FullAttention if self.window is None else LocalAttention
        return plain.attend(self, q, k, v, key_padding_mask, need_weights=need_weights)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None,
        *,
        prev_attn: Tensor | None = None,
        task: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        task = self.task_ids(task, x.shape[0], x.device)
        w: Tensor | None = None
        if self.training and self.estimator == "gumbel":  # every candidate attends, × its 0 / 1 weight
            q, k, v = self._project(x)  # (B, H', N, dh)
            sel, w = self.sample()
            ctx, weights = self.attend(q, k, v, key_padding_mask, need_weights=need_weights)
            ctx = self.all_candidates(ctx, w, task)
            if weights is not None:
                weights = gather_heads(weights, sel[task])
            self.computed_heads = self.candidates
        else:
            if self.training or not self.pruned_inference:
                q, k, v = self._project(x)  # (B, H', N, dh)
                sel, w = self.sample() if self.training else (self.eval_selection(), None)
                idx = sel[task]  # (B, H)
                q, k, v = gather_heads(q, idx), gather_heads(k, idx), gather_heads(v, idx)
                self.computed_heads = self.candidates
            else:
                q, k, v = self.project_pruned(x, task)  # (B, H, N, dh)
                idx = self.eval_selection()[task] if self.strategy == "subset" else None
                self.computed_heads = self.n_heads
            ctx, weights = self.attend(q, k, v, key_padding_mask, need_weights=need_weights)
            if w is not None:
                ctx = ctx * w[task][:, :, None, None]
            if idx is not None:
                ctx = self.slot_merge(ctx, idx)
        out = self.out_proj(self._merge(ctx))
        if not need_weights:
            return AttentionOutput(out=out, weights=None, carry=None)
        return AttentionOutput(out=out, weights=weights, carry=weights)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.selection_repr()}" + (
            f", window={self.window}" if self.window is not None else "")


def set_head_selection_noise(model: nn.Module, scale: float) -> int:
    """Set the Gumbel noise scale s of every head-selection module in ``model`` (the ``gumbel``
    estimator's; the training loop calls it once per update with its schedule's value,
    lib.train.objectives.head_selection_noise); returns how many modules were set. s >= 0."""
    if not scale >= 0:
        raise ValueError(f"head-selection noise scale must be >= 0, got {scale!r}")
    return _set_on_head_selection(model, "noise_scale", float(scale))


def _set_on_head_selection(model: nn.Module, attr: str, value: float) -> int:
    """Set ``attr`` on every head-selection module of ``model``; how many were set."""
    modules = [m for m in model.modules() if isinstance(m, HeadSelection)]
    for m in modules:
        setattr(m, attr, value)
    return len(modules)


#: Names of the attention variants' own parameters (head-selection logits, band-prior logits, the
#: predicted gate's vector and bias): lib.train.loop.make_optimizer gives them a group of their own at
#: ``variant_lr``, outside the encoder's lr scaling and without weight decay.
VARIANT_PARAMETER_NAMES = ("head_logits", "band_logits", "gate_vector", "gate_bias")


def variant_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every parameter of ``model`` whose own name is one of
    :data:`VARIANT_PARAMETER_NAMES`, in ``named_parameters`` order (empty for the plain models)."""
    return [(name, p) for name, p in model.named_parameters() if name.rsplit(".", 1)[-1] in VARIANT_PARAMETER_NAMES]


def set_head_selection_tau(model: nn.Module, tau: float) -> int:
    """Set the Gumbel-sigmoid temperature τ of every head-selection module in ``model`` (the
    training loop calls it once per update with its schedule's value); returns how many modules
    were set. τ > 0 (ValueError otherwise)."""
    if not tau > 0:
        raise ValueError(f"head-selection temperature must be > 0, got {tau!r}")
    return _set_on_head_selection(model, "tau", float(tau))


# Keyword parameters of the base constructor are not spec keys (d_model / n_heads / dropout /
# rel_pos_max come from the model config; proj_heads is a variant-internal detail).
_BASE_PARAMS = frozenset(inspect.signature(SelfAttention.__init__).parameters)


def _spec_params(cls: type[SelfAttention]) -> tuple[set[str], set[str]]:
    """(allowed, required) spec keys of a variant = its extra ``__init__`` keyword params."""
    allowed: set[str] = set()
    required: set[str] = set()
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name in _BASE_PARAMS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        allowed.add(name)
        if p.default is inspect.Parameter.empty:
            required.add(name)
    return allowed, required


def build_attention(spec: dict, d_model: int, n_heads: int, dropout: float, *, rel_pos_max: int = 0) -> SelfAttention:
    """Build one attention module from ``{"type": name, **variant_kwargs}`` (``rel_pos_max``: the
    model-level relative-position-bias control, 0 = off).

    Raises ValueError naming an unknown type, unknown keys or missing required keys.
    """
    if not isinstance(spec, dict):
        raise ValueError(f"attention spec must be a dict, got {type(spec).__name__}: {spec!r}")
    if "type" not in spec:
        raise ValueError(f"attention spec {spec!r} has no 'type' key")
    kind = spec["type"]
    if kind not in ATTENTION_VARIANTS:
        raise ValueError(
            f"unknown attention type {kind!r}; known: {sorted(ATTENTION_VARIANTS)}"
        )
    cls = ATTENTION_VARIANTS[kind]
    params = {key: val for key, val in spec.items() if key != "type"}
    allowed, required = _spec_params(cls)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} for attention type {kind!r}; allowed: {sorted(allowed)}"
        )
    missing = sorted(required - set(params))
    if missing:
        raise ValueError(f"missing key(s) {missing} for attention type {kind!r}")
    if rel_pos_max:
        params["rel_pos_max"] = rel_pos_max
    return cls(d_model, n_heads, dropout, **params)
