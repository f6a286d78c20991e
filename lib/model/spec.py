"""Per-layer encoder attention specs (which layers are full, which local with which window, which
smoothed with which prior)."""
from __future__ import annotations

from typing import Any, Sequence

from lib.model.config import SMOOTHING_PRIORS, decoder_attention_spec, smoothing_layers, smoothing_options

SMOOTHING_WHERE = ("encoder", "decoder_self", "cross")
SMOOTHING_BASES = ("full", "local")
# Keys of a smoothing definition (params.yaml `smoothing.defs.<name>`, specs/variants.md §1.3).
SMOOTHING_KEYS = ("prior", "gamma", "recursive", "train_only", "k", "band_outside", "per_head", "where", "layers", "base")


def local_attention_spec(n_layers: int, full_layers: int, windows: Sequence[Any], *, key: str = "windows") -> list[dict]:
    """Layers 1..k full, layers k+1..n local with ``windows`` (the paper: k = 3, 9 windows).

    Raises ValueError naming ``key`` for a wrong count or a window that is not a positive odd int.
    """
    if not 0 <= full_layers <= n_layers:
        raise ValueError(f"full_layers must be in [0, {n_layers}], got {full_layers}")
    expected = n_layers - full_layers
    if len(windows) != expected:
        raise ValueError(f"{key}: expected {expected} windows (layers {full_layers + 1}..{n_layers}), got {len(windows)}")
    for i, w in enumerate(windows):
        if isinstance(w, bool) or not isinstance(w, int) or w < 1 or w % 2 == 0:
            raise ValueError(f"{key}[{i}] (layer {full_layers + 1 + i}): window must be a positive odd integer, got {w!r}")
    return [{"type": "full"} for _ in range(full_layers)] + [{"type": "local", "window": w} for w in windows]


def validate_spec(spec: Sequence[dict], n_layers: int, *, key: str = "encoder_attention") -> list[dict]:
    """Check a full per-layer spec list (e.g. read from select_windows' output)."""
    if len(spec) != n_layers:
        raise ValueError(f"{key}: {len(spec)} layer specs for {n_layers} encoder layers")
    for i, s in enumerate(spec):
        if not isinstance(s, dict) or "type" not in s:
            raise ValueError(f"{key}[{i}]: expected a dict with a 'type', got {s!r}")
        if s["type"] == "local":
            w = s.get("window")
            if isinstance(w, bool) or not isinstance(w, int) or w < 1 or w % 2 == 0:
                raise ValueError(f"{key}[{i}] (layer {i + 1}): window must be a positive odd integer, got {w!r}")
    return [dict(s) for s in spec]


