"""Layer-wise token contributions of a Pre-LN self-attention block (paper Eq. 3-5).

Alastruey et al. (2022), Sec. 3, adapt the contributions of Kobayashi et al. (2021) to the
Pre-LN attention block of the S2T Transformer (fairseq ``TransformerEncoderLayer`` with
``normalize_before=True``)::

    x̂_i = x_i + MHA(LN(x))_i
        = Σ_j Σ_h A^h_ij LN(x_j) W_V^h W_O^h + b + x_i                   (Eq. 3)
        = Σ_j F_i(x_j) + b                                               (Eq. 4)

    F_i(x_j) = Σ_h A^h_ij LN(x_j) W_V^h W_O^h          (+ x_i when j = i)
    C_ij     = ||F_i(x_j)||_2                                            (Eq. 5)

Conventions
-----------
* One encoder layer, one sample, no padding: ``x`` is ``(N, d)``, the layer input (the residual
  stream *before* the pre-LN); ``attn`` is ``(H, N, N)``, ``attn[h, i, j] = A^h_ij`` (query i,
  key j), the post-softmax weights the module used (eval mode, so pre-dropout = post-dropout).
  If the model ran on a padded batch, slice the sample's ``[:N]`` rows/columns first: the rows
  of ``attn`` must sum to 1 for the bias bookkeeping below to be exact.
* Weights follow ``torch.nn.Linear`` (``weight`` is ``(out, in)``, ``y = x Wᵀ + b``): ``v_weight``/
  ``v_bias`` are the value projection (fairseq ``v_proj``; for ``torch.nn.MultiheadAttention``
  ``in_proj_weight[2d:]``/``in_proj_bias[2d:]``), ``out_weight``/``out_bias`` the output
  projection. Head h owns the contiguous feature slice ``h*d_h:(h+1)*d_h`` of the value vector
  (fairseq and torch split heads this way), so ``W_V^h = v_weight[h*d_h:(h+1)*d_h].T`` and
  ``W_O^h = out_weight[:, h*d_h:(h+1)*d_h].T``.
* The layer norm is ``torch.nn.functional.layer_norm`` (biased variance, ``ln_eps`` inside the
  square root), as in fairseq/torch.

The value bias ``b_V`` (``value_bias``)
-----------------------------------------
The paper's Eq. 3 has no ``b_V``; the real projection has one. Two exact bookkeepings:

* ``"bias"`` (default; keeps Eq. 3's form): ``b_V^h`` enters every head output as
  ``Σ_j A^h_ij b_V^h W_O^h = b_V^h W_O^h`` because each attention row sums to 1, i.e. it is a
  per-row constant that no token is responsible for. It joins ``b_O`` in the bias term
  ``b = b_O + Σ_h b_V^h W_O^h = out_bias + out_weight @ v_bias`` and the token terms are
  ``F_i(x_j) = Σ_h A^h_ij LN(x_j) W_V^h W_O^h (+ x_i)`` exactly as printed.
* ``"token"``: ``b_V^h`` is added to each token's value vector before weighting,
  ``F_i(x_j) = Σ_h A^h_ij (LN(x_j) W_V^h + b_V^h) W_O^h (+ x_i)``, and ``b = b_O``.

Both satisfy ``Σ_j F_i(x_j) + b = x̂_i`` (checked in the tests against :func:`block_output`).

Normalisation (``normalize``)
-----------------------------
By default every row of C is divided by its sum, so ``Σ_j C_ij = 1``. The paper needs this:
``CL = 1 − D(w)`` is "the percentage of the total contributions that are left outside the
window" (so ``D(2N) = 1``), the main diagonal "accounts for 65% of the total contributions",
and Algorithm 1's threshold t = 0.01 is an absolute contribution share. Kobayashi et al. (2021)
likewise report contributions as per-row proportions. ``normalize=False`` returns the raw norms.

Efficient computation (:func:`contributions`)
---------------------------------------------
Write ``u^h_j = LN(x_j) W_V^h W_O^h`` (the head's value for token j mapped through its slice of
W_O; ``+ b_V^h W_O^h`` in ``"token"`` mode). Then for j ≠ i

    ||Σ_h A^h_ij u^h_j||² = Σ_{h,h'} A^h_ij A^{h'}_ij G_j[h, h'],   G_j[h, h'] = <u^h_j, u^{h'}_j>

needs only the per-token H×H Gram matrices: O(N d² + N H² d) to build them and O(N² H²) for
all pairs (H(H+3)/2 fused multiply-add passes over C, using the symmetry of G_j), never an
(N, N, d) tensor (the naive route is O(N² H d) time and O(N² d) memory).
The residual only touches the diagonal: ``||Σ_h A^h_ii u^h_i + x_i||²`` is computed directly
from the (N, d) vectors ``Σ_h A^h_ii u^h_i`` (O(N H d)). Everything runs in float64 (the Gram
identity trades a sum of squares for a sum of products, so it loses relative accuracy in
float32 when heads cancel); tiny negative squared norms from rounding are clamped at 0 before
the square root. Rows are processed in blocks of 256, so beyond the (N, N) output the extra
memory is O(H·256·N + N H d) (a float64 block of ``attn`` and the head vectors).
"""
from __future__ import annotations

