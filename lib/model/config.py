"""Configuration of the S2T Transformer (lib/model/s2t_transformer.py): plain values, no torch.

Kept apart from the model so that params can be validated (``model.size``, ``model.overrides``)
without importing torch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = [
    "BAND_INIT_LOGIT",
    "BAND_OUTSIDE",
    "DEFAULT_BAND_K",
    "DEFAULT_GAMMA",
    "HEAD_SELECTION_ESTIMATORS",
    "HEAD_SELECTION_STRATEGIES",
    "MODEL_SIZES",
    "SMOOTHING_PRIORS",
    "SUBSAMPLER_NORMS",
    "ModelConfig",
    "model_config",
    "decoder_attention_spec",
    "HeadSelectionOptions",
    "smoothing_layers",
    "SmoothingOptions",
]

# ----------------------------------------------------------------------------------------

SUBSAMPLER_NORMS = ("none", "layernorm")


@dataclass
class ModelConfig:
    n_mels: int = 80
    conv_channels: int = 1024  # fairseq conv_channels (mid channels before the GLU)
    conv_kernel: int = 5
    d_model: int = 256
    n_heads: int = 4
    ffn_dim: int = 2048
    encoder_layers: int = 12
    decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation_dropout: float = 0.1
    vocab_size: int = 8000  # MuST-C ST recipe: unigram SentencePiece, 8k
    max_source_positions: int = 6000
    max_target_positions: int = 1024
    # One attention spec per encoder layer; None -> all {"type": "full"}.
    encoder_attention: list[dict] | None = None
    # Decoder attention (docs/variants.md): one spec for all decoder layers, or None = plain
    # attention (SDPA). {"type": "smooth", prior, gamma, recursive, train_only, layers} or, for
    # self-attention only, {"type": "head_select", strategy, candidates, tasks, layers} (docs/variants.md) -- see
    # decoder_attention_spec; "layers" (1-based) is filled with its default here.
    decoder_self_attention: dict | None = None
    cross_attention: dict | None = None
    # Optional CTC head on the encoder output (auxiliary ASR loss); None -> no head.
    ctc_vocab_size: int | None = None
    # Which encoder layer's output the CTC head reads (1-based): 0 = the encoder output (after the
    # last layer and the final LayerNorm; ESPnet's default). k in 1..encoder_layers-1: layer k's output
    # through the same final LayerNorm (ESPnet's intermediate CTC, Lee & Watanabe 2021), so the layers
    # above k learn only from the decoder. Demo trial (docs/locality-study.md, row T), not in the paper.
    ctc_layer: int = 0
    # True: the CTC head's weight starts at zero (uniform CTC posteriors over the vocabulary, whatever the
    # seed), not at torch's default uniform init. A demo option: under the default init some ASR seeds sit
    # on a CTC plateau for 1000+ updates (docs/results.md, "What decides a draw").
    ctc_zero_init: bool = False
    pad_idx: int = 1  # fairseq dictionary convention
    # Encoder input (demo-only deviations from fairseq; the paper profile keeps the defaults):
    # scale_embedding: multiply the subsampler output by sqrt(d) (fairseq; False = its
    #   --no-scale-embedding). subsampler_norm: "layernorm" normalises the subsampler output (before
    #   the positions are added, as wav2vec 2.0 does for its feature encoder), which keeps the
    #   sinusoidal positions from being drowned by a growing subsampler output (docs/paper-vs-demo.md).
    scale_embedding: bool = True
    subsampler_norm: str = "none"  # none | layernorm
    # Diagnostic control, not in the paper: a zero-initialised learned relative-position bias per
    # encoder head over offsets clipped to [-K, K] (K = rel_pos_bias; 0 = off, full attention only).
    rel_pos_bias: int = 0
    # Under bf16 / fp16 autocast, run every encoder self-attention core (scores, softmax, weighted
    # sum) in fp32 (the projections stay low precision). Off: the device's autocast policy (CPU: bf16).
    attention_fp32: bool = False

    def __post_init__(self) -> None:
        if self.encoder_attention is None:
            self.encoder_attention = [{"type": "full"} for _ in range(self.encoder_layers)]
        else:
            self.encoder_attention = [dict(spec) for spec in self.encoder_attention]
        if len(self.encoder_attention) != self.encoder_layers:
            raise ValueError(
                f"encoder_attention has {len(self.encoder_attention)} specs for "
                f"{self.encoder_layers} encoder layers"
            )
        for name in ("decoder_self_attention", "cross_attention"):
            setattr(self, name, decoder_attention_spec(getattr(self, name), self.decoder_layers, key=name,
                                                       n_heads=self.n_heads, cross=name == "cross_attention"))
        self._check_head_selection()
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} not divisible by n_heads={self.n_heads}")
        if self.conv_channels % 2:
            raise ValueError(f"conv_channels={self.conv_channels} must be even (GLU halves it)")
        if self.conv_kernel % 2 == 0:
            raise ValueError(f"conv_kernel={self.conv_kernel} must be odd ((len-1)//2+1 lengths)")
        if self.vocab_size <= self.pad_idx:
            raise ValueError(f"vocab_size={self.vocab_size} must exceed pad_idx={self.pad_idx}")
        if self.subsampler_norm not in SUBSAMPLER_NORMS:
            raise ValueError(f"subsampler_norm must be one of {list(SUBSAMPLER_NORMS)}, got {self.subsampler_norm!r}")
        if not isinstance(self.scale_embedding, bool):
            raise ValueError(f"scale_embedding must be true or false, got {self.scale_embedding!r}")
        if not isinstance(self.ctc_layer, int) or isinstance(self.ctc_layer, bool) \
                or not 0 <= self.ctc_layer <= self.encoder_layers:
            raise ValueError(f"ctc_layer must be an integer in [0, encoder_layers={self.encoder_layers}] "
                             f"(0: the encoder output), got {self.ctc_layer!r}")
        if not isinstance(self.attention_fp32, bool):
            raise ValueError(f"attention_fp32 must be true or false, got {self.attention_fp32!r}")

    def _check_head_selection(self) -> None:
        """Head-selection specs (docs/variants.md): each encoder ``head_select`` layer is checked
        like the decoder spec (strategy, candidates vs n_heads, tasks), every selecting layer of the
        model must agree on the number of tasks (one task id indexes all of them), and the
        relative-position bias control is not implemented for it. ValueError naming the key."""
        n_tasks: dict[str, int] = {}
        for i, spec in enumerate(self.encoder_attention):
            if isinstance(spec, dict) and spec.get("type") == "head_select":
                key = f"encoder_attention[{i}]"
                opts = HeadSelectionOptions.validated(strategy=spec.get("strategy"), candidates=spec.get("candidates"),
                                                      tasks=spec.get("tasks"), n_heads=self.n_heads,
                                                      estimator=spec.get("estimator", "paper"), key=key)
                n_tasks[key] = opts.tasks
                if self.rel_pos_bias:
                    raise ValueError(f"{key}: the relative-position bias (rel_pos_bias) is not implemented for "
                                     "head selection")
        if self.decoder_self_attention is not None and self.decoder_self_attention["type"] == "head_select":
            n_tasks["decoder_self_attention"] = self.decoder_self_attention["tasks"]
        if len(set(n_tasks.values())) > 1:
            raise ValueError(f"tasks: head-selection layers disagree on the number of tasks: {n_tasks}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (ints/floats/lists/dicts/None): safe for torch.load(weights_only=True).

        Decoder attention specs are left out when None (plain attention), ``attention_fp32`` when
        False, ``ctc_layer`` when 0 and ``ctc_zero_init`` when False, so the configs -- and the resume fingerprints -- of models without them are those from
        before they existed."""
        d = asdict(self)
        for name in ("decoder_self_attention", "cross_attention"):
            if d[name] is None:
                del d[name]
        if not d["attention_fp32"]:
            del d["attention_fp32"]
        if not d["ctc_layer"]:
            del d["ctc_layer"]
        if not d["ctc_zero_init"]:
            del d["ctc_zero_init"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig key(s): {unknown}")
        return cls(**d)


# Named sizes: overrides on top of the ModelConfig defaults (which are "s").
MODEL_SIZES: dict[str, dict[str, Any]] = {
    # fairseq s2t_transformer_s == the paper's baseline (Appendix B).
    "s": {},
    # Small CPU-trainable config keeping the paper's depth (12 encoder layers, so the
    # layer-wise locality analysis and the per-layer windows still apply).
    "demo": dict(
        conv_channels=256, d_model=128, n_heads=4, ffn_dim=512, encoder_layers=12, decoder_layers=3
    ),
    # For unit tests.
    "tiny": dict(
        conv_channels=16, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=2, decoder_layers=1
    ),
}


def odd_window(window: Any, what: str, *, optional: bool = False) -> int | None:
    """``window`` checked once for every attention kind: a positive odd int (a centred band,
    |i - j| <= (w - 1) / 2), or None where ``optional``; ValueError "``what`` must be a positive odd
    integer ..." otherwise."""
    if optional and window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % 2 == 0:
        raise ValueError(f"{what} must be a positive odd integer{' or None' if optional else ''}, got {window!r}")
    return window


def model_config(size: str, **overrides: Any) -> ModelConfig:
    """``model_config("s", vocab_size=8000)``; ValueError naming an unknown size or key."""
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; known: {sorted(MODEL_SIZES)}")
    return ModelConfig.from_dict({**MODEL_SIZES[size], **overrides})


# ----------------------------------------------------------------------------------------
# Attention smoothing options (docs/variants.md), shared by the attention module
# (lib.model.attention.SmoothedAttention) and the params-level spec builder
# (lib.model.spec.smoothing_spec) so that both reject the same values with the same words.

SMOOTHING_PRIORS = ("uniform", "band", "prev")
BAND_OUTSIDE = ("literal", "masked")
DEFAULT_GAMMA = 0.1  # reading A7: the paper gives no value
DEFAULT_BAND_K = 13  # reading A7: median of the locality paper's En-De windows
#: The band prior's learnable logits start at this value on the band (``band_init_width``) and 0
#: elsewhere: an in-band key starts 100 x as likely as an off-band one, so the prior starts as a band
#: (in-band mass w·100 / (w·100 + N - w): 92 % for w = 13 keys of N = 113) instead of uniform.
BAND_INIT_LOGIT = 4.605170185988092  # ln 100


@dataclass(frozen=True)
class SmoothingOptions:
    """One smoothing definition's options, validated: the one set of rules the attention modules
    (lib.model.attention.smoothing), the decoder spec below and the params-level spec builder
    (lib.model.spec.smoothing_spec) share, so all reject the same values with the same words.
    Build it with :meth:`validated`."""

    prior: str
    gamma: float | str
    recursive: bool
    train_only: bool
    k: int | None
    band_outside: str
    per_head: bool
    gate_init: float | None
    band_init_width: int | None

    @classmethod
    def validated(
        cls,
        *,
        prior: Any,
        gamma: Any = DEFAULT_GAMMA,
        recursive: Any = False,
        train_only: Any = False,
        k: Any = None,
        band_outside: Any = "literal",
        per_head: Any = False,
        gate_init: Any = None,
        band_init_width: Any = None,
        key: str = "smoothing",
    ) -> "SmoothingOptions":
        """Validate and normalise one smoothing definition; ValueError naming ``<key>.<option>``.

        ``gamma`` is a float in [0, 1] or ``"predicted"`` and ``k`` an odd int for
        ``band`` (default 13), else None.
        Rules (docs/variants.md): ``recursive`` and ``gamma: predicted`` only with ``prior: prev``, and the
        predicted coefficient only recursively (the paper's Eq. for g interpolates with A^rec_{l-1});
        ``k``, ``band_outside``, ``per_head`` only with ``prior: band``; k odd (centred band, A3).

        ``gate_init`` (``gamma: predicted`` only; default :data:`DEFAULT_GAMMA`): the gate's value at
        initialisation, a number in (0, 1): g = σ(q · c_h + b_h) starts with c = 0 and b_h = logit(gate_init),
        so the predicted system starts where the fixed-γ systems are. ``band_init_width`` (``band`` only;
        default k): the odd width w <= k of the band the learnable logits start as (the centre w of the
        k logits at :data:`BAND_INIT_LOGIT`, the rest 0). Returned as None where they do not apply.
        """
        if prior not in SMOOTHING_PRIORS:
            raise ValueError(f"{key}.prior: must be one of {list(SMOOTHING_PRIORS)}, got {prior!r}")
        for name, val in (("recursive", recursive), ("train_only", train_only), ("per_head", per_head)):
            if not isinstance(val, bool):
                raise ValueError(f"{key}.{name}: must be true or false, got {val!r}")
        if gamma == "predicted":
            if prior != "prev" or not recursive:
                raise ValueError(f"{key}.gamma: 'predicted' needs prior: prev and recursive: true "
                                 f"(the paper predicts g for recursive smoothing only), got prior {prior!r}, "
                                 f"recursive {recursive!r}")
        elif isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"{key}.gamma: must be a number in [0, 1] or 'predicted', got {gamma!r}")
        else:
            gamma = float(gamma)
        if recursive and prior != "prev":
            raise ValueError(f"{key}.recursive: only the prev prior recurses, got prior {prior!r}")
        if prior == "band":
            k = DEFAULT_BAND_K if k is None else k
            if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0:
                raise ValueError(f"{key}.k: band width must be a positive odd integer (centred band), got {k!r}")
            if band_outside not in BAND_OUTSIDE:
                raise ValueError(f"{key}.band_outside: must be one of {list(BAND_OUTSIDE)}, got {band_outside!r}")
            if band_init_width is None:
                band_init_width = k
            if isinstance(band_init_width, bool) or not isinstance(band_init_width, int) or not 1 <= band_init_width <= k \
                    or band_init_width % 2 == 0:
                raise ValueError(f"{key}.band_init_width: the band the logits start as must be an odd integer in "
                                 f"1..k = {k} (centred), got {band_init_width!r}")
        else:
            for name, val, default in (("k", k, None), ("band_outside", band_outside, "literal"), ("per_head", per_head, False),
                                       ("band_init_width", band_init_width, None)):
                if val != default:
                    raise ValueError(f"{key}.{name}: only applies to prior: band, got {val!r} with prior {prior!r}")
        if gamma == "predicted":
            gate_init = DEFAULT_GAMMA if gate_init is None else gate_init
            if isinstance(gate_init, bool) or not isinstance(gate_init, (int, float)) or not 0.0 < gate_init < 1.0:
                raise ValueError(f"{key}.gate_init: the predicted gate's value at initialisation must be a number in "
                                 f"(0, 1), got {gate_init!r}")
            gate_init = float(gate_init)
        elif gate_init is not None:
            raise ValueError(f"{key}.gate_init: only applies to gamma: predicted, got {gate_init!r} with gamma {gamma!r}")
        return cls(prior=prior, gamma=gamma, recursive=recursive, train_only=train_only, k=k,
                   band_outside=band_outside, per_head=per_head, gate_init=gate_init, band_init_width=band_init_width)