def smoothing_spec(base: Sequence[dict], sdef: dict, n_layers: int, *, key: str = "smoothing") -> list[dict]:
    """Overlay a smoothing definition (specs/variants.md §1.3) on a per-layer encoder spec.

    ``base``: one spec per encoder layer, each ``{"type": "full"}`` or ``{"type": "local",
    "window": w}``; a smoothed layer becomes ``{"type": "smooth", prior, gamma, ...}`` and keeps the
    local layer's ``window`` (prior restricted and renormalised on the window, §1.2). ``sdef`` keys:
    ``prior`` (required), ``gamma`` (default 0.1), ``recursive``, ``train_only``, ``k``,
    ``band_outside``, ``per_head`` (see :func:`lib.model.config.smoothing_options`), ``where``
    (default ``[encoder]``), ``layers`` (1-based; default all layers for uniform/band, 2..L for
    prev: layer 1 has no layer below, §1.4 A2) and ``base`` (full | local: which base spec the
    caller built; checked here, not used). When ``encoder`` is not in ``where`` the base spec is
    returned unchanged (decoder-side smoothing is a model option, not a per-layer spec) and
    ``layers`` is left to the decoder's builder.

    Raises ValueError naming ``<key>.<option>``: unknown keys, unknown prior / where / base, γ not
    in [0, 1] nor ``predicted``, even k, ``band`` outside the encoder, ``prev`` on layer 1, layers
    out of range, a base layer that is neither full nor local.
    """
    if not isinstance(sdef, dict):
        raise ValueError(f"{key}: a smoothing definition must be a mapping, got {sdef!r}")
    unknown = sorted(set(sdef) - set(SMOOTHING_KEYS))
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {unknown}; allowed: {list(SMOOTHING_KEYS)}")
    if "prior" not in sdef:
        raise ValueError(f"{key}.prior: missing (one of {list(SMOOTHING_PRIORS)})")
    opts = smoothing_options(**{k: v for k, v in sdef.items() if k not in ("where", "layers", "base")}, key=key)

    where = sdef.get("where", ["encoder"])
    if isinstance(where, str) or not isinstance(where, (list, tuple)) or not where:
        raise ValueError(f"{key}.where: must be a non-empty list of {list(SMOOTHING_WHERE)}, got {where!r}")
    bad = [w for w in where if w not in SMOOTHING_WHERE]
    if bad:
        raise ValueError(f"{key}.where: unknown place(s) {bad}; known: {list(SMOOTHING_WHERE)}")
    if opts["prior"] == "band" and any(w != "encoder" for w in where):
        raise ValueError(f"{key}.where: the band prior is defined for encoder self-attention only, got {list(where)}")
    if sdef.get("base", "full") not in SMOOTHING_BASES:
        raise ValueError(f"{key}.base: must be one of {list(SMOOTHING_BASES)}, got {sdef['base']!r}")

    if len(base) != n_layers:
        raise ValueError(f"{key}: base spec has {len(base)} layer specs for {n_layers} encoder layers")
    out = [dict(s) for s in base]
    if "encoder" not in where:  # `layers` then counts decoder layers: checked where the decoder is built
        return out

    layers = smoothing_layers(sdef.get("layers"), opts["prior"], n_layers, key=key)
    smooth = {name: val for name, val in opts.items()
              if not (name in ("recursive", "train_only", "per_head") and val is False)
              and not (name == "band_outside" and val == "literal") and val is not None}
    for li in layers:
        s = out[li - 1]
        if not isinstance(s, dict) or s.get("type") not in SMOOTHING_BASES:
            raise ValueError(f"{key}: layer {li} has base attention {s!r}; smoothing overlays full or local layers only")
        out[li - 1] = {"type": "smooth", **smooth}
        if s["type"] == "local":
            out[li - 1]["window"] = s["window"]
    return out


def decoder_smoothing_specs(sdef: dict, n_layers: int, *, key: str = "smoothing") -> dict[str, dict | None]:
    """The decoder side of a smoothing definition (specs/variants.md §0.3, §1.2 "Where"): the
    ``ModelConfig`` overrides ``{"decoder_self_attention": spec | None, "cross_attention": spec | None}``
    for the places ``decoder_self`` / ``cross`` named in ``where`` (None = plain attention).
    ``layers`` applies to every place named in ``where``; here it is checked against the decoder's
    ``n_layers`` (against the encoder's in :func:`smoothing_spec`). ValueError naming the key."""
    # the whole definition is checked as for the encoder (unknown keys, prior, γ, where, band ...)
    smoothing_spec([{"type": "full"}] * n_layers, sdef, n_layers, key=key)
    where = sdef.get("where", ["encoder"])
    opts = {name: sdef[name] for name in ("prior", "gamma", "recursive", "train_only", "layers") if name in sdef}
    return {
        attr: decoder_attention_spec({"type": "smooth", **opts}, n_layers, key=key) if place in where else None
        for place, attr in (("decoder_self", "decoder_self_attention"), ("cross", "cross_attention"))
    }


def smoothing_model_specs(base: Sequence[dict], sdef: dict, decoder_layers: int, *,
                          key: str = "smoothing") -> tuple[list[dict], dict[str, dict | None]]:
    """Everything a smoothing definition changes in a model: ``(encoder_attention, decoder)`` where
    ``encoder_attention`` is :func:`smoothing_spec` over ``base`` (the encoder's per-layer spec, full
    or local) and ``decoder`` the ``ModelConfig`` overrides of :func:`decoder_smoothing_specs` (both
    None when ``where`` names no decoder place). ``layers`` counts the layers of each place it applies
    to. ValueError naming ``key``."""
    encoder = smoothing_spec(base, sdef, len(base), key=key)
    where = sdef.get("where", ["encoder"]) if isinstance(sdef, dict) else []
    if any(w in ("decoder_self", "cross") for w in where):
        return encoder, decoder_smoothing_specs(sdef, decoder_layers, key=key)
    return encoder, {"decoder_self_attention": None, "cross_attention": None}
