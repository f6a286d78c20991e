"""Exact, centred sliding-window ("local") attention that skips the off-band work.

This is the local self-attention of Alastruey et al. (2022), "On the Locality of
Attention in Direct Speech Translation": query ``i`` attends exactly to the keys
``j`` with ``|i - j| <= (w - 1) / 2`` (``w`` odd, so the window is centred on the
diagonal; ``w = 1`` is the main diagonal only), restricted to non-padding keys.

Algorithm (sliding blocks)
--------------------------
Let ``h = (w - 1) // 2``.  The S = B*H sequences are viewed end to end as one flat
``(R, dh)`` array (``R = S*N``, a free reshape) and cut into ``G = ceil(R / blk)``
query blocks of ``blk`` rows.  The keys block ``g`` can need form one contiguous
*window* of ``L = blk + w - 1`` flat rows, ``[g*blk - h, g*blk + blk + h)``, so all
windows are a single overlapping ``as_strided`` view ``(G, L, dh)`` of K (or V)
that ``torch.bmm`` consumes without copying; only the few blocks at the two ends of
the flat array (windows poking outside [0, R)) use a small zero-padded copy
(``_Plan.pieces``).  Each block of queries is multiplied against its window only:
scores ``(G, blk, L)``, i.e. O(B*H*N*(blk + w - 1)) work and memory instead of
O(B*H*N^2).

Inside a window, query row ``r`` (flat ``i = g*blk + r``) and column ``c`` (flat key
``j = g*blk + c - h``) satisfy ``|i - j| <= h  <=>  r <= c <= r + w - 1``: the same
``(blk, L)`` band for every block, which keeps the window exactly centred.  It is
combined with "same sequence" (``i // N == j // N``; windows that straddle two
sequences of the flat array see the neighbour's rows, masked here), ``0 <= j < R``
and "key not padding" into one ``(G, blk, L)`` bool mask.  Masked scores are filled
with a finite large negative number (``finfo.min / 2``, never -inf), the softmax is
taken over the window, and masked probabilities are then set to exactly 0.  A
query whose whole window is masked (a padded frame far from any real frame)
therefore gets an all-zero probability row, a zero output and no gradient, and
padded keys/values never receive gradient (their probabilities are exactly 0 in
the forward and their score-gradients are exactly 0 in the backward).

The backward is hand-written (``_LocalAttentionFn``): with ``P`` the saved
probabilities, ``dP = dO @ V_win^T``, ``dS = P * (dP - rowsum(dO * O))`` (the
flash-attention identity, valid with dropout too), ``dQ = dS @ K_win``, and the
window gradients ``dK_win = dS^T @ Q``, ``dV_win = P_drop^T @ dO`` are folded back
onto the flat sequence without materialising them (``_fold_matmul``: the first
``blk`` columns of every window tile the sequence exactly and are written by one
batched matmul straight into the gradient buffer; the ``w - 1`` halo columns are
added with a shifted strided add).  Nothing of size N x N is created in either
pass; besides the inputs and the output, only P ``(G, blk, L)`` (and, with dropout,
its bool keep-mask) is saved for backward.

When ``w >= 2N - 1`` every window covers the whole sequence and the call is plain
full attention; it is dispatched to ``torch.nn.functional.scaled_dot_product_attention``
with the key padding mask (still exact) unless dropout-with-generator or
``return_weights`` is requested, in which case the window is clamped to ``2N - 1``
(identical result) and the blocked path is used.

Short sequences in 16-bit on CPU (:func:`dense_band_is_cheaper`): the blocks are small matmuls whose
fixed costs dominate, and bf16 matmuls gain little on them, so there the same band is cheaper as a
dense masked (N, N) score matrix: :class:`lib.model.attention.LocalAttention` takes that path then
(same math, other rounding; fp32 on CPU always uses the blocked kernel).

On CUDA the blocked kernel is slower than full attention, and two exact paths take its place
(section "CUDA paths" at the end of this module; docs/gpu.md): FlashAttention-2 with a sliding window
on the encoder's packed (varlen) layout in bf16 / fp16, and SDPA with a band-and-padding boolean mask
otherwise. :func:`attention_path` decides per call. The blocked kernel stays the CPU path, the
``need_weights`` path and the reference.

``band_mask`` and ``banded_reference`` are dense O(N^2) helpers: the ground truth
for tests and benchmarks, never used by ``local_attention`` itself.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["local_attention", "band_mask", "banded_reference", "choose_block_size", "dense_band_is_cheaper",
           "DENSE_BAND_MAX_LEN", "ATTENTION_PATHS", "attention_path"]


# ----------------------------------------------------------------------------- helpers

# Longest sequence for which a 16-bit local-attention layer on CPU is computed as a dense band-masked
# score matrix rather than by the blocked kernel (:func:`dense_band_is_cheaper`). One thread, demo
# shapes (d = 256, 4 heads, ~800 positions per batch), attention module forward + backward, blocked
# / dense time (`python benchmarks/local_dense_crossover.py`, 2-core AMD EPYC, w = 3 / 9
# / 21): bf16 1.22-1.43 at N = 50, 1.10-1.28 at N = 100, 0.90-1.08 at N = 150, 0.89-1.02 at N = 200,
# 0.68-0.78 at N = 400; fp32 1.04-1.11 at N = 50 but 0.91-0.94 at N = 100, so fp32 keeps the kernel.
DENSE_BAND_MAX_LEN = 128


def dense_band_is_cheaper(n: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a local-attention layer over ``n`` positions should use the dense band-masked path:
    on CPU, in bf16 / fp16, for ``n <= DENSE_BAND_MAX_LEN`` (measured crossover above). The demo's
    encoder sequences (N ~ 75-130) take it in bf16; MuST-C's (mean 166, up to 1052) mostly do not."""
    return device.type == "cpu" and dtype in (torch.bfloat16, torch.float16) and n <= DENSE_BAND_MAX_LEN