# ----------------------------------------------------------------------------------------
# Attention head selection options (docs/variants.md), shared by the attention modules
# (lib.model.attention.HeadSelectionAttention, lib.model.attention.head_selection.HeadSelectionMultiheadAttention),
# the decoder spec below and the params-level builder (lib.model.spec.head_selection_spec).

HEAD_SELECTION_STRATEGIES = ("subset", "group")
#: Gradient estimators of the selection (docs/variants.md): ``paper`` = the paper's Gumbel-sigmoid with
#: the straight-through weights of the selected heads only; ``gumbel`` = a straight-through
#: Gumbel-softmax over each group (group) or over all candidates (subset) whose backward pass compares
#: every candidate with the one selected (lib.model.attention.HeadSelector).
HEAD_SELECTION_ESTIMATORS = ("paper", "gumbel")


@dataclass(frozen=True)
class HeadSelectionOptions:
    """One head-selection layer's options, validated (:meth:`validated`): the rules the attention
    modules (lib.model.attention.head_selection), the model config, the decoder spec below and the
    params-level builder (lib.model.spec.head_selection_options_from) share."""

    strategy: str
    candidates: int
    tasks: int
    estimator: str

    @classmethod
    def validated(cls, *, strategy: Any, candidates: Any, tasks: Any, n_heads: int | None = None,
                  estimator: Any = "paper", key: str = "head_selection") -> "HeadSelectionOptions":
        """Validate one head-selection definition; ValueError naming ``<key>.<option>``.

        ``strategy`` subset | group; ``candidates`` H' an int >= H (``n_heads``; H' = H is "no
        selection", the paper's H' = 4 point of Fig. 2) and, for ``group``, a multiple of H (H strided
        groups of r = H' / H candidates); ``tasks`` the number of task ids (>= 1); ``estimator`` one of
        :data:`HEAD_SELECTION_ESTIMATORS`."""
        if strategy not in HEAD_SELECTION_STRATEGIES:
            raise ValueError(f"{key}.strategy: must be one of {list(HEAD_SELECTION_STRATEGIES)}, got {strategy!r}")
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"{key}.candidates: must be a positive integer (H', heads per layer to select from), "
                             f"got {candidates!r}")
        if n_heads is not None:
            if candidates < n_heads:
                raise ValueError(f"{key}.candidates: H' = {candidates} is fewer than the H = {n_heads} heads selected")
            if strategy == "group" and candidates % n_heads:
                raise ValueError(f"{key}.candidates: the group strategy needs H' = {candidates} to be a multiple of "
                                 f"H = {n_heads} (H groups of H'/H candidates)")
        if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
            raise ValueError(f"{key}.tasks: must be a positive integer (number of task ids), got {tasks!r}")
        if estimator not in HEAD_SELECTION_ESTIMATORS:
            raise ValueError(f"{key}.estimator: must be one of {list(HEAD_SELECTION_ESTIMATORS)}, got {estimator!r}")
        return cls(strategy=strategy, candidates=candidates, tasks=tasks, estimator=estimator)


