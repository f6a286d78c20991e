"""Pluggable encoder self-attention: one module per kind.

``base`` (masks, the one attention core, the one registry keyed by kind and role, ``build_attention``),
``full``, ``local``, ``banded``, ``smoothing``, ``head_selection``, and ``decoder`` (the decoder's role:
the same core with cross-attention, the causal mask and an incremental cache; ``smooth`` and
``head_select`` register a decoder class each, with the same decorator). Importing this package
imports the plain kinds; a variant's module is imported by the code that uses it, or on demand when a
spec names a kind not registered yet (``base.load_variant`` finds its module among the package's sources).
Each name below is re-exported.

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
keys as keyword arguments of ``__init__`` (plus ``rel_pos_max``, the relative-position bias
control, which it passes on or refuses) and registers itself with ``@register_attention("name")``,
the name a string literal at the start of the line (how ``base.load_variant`` finds its module;
docs/architecture.md has the rest). Example (the local-attention variant)::

    @register_attention("local")
    class LocalAttention(SelfAttention):
        def __init__(self, d_model, n_heads, dropout, *, window: int, rel_pos_max: int = 0) -> None:
            if rel_pos_max:
                raise ValueError("the relative-position bias is not implemented for local attention")
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

from lib.model.attention.base import (  # noqa: F401
    mask_bias,
    band_bias,
    explicit_on_cpu,
    key_padding_bias,
    AttentionOutput,
    SelfAttention,
    ATTENTION_VARIANTS,
    ROLES,
    attention_class,
    registered_kinds,
    register_attention,
    VariantParameter,
    variant_parameters,
    _BASE_PARAMS,
    _spec_params,
    build_attention,
)
from lib.model.attention.full import (  # noqa: F401
    FullAttention,
)
from lib.model.attention.local import (  # noqa: F401
    LocalAttention,
)
from lib.model.attention.banded import (  # noqa: F401
    BandedAttention,
)
from lib.model.attention.decoder import (  # noqa: F401
    MultiheadAttention,
    build_decoder_attention,
)
# The variants that load on demand (base.load_variant): their names resolve on first use, so importing
# this package never imports their modules (and the baseline's stages never depend on their code).
_LAZY = {
    "band_logit_matrix": "smoothing",
    "uniform_prior": "smoothing",
    "predicted_gate": "smoothing",
    "gate_bias_init": "smoothing",
    "band_logits_init": "smoothing",
    "SmoothedAttention": "smoothing",
    "SmoothedMultiheadAttention": "smoothing",
    "DEFAULT_HEAD_SELECTION_TAU": "head_selection",
    "logistic_noise": "head_selection",
    "select_heads": "head_selection",
    "straight_through": "head_selection",
    "SUBSET_INIT_GAP": "head_selection",
    "gumbel_noise": "head_selection",
    "relaxed_selection": "head_selection",
    "candidate_slots": "head_selection",
    "merge_slots": "head_selection",
    "aligned_subset_logits_": "head_selection",
    "bernoulli_kl": "head_selection",
    "gather_heads": "head_selection",
    "head_rows": "head_selection",
    "pruned_linear": "head_selection",
    "set_subset_lead_": "head_selection",
    "set_subset_lead": "head_selection",
    "HeadSelector": "head_selection",
    "compose_selector": "head_selection",
    "HeadSelectionAttention": "head_selection",
    "set_head_selection_noise": "head_selection",
    "_set_on_head_selection": "head_selection",
    "set_head_selection_tau": "head_selection",
    "HeadSelectionMultiheadAttention": "head_selection",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"lib.model.attention.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ATTENTION_VARIANTS",
    "ROLES",
    "attention_class",
    "registered_kinds",
    "AttentionOutput",
    "FullAttention",
    "HeadSelector",
    "compose_selector",
    "HeadSelectionAttention",
    "HeadSelectionMultiheadAttention",
    "MultiheadAttention",
    "SelfAttention",
    "SmoothedAttention",
    "SmoothedMultiheadAttention",
    "band_bias",
    "band_logit_matrix",
    "bernoulli_kl",
    "build_attention",
    "build_decoder_attention",
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