def _check_window(window: int) -> int:
    if isinstance(window, bool) or not isinstance(window, int):
        try:
            iw = int(window)
        except (TypeError, ValueError):
            raise ValueError(f"window must be an odd positive integer, got {window!r}") from None
        if iw != window:
            raise ValueError(f"window must be an odd positive integer, got {window!r}")
        window = iw
    if window < 1 or window % 2 == 0:
        raise ValueError(f"window must be an odd positive integer (>= 1), got {window!r}")
    return window


def _neg_big(dtype: torch.dtype) -> float:
    """Finite large negative fill value for masked scores (never -inf)."""
    return torch.finfo(dtype).min / 2


def choose_block_size(n: int, window: int, block_size: int | None = None) -> int:
    """Query-block size used for a sequence of length ``n`` and window ``window``.

    Each query costs ``blk + w - 1`` key columns (its block's window), so small blocks
    waste less work on the halo but make more, smaller matmuls.  Auto (``None``):
    ``blk = max(16, w - 1)`` -- the halo never exceeds the block, and 16 was the sweet
    spot on a 2-core CPU for dh = 64 (16..32 within noise for w <= 25).  An explicit
    ``block_size`` is used as given (any value is exact).  Never more than ``n``.
    """
    if block_size is None:
        block_size = max(16, window - 1)
    elif isinstance(block_size, bool) or int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    return max(1, min(n, int(block_size)))