import torch
from torch import Tensor
import torch.nn.functional as F_nn

__all__ = [
    "block_output",
    "contribution_bias",
    "contribution_vectors",
    "contributions",
    "contributions_naive",
    "VALUE_BIAS_MODES",
]

from lib.params import VALUE_BIAS_MODES  # noqa: E402

_DTYPE = torch.float64
_ROW_BLOCK = 256  # rows of C computed at a time by contributions()


def _check_inputs(x: Tensor, attn: Tensor, v_weight: Tensor, out_weight: Tensor, value_bias: str) -> tuple[int, int, int]:
    if value_bias not in VALUE_BIAS_MODES:
        raise ValueError(f"value_bias must be one of {VALUE_BIAS_MODES}, got {value_bias!r}")
    if x.dim() != 2:
        raise ValueError(f"x must be (N, d), got shape {tuple(x.shape)}")
    n, d = x.shape
    if attn.dim() != 3 or attn.shape[1:] != (n, n):
        raise ValueError(f"attn must be (H, N, N) with N={n}, got shape {tuple(attn.shape)}")
    h = attn.shape[0]
    if d % h != 0:
        raise ValueError(f"model dim {d} is not divisible by the number of heads {h}")
    if v_weight.shape != (d, d) or out_weight.shape != (d, d):
        raise ValueError(
            f"v_weight and out_weight must be (d, d)=({d}, {d}), got {tuple(v_weight.shape)} and {tuple(out_weight.shape)}"
        )
    return n, d, h


def _head_vectors(
    x: Tensor,
    ln_weight: Tensor,
    ln_bias: Tensor,
    ln_eps: float,
    v_weight: Tensor,
    v_bias: Tensor | None,
    out_weight: Tensor,
    n_heads: int,
    value_bias: str,
) -> Tensor:
    """``U[h, j] = (LN(x_j) W_V^h [+ b_V^h]) W_O^h``, shape (H, N, d), float64."""
    n, d = x.shape
    dh = d // n_heads
    ln = F_nn.layer_norm(x.to(_DTYPE), (d,), ln_weight.to(_DTYPE), ln_bias.to(_DTYPE), ln_eps)
    v = ln @ v_weight.to(_DTYPE).T  # (N, d)
    if value_bias == "token" and v_bias is not None:
        v = v + v_bias.to(_DTYPE)
    v_heads = v.view(n, n_heads, dh).transpose(0, 1)  # (H, N, dh)
    wo_heads = out_weight.to(_DTYPE).view(d, n_heads, dh).permute(1, 2, 0)  # (H, dh, d) = W_O^h
    return torch.bmm(v_heads, wo_heads)  # (H, N, d)