DECODER_ATTENTION_TYPES = ("smooth", "head_select")


def smoothing_layers(layers: Any, prior: str, n_layers: int, *, key: str) -> list[int]:
    """The 1-based layers a smoothing definition applies to (docs/variants.md): default all layers for
    uniform / band, 2..L for prev; ValueError naming ``<key>.layers`` for numbers outside 1..L,
    duplicates, or layer 1 with the prev prior (no layer below, reading A2)."""
    if layers is None:
        return list(range(2 if prior == "prev" else 1, n_layers + 1))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, (list, tuple)):
        raise ValueError(f"{key}.layers: must be a list of 1-based layer numbers, got {layers!r}")
    for li in layers:
        if isinstance(li, bool) or not isinstance(li, int) or not 1 <= li <= n_layers:
            raise ValueError(f"{key}.layers: {li!r} is not a layer number in 1..{n_layers}")
    if len(set(layers)) != len(layers):
        raise ValueError(f"{key}.layers: duplicate layer numbers in {list(layers)}")
    if prior == "prev" and 1 in layers:
        raise ValueError(f"{key}.layers: layer 1 cannot take the prev prior (no layer below; docs/variants.md)")
    return sorted(layers)


def decoder_attention_spec(spec: dict | None, n_layers: int, *, key: str, n_heads: int | None = None,
                           cross: bool = False) -> dict | None:
    """Validate a decoder attention spec (``ModelConfig.decoder_self_attention`` / ``cross_attention``,
    docs/variants.md): None (plain attention), ``{"type": "smooth", prior, gamma, recursive,
    train_only, layers}`` with prior uniform | prev (the band prior is encoder-only, docs/variants.md), or, for
    self-attention only (``cross`` False; the paper's footnote 1), ``{"type": "head_select", strategy,
    candidates, tasks, layers}`` (docs/variants.md; ``n_heads`` checks H' against H). Returns a normalised copy
    with ``layers`` filled (default: all layers); ValueError naming ``<key>.<option>``."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("type") not in DECODER_ATTENTION_TYPES:
        raise ValueError(f"{key}: expected None or a dict with type in {list(DECODER_ATTENTION_TYPES)}, got {spec!r}")
    if spec["type"] == "head_select":
        return _decoder_head_selection_spec(spec, n_layers, key=key, n_heads=n_heads, cross=cross)
    allowed = {"type", "prior", "gamma", "recursive", "train_only", "layers", "gate_init"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    if spec.get("prior") == "band":
        raise ValueError(f"{key}.prior: the band prior is defined for encoder self-attention only")
    if "prior" not in spec:
        raise ValueError(f"{key}.prior: missing (uniform or prev)")
    opts = SmoothingOptions.validated(**{k: v for k, v in spec.items() if k not in ("type", "layers")}, key=key)
    layers = smoothing_layers(spec.get("layers"), opts.prior, n_layers, key=key)
    out = {"type": spec["type"], "prior": opts.prior, "gamma": opts.gamma, "recursive": opts.recursive,
           "train_only": opts.train_only, "layers": layers}
    if opts.gate_init is not None:  # gamma: predicted only (absent otherwise: the configs of before)
        out["gate_init"] = opts.gate_init
    return out


def _decoder_head_selection_spec(spec: dict, n_layers: int, *, key: str, n_heads: int | None,
                                 cross: bool) -> dict:
    """The ``head_select`` branch of :func:`decoder_attention_spec`."""
    if cross:
        raise ValueError(f"{key}: head selection applies to self-attention only (the paper found no gain on "
                         "encoder-decoder attention, its footnote 1)")
    allowed = {"type", "strategy", "candidates", "tasks", "layers", "estimator"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    for name in ("strategy", "candidates", "tasks"):
        if name not in spec:
            raise ValueError(f"{key}.{name}: missing")
    validated = HeadSelectionOptions.validated(strategy=spec["strategy"], candidates=spec["candidates"],
                                               tasks=spec["tasks"], n_heads=n_heads,
                                               estimator=spec.get("estimator", "paper"), key=key)
    opts = asdict(validated)
    if validated.estimator == "paper":  # the default: left out, so the configs of before stay as they were
        del opts["estimator"]
    # layer numbers are checked as for smoothing (range, duplicates); any layer may select
    layers = smoothing_layers(spec.get("layers"), "uniform", n_layers, key=key)
    return {"type": "head_select", **opts, "layers": layers}