class _Plan:
    """Geometry of the flat blocking.

    All S = B*H sequences are laid end to end as R = S*N rows of (R, dh) and cut into
    G = ceil(R / blk) query blocks of blk rows.  Window g covers the flat key rows
    [g*blk - h, g*blk - h + L), L = blk + w - 1.  Blocks split into at most three
    *pieces* of consecutive blocks: the interior, whose queries and windows lie inside
    [0, R) (zero-copy strided views of q/k/v), and the two edges (a few blocks whose
    rows are copied into small zero-padded buffers).
    """

    def __init__(self, S: int, N: int, window: int, blk: int):
        self.S, self.N, self.window, self.blk = S, N, window, blk
        self.h = h = (window - 1) // 2
        self.L = blk + window - 1
        self.R = R = S * N
        self.G = G = -(-R // blk)
        self.T = -(-self.L // blk)  # block-sized chunks per window (fold)
        g_lo = min(G, -(-h // blk))  # first block whose window starts at row >= 0
        g_hi = (R - blk - h) // blk + 1 if R - blk - h >= 0 else 0  # windows end <= R
        g_hi = max(g_lo, min(G, g_hi))
        self.pieces = [(a, b) for a, b in ((0, g_lo), (g_lo, g_hi), (g_hi, G)) if b > a]

    def q_piece(self, xf: Tensor, g0: int, g1: int) -> Tensor:
        """Query-aligned rows of blocks [g0, g1): (n, blk, d); a view unless past row R."""
        blk, d = self.blk, xf.shape[-1]
        lo, hi = g0 * blk, g1 * blk
        if hi <= self.R:
            return xf[lo:hi].view(g1 - g0, blk, d)  # (n, blk, d)
        buf = xf.new_zeros((hi - lo, d))
        buf[: self.R - lo] = xf[lo:]
        return buf.view(g1 - g0, blk, d)  # (n, blk, d), zero rows past R

    def w_piece(self, xf: Tensor, g0: int, g1: int) -> Tensor:
        """Key/value windows of blocks [g0, g1): (n, L, d), an overlapping strided view.

        Flat rows [g0*blk - h, g1*blk + h); rows outside [0, R) read as zeros (edge
        pieces only, via a small copy) -- they are always masked anyway.
        """
        blk, h, R = self.blk, self.h, self.R
        lo, hi = g0 * blk - h, g1 * blk + h
        if lo >= 0 and hi <= R:
            buf = xf[lo:hi]  # (rows, d) view
        else:
            buf = xf.new_zeros((hi - lo, xf.shape[-1]))
            a, b = max(lo, 0), min(hi, R)
            if b > a:
                buf[a - lo : b - lo] = xf[a:b]
        return _windows(buf, g1 - g0, blk, self.L)

    def allowed(self, key_padding_mask: Tensor | None, H: int, device) -> Tensor:
        """Bool mask of the window scores, True = attend: (G, blk, L).

        Query row i = g*blk + r and key row j = g*blk + c - h (flat indices) may
        interact iff r <= c <= r + w - 1 (the centred band, |i - j| <= h), 0 <= j < R,
        i and j belong to the same sequence (i // N == j // N; this also kills the
        tail queries i >= R) and key j is not padding.
        """
        G, blk, L, h, N, R = self.G, self.blk, self.L, self.h, self.N, self.R
        r = torch.arange(blk, device=device)
        c = torch.arange(L, device=device)
        band = (c[None, :] >= r[:, None]) & (c[None, :] <= r[:, None] + self.window - 1)  # (blk, L)
        start = torch.arange(G, device=device) * blk  # (G,)
        seq_q = (start[:, None] + r[None, :]) // N  # (G, blk)
        j = start[:, None] + c[None, :] - h  # (G, L) flat key rows
        inside = (j >= 0) & (j < R)
        jc = j.clamp(0, R - 1)
        ok = inside
        if key_padding_mask is not None:
            B = key_padding_mask.shape[0]
            not_pad = (~key_padding_mask)[:, None, :].expand(B, H, N).reshape(R)  # (R,)
            ok = ok & not_pad[jc]
        seq_k = torch.where(ok, jc // N, -1)  # (G, L); -1 never matches a query
        return (seq_q[:, :, None] == seq_k[:, None, :]) & band  # (G, blk, L)


def _windows(buf: Tensor, G: int, blk: int, L: int) -> Tensor:
    """Overlapping windows as a strided *view*: (>= (G-1)*blk + L, d) -> (G, L, d).

    Window g = rows [g*blk, g*blk + L).  torch.bmm consumes this overlapping-batch
    view directly (no copy).
    """
    d = buf.shape[-1]
    s_row, s_col = buf.stride()
    return buf.as_strided((G, L, d), (blk * s_row, s_row, s_col), buf.storage_offset())


def _unused_input(a: Tensor, n: int, m: int, p: int) -> Tensor:
    """A free (n, m, p) zero view for ``baddbmm(..., beta=0)``, which ignores its input."""
    return a.new_zeros(()).expand(n, m, p)


def _fold_matmul(A: Tensor, xs: list[tuple[int, int, Tensor]], plan: _Plan, alpha: float) -> Tensor:
    """Window gradients folded onto the flat sequence, without a (G, L, d) temporary.

    Computes out[j] = alpha * sum_{g, r, c: g*blk + c - h = j} A[g, r, c] * X[g, r]
    for j in [0, R), i.e. the adjoint of the window view applied to A^T @ X, with
    A: (G, blk, L) and X given by pieces (g0, g1, (n, blk, d)).  Returns (R, d).

    Buffer row g*blk + c holds key j = g*blk + c - h.  Column chunk t (columns
    [t*blk, (t+1)*blk)) of every window lands on rows [(g+t)*blk, ...): for t = 0 the
    pieces tile rows [0, G*blk) exactly, so A[:, :, :blk]^T @ X is written straight into
    the buffer; the halo chunks t >= 1 (usually one, w - 1 rows) go through a small
    temporary and a strided add.
    """
    G, blk, L, T = plan.G, plan.blk, plan.L, plan.T
    d = xs[0][2].shape[-1]
    buf = A.new_empty(((G + T - 1) * blk, d))
    for g0, g1, X in xs:
        n = g1 - g0
        dst = buf[g0 * blk : g1 * blk].view(n, blk, d)  # (n, blk, d), contiguous
        torch.baddbmm(_unused_input(A, n, blk, d), A[g0:g1, :, :blk].transpose(1, 2), X,
                      beta=0.0, alpha=alpha, out=dst)
    buf[G * blk :].zero_()
    for t in range(1, T):
        c0, c1 = t * blk, min(L, (t + 1) * blk)
        for g0, g1, X in xs:
            n = g1 - g0
            tmp = torch.baddbmm(_unused_input(A, n, c1 - c0, d), A[g0:g1, :, c0:c1].transpose(1, 2), X,
                                beta=0.0, alpha=alpha)  # (n, c1-c0, d)
            buf[(g0 + t) * blk : (g1 + t) * blk].view(n, blk, d)[:, : c1 - c0] += tmp
    return buf[plan.h : plan.h + plan.R]  # (R, d), contiguous view


def _band_gather(P: Tensor, window: int) -> Tensor:
    """Banded weights (..., blk, w) from window probabilities (..., blk, L), as a view.

    Row r of a window holds its band in columns r .. r+w-1, i.e. a diagonal strip:
    a strided view with row stride L + 1.  P must be contiguous.
    """
    *lead, blk, L = P.shape
    size = (*lead, blk, window)
    stride = (*P.stride()[:-2], P.stride(-2) + P.stride(-1), P.stride(-1))
    return P.as_strided(size, stride, P.storage_offset())


# ----------------------------------------------------------------------------- autograd


class _LocalAttentionFn(torch.autograd.Function):
    """Blocked sliding-window attention with a hand-written backward.

    Saved for backward: q, k, v (the caller's tensors, no copies), the output O
    (B,H,N,dh), the window probabilities P (G,blk,L) and, with dropout, the bool
    keep-mask (G,blk,L): O(B*H*N*(blk+w-1)) extra memory.
    """

    @staticmethod
    def forward(ctx, q, k, v, key_padding_mask, window, blk, dropout_p, generator, want_weights):
        B, H, N, dh = q.shape
        plan = _Plan(B * H, N, window, blk)
        G, L, R = plan.G, plan.L, plan.R
        scale = 1.0 / math.sqrt(dh)
        qf, kf, vf = q.reshape(R, dh), k.reshape(R, dh), v.reshape(R, dh)  # (R, dh) views if contiguous

        P = q.new_empty((G, blk, L))  # scaled scores, then probabilities
        for g0, g1 in plan.pieces:
            n = g1 - g0
            torch.baddbmm(_unused_input(P, n, blk, L), plan.q_piece(qf, g0, g1),
                          plan.w_piece(kf, g0, g1).transpose(1, 2), beta=0.0, alpha=scale,
                          out=P[g0:g1])  # (n, blk, L)
        blocked = ~plan.allowed(key_padding_mask, H, q.device)  # (G, blk, L)
        P.masked_fill_(blocked, _neg_big(P.dtype))  # finite, never -inf
        P = torch.softmax(P, dim=-1)  # (G, blk, L)
        P.masked_fill_(blocked, 0.0)  # exact zeros off-band / padding; fully-masked rows -> 0
        del blocked

        keep = None
        if dropout_p > 0.0:
            keep = torch.rand(P.shape, generator=generator, device=P.device, dtype=P.dtype) >= dropout_p
            Pd = P * keep * (1.0 / (1.0 - dropout_p))  # (G, blk, L)
        else:
            Pd = P
        O = q.new_empty((G * blk, dh))
        O3 = O.view(G, blk, dh)  # (G, blk, dh)
        for g0, g1 in plan.pieces:
            torch.bmm(Pd[g0:g1], plan.w_piece(vf, g0, g1), out=O3[g0:g1])  # (n, blk, dh)
        del Pd
        out = O[:R].view(B, H, N, dh)  # (B, H, N, dh)

        if want_weights:
            W = _band_gather(P, window).reshape(G * blk, window)[:R]  # (R, w)
            W = W.reshape(B, H, N, window).clone()  # (B, H, N, w)
        else:
            W = q.new_empty(0)

        ctx.save_for_backward(q, k, v, out, P, keep)
        ctx.window, ctx.blk, ctx.dropout_p, ctx.want_weights = window, blk, dropout_p, want_weights
        if not want_weights:
            ctx.mark_non_differentiable(W)
        return out, W

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dO, dW):
        q, k, v, out, P, keep = ctx.saved_tensors
        window, blk, p = ctx.window, ctx.blk, ctx.dropout_p
        B, H, N, dh = q.shape
        plan = _Plan(B * H, N, window, blk)
        G, R = plan.G, plan.R
        scale = 1.0 / math.sqrt(dh)
        qf, kf, vf = q.reshape(R, dh), k.reshape(R, dh), v.reshape(R, dh)  # (R, dh)

        if dO is None:
            dO = torch.zeros_like(out)
        dOf = dO.reshape(R, dh)  # (R, dh)
        # D_i = rowsum(P_i * dP_i) = dO_i . O_i   (holds with dropout too)
        D = (dOf * out.reshape(R, dh)).sum(-1)  # (R,)
        if G * blk != R:
            D = F.pad(D, (0, G * blk - R))
        D3 = D.view(G, blk, 1)  # (G, blk, 1)
        dO_pieces = [(g0, g1, plan.q_piece(dOf, g0, g1)) for g0, g1 in plan.pieces]  # (n, blk, dh)

        # dV = fold(P_drop^T @ dO)
        Pd = P * keep * (1.0 / (1.0 - p)) if keep is not None else P  # (G, blk, L)
        dv = _fold_matmul(Pd, dO_pieces, plan, 1.0).view(B, H, N, dh)  # (B, H, N, dh)
        del Pd

        dP = torch.empty_like(P)  # (G, blk, L)
        for g0, g1, dO3 in dO_pieces:
            torch.bmm(dO3, plan.w_piece(vf, g0, g1).transpose(1, 2), out=dP[g0:g1])  # (n, blk, L)
        del dO_pieces
        if keep is not None:
            dP.mul_(keep).mul_(1.0 / (1.0 - p))
        if ctx.want_weights and dW is not None:
            dWf = dW.reshape(R, window)  # (R, w)
            if G * blk != R:
                dWf = F.pad(dWf, (0, 0, 0, G * blk - R))
            dWb = dWf.view(G, blk, window)  # (G, blk, w)
            _band_gather(dP, window).add_(dWb)  # dP's band columns (a view into dP)
            D3 = D3 + (_band_gather(P, window) * dWb).sum(-1, keepdim=True)  # (G, blk, 1)
        dS = dP.sub_(D3).mul_(P)  # (G, blk, L); exactly 0 wherever P == 0
        del dP

        dq = q.new_empty((G * blk, dh))
        dq3 = dq.view(G, blk, dh)  # (G, blk, dh)
        for g0, g1 in plan.pieces:
            n = g1 - g0
            torch.baddbmm(_unused_input(dq, n, blk, dh), dS[g0:g1], plan.w_piece(kf, g0, g1),
                          beta=0.0, alpha=scale, out=dq3[g0:g1])  # (n, blk, dh)
        dq = dq[:R].view(B, H, N, dh)  # (B, H, N, dh)
        q_pieces = [(g0, g1, plan.q_piece(qf, g0, g1)) for g0, g1 in plan.pieces]
        dk = _fold_matmul(dS, q_pieces, plan, scale).view(B, H, N, dh)  # (B, H, N, dh)
        return dq, dk, dv, None, None, None, None, None, None


# ----------------------------------------------------------------------------- public API


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    key_padding_mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    training: bool = False,
    generator: torch.Generator | None = None,
    block_size: int | None = None,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Exact centred sliding-window attention.

    q, k, v: (B, H, N, dh); key_padding_mask: (B, N) bool, True = padding.
    Query i attends exactly to keys j with |i - j| <= (window - 1) / 2 that are not
    padding, with scores scaled by 1/sqrt(dh).  Queries whose whole window is
    padding get a zero output (and no gradient).

    Returns (B, H, N, dh); with ``return_weights`` also the banded weights
    (B, H, N, window) (before dropout) where column c is key j = i - (window-1)//2 + c
    (zeros outside the sequence / at padding).  Dropout on the attention weights is
    applied only when ``training`` and ``dropout_p > 0`` (keep-mask drawn with
    ``generator`` when given).  ``block_size`` is the query-block size (None = auto,
    see :func:`choose_block_size`; every value gives the same result).
    Score work and memory are O(B*H*N*(block + w)).
    """
    window = _check_window(window)
    if q.dim() != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"expected q, k, v of shape (B, H, N, dh); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if v.shape[-1] != q.shape[-1]:
        raise ValueError("q and v must share the head dimension")
    B, H, N, dh = q.shape
    if key_padding_mask is not None:
        if key_padding_mask.shape != (B, N):
            raise ValueError(f"key_padding_mask must be (B, N) = {(B, N)}, got {tuple(key_padding_mask.shape)}")
        key_padding_mask = key_padding_mask.to(device=q.device, dtype=torch.bool)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    p = float(dropout_p) if training else 0.0

    if N == 0:
        out = q.new_zeros((B, H, 0, dh))
        return (out, q.new_zeros((B, H, 0, window))) if return_weights else out

    w_eff = min(window, 2 * N - 1)  # a wider window sees nothing more
    if w_eff == 2 * N - 1 and not return_weights and (p == 0.0 or generator is None):
        out = _full_attention(q, k, v, key_padding_mask, p)
        return out

    blk = choose_block_size(N, w_eff, block_size)
    # The function computes in q's dtype (under autocast: the dtype autocast gave the projections)
    # with autocast off inside: CUDA's autocast would run its softmax in fp32 and then refuse the
    # out= buffers of q's dtype ("expected scalar type Float but found BFloat16", seen on an H100
    # with amp bf16). On CPU nothing changes: CPU autocast casts neither softmax nor out= calls.
    with torch.autocast(q.device.type, enabled=False):
        out, W = _LocalAttentionFn.apply(q, k.to(q.dtype), v.to(q.dtype), key_padding_mask, w_eff, blk, p,
                                         generator, return_weights)
    if not return_weights:
        return out
    if w_eff != window:  # re-centre the clamped band in the requested width
        extra = (window - w_eff) // 2
        W = F.pad(W, (extra, extra))  # (B, H, N, window)
    return out, W


def _full_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, p: float) -> Tensor:
    """Full attention via SDPA (window covers the whole sequence); exact, NaN-free."""
    if key_padding_mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    keep = ~key_padding_mask  # (B, N)
    has_key = keep.any(-1)  # (B,)
    # sequences that are entirely padding: let them attend everywhere, zero the result
    attend = (keep | ~has_key[:, None])[:, None, None, :]  # (B, 1, 1, N)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, dropout_p=p)  # (B, H, N, dh)
    if not bool(has_key.all()):
        out = out * has_key[:, None, None, None].to(out.dtype)
    return out


def band_mask(n: int, window: int, device=None) -> Tensor:
    """Dense (n, n) bool band mask, True = allowed (|i - j| <= (window-1)/2). For references/tests."""
    window = _check_window(window)
    i = torch.arange(n, device=device)
    return (i[:, None] - i[None, :]).abs() <= (window - 1) // 2


def banded_reference(
    q: Tensor, k: Tensor, v: Tensor, window: int, key_padding_mask: Tensor | None = None
) -> Tensor:
    """Ground truth: dense full attention with a band mask (O(N^2); tests/benchmarks only).

    Masked scores get a finite large negative value; masked probabilities are then
    zeroed, so rows with no allowed key give a zero output (same convention as
    :func:`local_attention`).
    """
    N, dh = q.shape[-2], q.shape[-1]
    allowed = band_mask(N, window, device=q.device)  # (N, N)
    if key_padding_mask is not None:
        allowed = allowed[None, None] & ~key_padding_mask.to(torch.bool)[:, None, None, :]  # (B, 1, N, N)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)  # (B, H, N, N)
    scores = scores.masked_fill(~allowed, _neg_big(scores.dtype))
    probs = torch.softmax(scores, dim=-1).masked_fill(~allowed, 0.0)
    return torch.matmul(probs, v)


# ----------------------------------------------------------------------------- CUDA paths
#
# On CUDA the blocked kernel above is slower than full attention (its many small matmuls; one H200,
# torch 2.11: 3.3-4.1 ms forward + backward at (B, N) = (60, 166) and (9, 1052), w = 13, against
# 0.53-0.72 ms for full SDPA with a padding mask). Two exact paths replace it there:
#
# * "flash": FlashAttention-2 with a sliding window through ``torch.ops.aten._flash_attention_forward``
#   (bf16 / fp16, head dim <= 256 and a multiple of 8), in its varlen layout: the sequences' valid rows
#   packed end to end, ``(T, H, dh)`` with cumulative lengths. The encoder packs once after its
#   subsampler and stays packed through its layers (lib/model/s2t_transformer.py); packing on every
#   call costs more than it saves. Full-attention layers take the same op with no window.
# * "sdpa_band": ``F.scaled_dot_product_attention`` with a band AND key-padding boolean mask: fp32, the
#   padded layout, and the fallback when the FA2 op is missing or refuses (warned once).
#
# :func:`attention_path` is the decision, a pure function of what it is given (tested by its table).
# The CPU keeps the blocked kernel (and the dense band for short bf16 sequences) unchanged. The two CUDA
# paths themselves (the FA2 glue, the packed layout, SDPA with a band mask) are lib/model/cuda_attention.py.

ATTENTION_PATHS = ("blocked", "dense_band", "sdpa_band", "flash")
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


def attention_path(device_type: str, dtype: torch.dtype, head_dim: int, n: int, *, need_weights: bool = False,
                   packed: bool = False, flash_available: bool = False) -> str:
    """Which kernel computes one local-attention call (``ATTENTION_PATHS``), from its facts alone.

    * ``need_weights`` (analysis) and every device but CUDA: the blocked kernel, or on CPU the dense band
      for short 16-bit sequences (:func:`dense_band_is_cheaper`) -- the CPU path of before, unchanged.
    * CUDA, ``packed`` (the encoder's varlen layout), 16-bit, head dim <= 256 and a multiple of 8, and the
      FA2 op usable (``flash_available``, :func:`flash_supported`): ``flash``.
    * any other CUDA call: ``sdpa_band`` (fp32; the padded layout, where packing per call does not pay).
    """
    if need_weights or device_type != "cuda":
        if not need_weights and dense_band_is_cheaper(n, dtype, torch.device(device_type)):
            return "dense_band"
        return "blocked"
    if packed and flash_available and dtype in FLASH_DTYPES and head_dim <= FLASH_MAX_HEAD_DIM and head_dim % 8 == 0:
        return "flash"
    return "sdpa_band"