def contribution_bias(v_bias: Tensor | None, out_weight: Tensor, out_bias: Tensor | None, *, value_bias: str = "bias") -> Tensor:
    """The bias term b of Eq. 4 (not attributed to any token), float64, shape (d,).

    ``"bias"``: ``b = b_O + Σ_h b_V^h W_O^h = out_bias + out_weight @ v_bias``; ``"token"``: ``b = b_O``.
    """
    if value_bias not in VALUE_BIAS_MODES:
        raise ValueError(f"value_bias must be one of {VALUE_BIAS_MODES}, got {value_bias!r}")
    d = out_weight.shape[0]
    b = torch.zeros(d, dtype=_DTYPE, device=out_weight.device) if out_bias is None else out_bias.to(_DTYPE).clone()
    if value_bias == "bias" and v_bias is not None:
        b = b + out_weight.to(_DTYPE) @ v_bias.to(_DTYPE)
    return b


def block_output(
    x: Tensor,
    attn: Tensor,
    ln_weight: Tensor,
    ln_bias: Tensor,
    ln_eps: float,
    v_weight: Tensor,
    v_bias: Tensor | None,
    out_weight: Tensor,
    out_bias: Tensor | None,
) -> Tensor:
    """The Pre-LN attention block output ``x̂ = x + out_proj(concat_h A^h V^h)``, computed the
    standard way (``V = LN(x) W_Vᵀ + b_V``, heads split, weighted, concatenated, projected) in
    float64. Shape (N, d). Independent of the contribution bookkeeping, for the identity
    ``Σ_j F_i(x_j) + b = x̂_i``."""
    n, d, h = _check_inputs(x, attn, v_weight, out_weight, "bias")
    dh = d // h
    x64 = x.to(_DTYPE)
    ln = F_nn.layer_norm(x64, (d,), ln_weight.to(_DTYPE), ln_bias.to(_DTYPE), ln_eps)
    v = F_nn.linear(ln, v_weight.to(_DTYPE), None if v_bias is None else v_bias.to(_DTYPE))
    v_heads = v.view(n, h, dh).transpose(0, 1)  # (H, N, dh)
    ctx = torch.bmm(attn.to(_DTYPE), v_heads)  # (H, N, dh)
    ctx = ctx.transpose(0, 1).reshape(n, d)  # concat heads
    out = F_nn.linear(ctx, out_weight.to(_DTYPE), None if out_bias is None else out_bias.to(_DTYPE))
    return x64 + out


def contribution_vectors(
    x: Tensor,
    attn: Tensor,
    ln_weight: Tensor,
    ln_bias: Tensor,
    ln_eps: float,
    v_weight: Tensor,
    v_bias: Tensor | None,
    out_weight: Tensor,
    out_bias: Tensor | None,
    *,
    value_bias: str = "bias",
    residual: bool = True,
) -> tuple[Tensor, Tensor]:
    """Materialise every transformed vector: returns ``(Fv, b)`` with ``Fv[i, j] = F_i(x_j)``,
    shape (N, N, d), and the bias b (d,), both float64, so that ``Fv.sum(1) + b`` is the block
    output. O(N² d) memory: for tests and small N only."""
    n, d, h = _check_inputs(x, attn, v_weight, out_weight, value_bias)
    u = _head_vectors(x, ln_weight, ln_bias, ln_eps, v_weight, v_bias, out_weight, h, value_bias)
    fv = torch.einsum("hij,hjd->ijd", attn.to(_DTYPE), u)  # (N, N, d), possibly a permuted view
    if residual:
        fv.diagonal(dim1=0, dim2=1).add_(x.to(_DTYPE).T)  # diagonal view is (d, N)
    return fv, contribution_bias(v_bias, out_weight, out_bias, value_bias=value_bias)


def _normalize_rows(c: Tensor) -> Tensor:
    s = c.sum(dim=-1, keepdim=True)
    return c / torch.where(s > 0, s, torch.ones_like(s))


def contributions_naive(
    x: Tensor,
    attn: Tensor,
    ln_weight: Tensor,
    ln_bias: Tensor,
    ln_eps: float,
    v_weight: Tensor,
    v_bias: Tensor | None,
    out_weight: Tensor,
    out_bias: Tensor | None,
    *,
    value_bias: str = "bias",
    residual: bool = True,
    normalize: bool = True,
) -> Tensor:
    """Ground truth for :func:`contributions`: builds the (N, N, d) tensor of all F_i(x_j) and
    takes its norms. Same arguments and result (float64, (N, N))."""
    fv, _ = contribution_vectors(
        x, attn, ln_weight, ln_bias, ln_eps, v_weight, v_bias, out_weight, out_bias,
        value_bias=value_bias, residual=residual,
    )
    c = torch.linalg.vector_norm(fv, dim=-1)
    del fv
    return _normalize_rows(c) if normalize else c


