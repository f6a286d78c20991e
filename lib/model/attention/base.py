"""The attention interface every variant implements: masks, :class:`SelfAttention` (projections,
merge, the packed CUDA layout), the registry (:func:`register_attention`, :func:`build_attention`)
and the variants' own parameters (:func:`variant_parameters`). The package docstring
(lib/model/attention/__init__.py) walks through a forward pass and how to add a variant.
"""
from __future__ import annotations

import importlib
import inspect
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import torch
from torch import Tensor, nn

from lib.model.dropout import dropout


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
    """The one attention core (fairseq parameter names): multi-head self-attention of the pre-LN
    encoder, and the base of the decoder's role (:class:`lib.model.attention.decoder.MultiheadAttention`,
    self- and cross-attention with a cache), which shares its parameters, initialisation, head split and
    merge, and weighted sum.

    Parameters q_proj, k_proj, v_proj, out_proj (``nn.Linear(d, d, bias=True)``) have the SAME
    names in every variant and role, so a checkpoint trained with one variant loads into another with
    no key remapping. Encoder variants override only :meth:`attend`.

    Args:
        d_model: model width d.
        n_heads: number of heads H merged into the output; head width dh = d // H.
        dropout: dropout probability on the attention weights (training only).
        proj_heads: number of heads produced by the q/k/v projections (default H). Only for
            variants that select H of H' > H candidate heads (head selection); for them q/k/v
            map d -> H' * dh while out_proj still maps H * dh -> d.
    """

    #: The role a subclass serves (the registry's second key): ``encoder`` (self-attention over the
    #: frames) or ``decoder`` (:class:`lib.model.attention.decoder.MultiheadAttention` and its variants).
    role: str = "encoder"
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

    def _split(self, t: Tensor, heads: int | None = None) -> Tensor:
        """(B, N, heads * dh) -> (B, heads, N, dh); ``heads`` defaults to H."""
        B, N, _ = t.shape
        return t.view(B, N, self.n_heads if heads is None else heads, self.head_dim).transpose(1, 2)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, N, d) -> q, k, v each (B, H_proj, N, dh). Scaling is applied in ``attend``."""
        return tuple(self._split(p(x), self.proj_heads) for p in (self.q_proj, self.k_proj, self.v_proj))  # type: ignore[return-value]

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
        """Additive score bias: padding (B, 1, 1, N) plus the relative-position bias (H, N, N).

        A subclass may add its own bias here (``banded``'s band): ``full`` passes it to both of its paths
        (SDPA's ``attn_mask`` and the explicit softmax), but ``local`` reads it on its dense band path only
        (bf16, short sequences on CPU), not in the blocked kernel nor on CUDA, so a ``local`` subclass that
        overrides it computes other math by precision, length and device: override ``attend`` there."""
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
        :class:`lib.model.cuda_attention.Packing`) -> (T, d): the same projections and output projection
        as :meth:`forward`, the core by :func:`lib.model.cuda_attention.packed_attention`."""
        from lib.model.cuda_attention import packed_attention

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

#: Every attention class by (kind, role): ``("local", "encoder")``, ``("smooth", "decoder")``. One registry
#: for both roles; a kind that differs by role (smoothing, head selection) registers one class per role.
ATTENTION_VARIANTS: dict[tuple[str, str], type[SelfAttention]] = {}
ROLES = ("encoder", "decoder")


def registered_kinds(role: str = "encoder") -> list[str]:
    """The kinds registered for ``role`` so far, sorted."""
    return sorted(kind for kind, r in ATTENTION_VARIANTS if r == role)


#: A line starting ``@register_attention("kind")`` in a module's source (a class decorator at module
#: level, not an example in a docstring): how the registry finds a kind's module without importing it.
_REGISTERS = re.compile(r"""^@register_attention\(\s*["']([^"']+)["']\s*\)""", re.MULTILINE)


def unloaded_kinds() -> dict[str, str]:
    """``{kind: module}`` for every kind that a module of this package not imported yet registers, read
    from the modules' sources (nothing is imported). A variant's module registers its kind when it is
    imported, and only the stages that train a variant import it, so the DVC deps of the baseline's
    stages list no variant code and an edit to a variant retrains no baseline."""
    package = importlib.import_module(__name__.rsplit(".", 1)[0])
    out: dict[str, str] = {}
    for folder in package.__path__:
        for path in sorted(Path(folder).glob("[!_]*.py")):
            module = f"{package.__name__}.{path.stem}"
            if module not in sys.modules:
                for kind in _REGISTERS.findall(path.read_text(encoding="utf-8")):
                    out.setdefault(kind, module)
    return out


def load_variant(kind: str) -> None:
    """Import the module that registers ``kind`` when the kind is not registered yet: a process that
    meets it in a spec, or in a model file's config, without having imported its module finds it among
    the package's modules (:func:`unloaded_kinds`). There is no table of variants to extend; a new
    variant's module is found by being in this package (lib/model/attention/)."""
    if any(k == kind for k, _ in ATTENTION_VARIANTS):
        return
    module = unloaded_kinds().get(kind)
    if module is not None:
        importlib.import_module(module)


def attention_class(kind: str, role: str = "encoder") -> type[SelfAttention]:
    """The class registered for ``kind`` in ``role`` (importing an on-demand variant's module first);
    ValueError naming the kind and the known ones."""
    load_variant(kind)
    cls = ATTENTION_VARIANTS.get((kind, role))
    if cls is None:
        # the kinds registered for this role, and those of the package's modules not imported (the
        # on-demand variants, which register a class for each role)
        known = sorted(set(registered_kinds(role)) | set(unloaded_kinds()))
        where = "" if role == "encoder" else f" for the {role} role"
        raise ValueError(f"unknown attention type {kind!r}{where}; known: {known}")
    return cls


_C = TypeVar("_C", bound=type)


def register_attention(name: str) -> Callable[[_C], _C]:
    """Class decorator: ``@register_attention("local")`` adds a :class:`SelfAttention` subclass to the
    registry under ``(name, cls.role)``, so one decorator serves the encoder's and the decoder's classes."""

    def deco(cls: _C) -> _C:
        if not (isinstance(cls, type) and issubclass(cls, SelfAttention)):
            raise TypeError(f"{cls!r} is not a SelfAttention subclass")
        if cls.role not in ROLES:
            raise ValueError(f"{cls.__name__}.role must be one of {list(ROLES)}, got {cls.role!r}")
        key = (name, cls.role)
        if key in ATTENTION_VARIANTS and ATTENTION_VARIANTS[key] is not cls:
            raise ValueError(f"{cls.role} attention variant {name!r} is already registered")
        ATTENTION_VARIANTS[key] = cls
        return cls

    return deco


class VariantParameter(nn.Parameter):
    """An attention variant's own parameter (head-selection logits, band-prior logits, the predicted
    gate's vector and bias), tagged by its class: lib.train.loop.make_optimizer gives these a group of
    their own at ``variant_lr``, outside the encoder's lr scaling and without weight decay. A new
    variant creates its parameters with this class and needs no edit in the optimizer. (A subclass,
    not an attribute: ``copy.deepcopy`` and ``Module.to`` keep the class; the state dict holds plain
    tensors, so checkpoints do not change.)"""


def variant_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every :class:`VariantParameter` of ``model``, in ``named_parameters``
    order (empty for the plain models)."""
    return [(name, p) for name, p in model.named_parameters() if isinstance(p, VariantParameter)]


def renamed_parameter_key(key: str) -> str | None:
    """Today's name of an attention parameter's state-dict key that earlier versions of this code wrote,
    or None for a key of today's: head selection's logits, once the attention's own
    ``<attn>.head_logits``, are ``<attn>.selector.head_logits`` (a composed selector,
    lib.model.attention.head_selection). The one rename rule, for the selecting attention's load hook
    and for code that reads weights without ``load_state_dict``
    (:func:`lib.model.checkpoint.upgrade_state_dict`); it sits here because the baseline's stages
    never import the variant's module."""
    if key.endswith("self_attn.head_logits"):
        return key[: -len("head_logits")] + "selector.head_logits"
    return None


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
    cls = attention_class(kind, "encoder")
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
        accepts = inspect.signature(cls.__init__).parameters
        if "rel_pos_max" not in accepts and not any(p.kind is p.VAR_KEYWORD for p in accepts.values()):
            # a variant that does not take the keyword cannot have the bias: say so, not a TypeError
            raise ValueError(f"the relative-position bias (model.overrides.rel_pos_bias, a diagnostic control) is not "
                             f"implemented for attention type {kind!r}")
        params["rel_pos_max"] = rel_pos_max
    return cls(d_model, n_heads, dropout, **params)
