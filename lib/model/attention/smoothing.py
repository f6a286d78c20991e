"""``smooth``: attention-weight smoothing with prior distributions (Maekaku et al. 2022; docs/variants.md)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from lib.model.config import BAND_INIT_LOGIT, SmoothingOptions, odd_window
from lib.model.attention.full import FullAttention
from lib.model.attention.local import LocalAttention
from lib.model.attention.base import AttentionOutput, SelfAttention, VariantParameter, mask_bias, register_attention
from lib.model.attention.decoder import MultiheadAttention


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
    ``gate_bias`` are variant-only (:class:`VariantParameter`: their own optimizer group,
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
        opts = SmoothingOptions.validated(prior=prior, gamma=gamma, recursive=recursive, train_only=train_only, k=k,
                                          band_outside=band_outside, per_head=per_head, gate_init=gate_init,
                                          band_init_width=band_init_width, key="smooth")
        odd_window(window, "smooth.window:", optional=True)
        if window is not None and rel_pos_max:
            raise ValueError("the relative-position bias (model.overrides.rel_pos_bias) is not implemented for "
                             "local attention (smooth.window)")
        super().__init__(d_model, n_heads, dropout, rel_pos_max=rel_pos_max)
        self.prior: str = opts.prior
        self.gamma: float | str = opts.gamma
        self.recursive: bool = opts.recursive
        self.train_only: bool = opts.train_only
        self.k: int | None = opts.k
        self.band_outside: str = opts.band_outside
        self.per_head: bool = opts.per_head
        self.window: int | None = window
        self.needs_prev_attn = self.prior == "prev"  # per instance (docs/variants.md)
        self.gate_init: float | None = opts.gate_init
        self.band_init_width: int | None = opts.band_init_width
        band_shape = (n_heads, self.k) if self.per_head else (self.k,)
        self.band_logits = VariantParameter(band_logits_init(band_shape, self.band_init_width)) \
            if self.prior == "band" else None
        self.gate_vector = VariantParameter(torch.zeros(n_heads * self.head_dim)) if self.gamma == "predicted" else None
        self.gate_bias = VariantParameter(gate_bias_init(n_heads, self.gate_init)) if self.gamma == "predicted" else None

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
            raise ValueError(f"smooth (prior: prev) got no prev_attn: the first {self.role} layer has no layer below "
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
        return self.smoothed(q, k, v, allowed, prev_attn)

    def smoothed(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor,
                 prev_attn: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """The smoothing core of both roles: A = :meth:`raw_weights` over the ``allowed`` keys, P =
        :meth:`prior_weights`, γ fixed or :meth:`gate`, A' = (1 − γ) A + γ P, ctx = dropout(A') V. Returns
        (ctx (B, H, N, dh), A', the carry to the next layer). The decoder's
        :class:`SmoothedMultiheadAttention` shares this method and the three it calls (the same functions,
        as its class attributes) and runs them on its own keys (``allowed`` = not its causal / padding
        mask)."""
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


@register_attention("smooth")
class SmoothedMultiheadAttention(MultiheadAttention):
    """Decoder attention smoothed with a prior (Maekaku et al.; docs/variants.md):
    A' = (1 - γ) A + γ P, ctx = dropout(A') V, the very code of
    :class:`lib.model.attention.SmoothedAttention` (:meth:`SmoothedAttention.smoothed`) on the decoder's keys.

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

    # the encoder's smoothing core, shared: the same functions, not copies (SmoothedAttention.smoothed)
    smoothed = SmoothedAttention.smoothed
    raw_weights = SmoothedAttention.raw_weights
    prior_weights = SmoothedAttention.prior_weights
    gate = SmoothedAttention.gate

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
        opts = SmoothingOptions.validated(prior=prior, gamma=gamma, recursive=recursive, train_only=train_only,
                                          gate_init=gate_init, key="smooth")
        self.prior: str = opts.prior
        self.gamma: float | str = opts.gamma
        self.recursive: bool = opts.recursive
        self.train_only: bool = opts.train_only
        self.window: None = None  # the keys are the causal prefix or the encoder frames (prior_weights)
        self.needs_prev_attn = self.prior == "prev"  # per instance (docs/variants.md)
        self.gate_init: float | None = opts.gate_init
        self.gate_vector = VariantParameter(torch.zeros(d_model)) if self.gamma == "predicted" else None
        self.gate_bias = VariantParameter(gate_bias_init(n_heads, self.gate_init)) if self.gamma == "predicted" else None

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
        q, k, v, mask = self._project_cached(query, memory, key_padding_mask, causal, cache)  # mask (B, 1, L, S)
        ctx, weights, carry = self.smoothed(q, k, v, ~mask, prev_attn)  # the encoder's core
        return AttentionOutput(out=self.out_proj(self._merge(ctx)), weights=weights if need_weights else None,
                               carry=carry if need_weights else None)

    def extra_repr(self) -> str:
        return (f"prior={self.prior}, gamma={self.gamma}" + (", recursive=True" if self.recursive else "")
                + (", train_only=True" if self.train_only else ""))