def contributions(
    x: Tensor,
    attn: Tensor,
    ln_weight: Tensor,
    ln_bias: Tensor,
    ln_eps: float,
    v_weight: Tensor,
    v_bias: Tensor | None,
    out_weight: Tensor,
    out_bias: Tensor | None,
    *,
    value_bias: str = "bias",
    residual: bool = True,
    normalize: bool = True,
) -> Tensor:
    """Contribution matrix ``C[i, j] = ||F_i(x_j)||₂`` of one Pre-LN attention layer, one sample.

    Args:
        x: (N, d) layer input (residual stream before the pre-LN).
        attn: (H, N, N) attention weights the module used (post-softmax, eval mode), rows sum to 1.
        ln_weight, ln_bias, ln_eps: the pre-attention LayerNorm (``self_attn_layer_norm``).
        v_weight, v_bias: value projection, ``torch.nn.Linear`` convention ((out, in) weight).
        out_weight, out_bias: output projection, same convention (``out_bias`` is unused here: it
            is the part of the bias term b that no token owns; see :func:`contribution_bias`).
        value_bias: ``"bias"`` (default: b_V folded into b, Eq. 3 as printed) or ``"token"``
            (b_V added to each token's value vector); see the module docstring.
        residual: add x_i to F_i(x_i) (Eq. 5's j = i case). False gives the attention-only norms
            (Kobayashi et al. 2020 style, with LN).
        normalize: divide each row by its sum so ``Σ_j C_ij = 1`` (default; what D, CL and the
            threshold t of Algorithm 1 assume). Rows summing to 0 are left at 0.

    Returns:
        (N, N) float64 tensor. Never materialises an (N, N, d) tensor (see module docstring).
    """
    n, d, h = _check_inputs(x, attn, v_weight, out_weight, value_bias)
    u = _head_vectors(x, ln_weight, ln_bias, ln_eps, v_weight, v_bias, out_weight, h, value_bias)  # (H, N, d)
    gram = torch.einsum("hnd,gnd->nhg", u, u)  # (N, H, H): G_j
    # ||Σ_h a_h u_h||² = Σ_p a_p (G_pp a_p + 2 Σ_{q>p} G_pq a_q): H(H+3)/2 fused passes per block
    gram_w = gram * (2.0 - torch.eye(h, dtype=_DTYPE, device=gram.device))  # off-diagonal Gram entries doubled

    sq = torch.empty(n, n, dtype=_DTYPE, device=x.device)
    for r0 in range(0, n, _ROW_BLOCK):  # row blocks bound the float64 copy of attn to H·B·N
        r1 = min(n, r0 + _ROW_BLOCK)
        a = attn[:, r0:r1].to(_DTYPE)  # (H, B, N)
        out = sq[r0:r1]
        out.zero_()
        t = torch.empty_like(out)
        for p in range(h):
            # t = G_pp a_p + 2 Σ_{q>p} G_pq a_q  (G_j broadcast over rows i, varies with column j)
            torch.mul(a[p], gram_w[:, p, p], out=t)
            for q in range(p + 1, h):
                t.addcmul_(a[q], gram_w[:, p, q])
            out.addcmul_(a[p], t)
        del a, t

    if residual:
        a_diag = attn.diagonal(dim1=1, dim2=2).to(_DTYPE)  # (H, N): A^h_ii
        z = torch.einsum("hn,hnd->nd", a_diag, u) + x.to(_DTYPE)  # Σ_h A^h_ii u^h_i + x_i
        sq.diagonal().copy_((z * z).sum(-1))

    c = sq.clamp_(min=0.0).sqrt_()
    if normalize:
        s = c.sum(dim=-1, keepdim=True)
        c.div_(torch.where(s > 0, s, torch.ones_like(s)))
    return c
