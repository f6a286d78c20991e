"""Per-layer encoder attention specs (which layers are full, which local with which window, which
smoothed with which prior, which select heads per task)."""
from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Sequence

from lib.model.config import (
    SMOOTHING_PRIORS,
    decoder_attention_spec,
    HeadSelectionOptions,
    odd_window,
    smoothing_layers,
    SmoothingOptions,
)

SMOOTHING_WHERE = ("encoder", "decoder_self", "cross")
SMOOTHING_BASES = ("full", "local")
# Keys of a smoothing definition (params.yaml `smoothing.defs.<name>`, docs/variants.md).
SMOOTHING_KEYS = ("prior", "gamma", "recursive", "train_only", "k", "band_outside", "per_head", "where", "layers", "base",
                  "gate_init", "band_init_width")


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
        odd_window(w, f"{key}[{i}] (layer {full_layers + 1 + i}): window")
    return [{"type": "full"} for _ in range(full_layers)] + [{"type": "local", "window": w} for w in windows]


def validate_spec(spec: Sequence[dict], n_layers: int, *, key: str = "encoder_attention") -> list[dict]:
    """Check a full per-layer spec list (read from select_windows' output): one ``{"type": "full"}`` or
    ``{"type": "local", "window": w}`` per encoder layer. ValueError naming ``key`` otherwise."""
    if not isinstance(spec, list):
        raise ValueError(f"{key}: expected a list of layer specs, got {type(spec).__name__}")
    if len(spec) != n_layers:
        raise ValueError(f"{key}: {len(spec)} layer specs for {n_layers} encoder layers")
    for i, s in enumerate(spec):
        if not isinstance(s, dict) or "type" not in s:
            raise ValueError(f"{key}[{i}]: expected a dict with a 'type', got {s!r}")
        if s["type"] not in ("full", "local"):
            raise ValueError(f"{key}[{i}] (layer {i + 1}): type must be 'full' or 'local', got {s['type']!r}")
        if s["type"] == "local":
            odd_window(s.get("window"), f"{key}[{i}] (layer {i + 1}): window")
    return [dict(s) for s in spec]


def widest_spec(specs: Sequence[Sequence[dict]], *, key: str = "encoder_attention") -> list[dict]:
    """Per layer, the widest attention of several per-layer specs: ``full`` when any spec has full
    attention there, else local with the largest window. ``local.fork: shared`` trains one ASR fork
    for every pair with it, so that no pair's ST model gets more context in a layer than its
    encoder was forked with: each pair's ST run only narrows windows. ValueError (naming ``key``)
    for specs of different depths or a layer that is neither full nor local."""
    if not specs:
        raise ValueError(f"{key}: no specs to combine")
    depths = {len(s) for s in specs}
    if len(depths) != 1:
        raise ValueError(f"{key}: specs of different depths {sorted(depths)}")
    out: list[dict] = []
    for i, layer in enumerate(zip(*specs)):
        kinds = {s["type"] for s in layer}
        if not kinds <= {"full", "local"}:
            raise ValueError(f"{key}[{i}] (layer {i + 1}): only full or local layers combine, got {sorted(kinds)}")
        out.append({"type": "full"} if "full" in kinds
                   else {"type": "local", "window": max(int(s["window"]) for s in layer)})
    return out


def smoothing_spec(base: Sequence[dict], sdef: dict, n_layers: int, *, key: str = "smoothing") -> list[dict]:
    """Overlay a smoothing definition (docs/variants.md) on a per-layer encoder spec.

    ``base``: one spec per encoder layer, each ``{"type": "full"}`` or ``{"type": "local",
    "window": w}``; a smoothed layer becomes ``{"type": "smooth", prior, gamma, ...}`` and keeps the
    local layer's ``window`` (prior restricted and renormalised on the window, docs/variants.md). ``sdef`` keys:
    ``prior`` (required), ``gamma`` (default 0.1), ``recursive``, ``train_only``, ``k``,
    ``band_outside``, ``per_head``, ``gate_init``, ``band_init_width`` (see
    :class:`lib.model.config.SmoothingOptions`; a band layer over a local base layer without
    ``band_init_width`` starts as a band of its window, Algorithm 1's, capped at k), ``where``
    (default ``[encoder]``), ``layers`` (1-based; default all layers for uniform/band, 2..L for
    prev: layer 1 has no layer below, reading A2) and ``base`` (full | local: which base spec the
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
    validated = SmoothingOptions.validated(**{k: v for k, v in sdef.items() if k not in ("where", "layers", "base")},
                                          key=key)
    opts = asdict(validated)

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
            if opts["prior"] == "band" and sdef.get("band_init_width") is None:
                out[li - 1]["band_init_width"] = min(s["window"], opts["k"])  # both odd
    return out


def decoder_smoothing_specs(sdef: dict, n_layers: int, *, key: str = "smoothing") -> dict[str, dict | None]:
    """The decoder side of a smoothing definition (docs/variants.md): the
    ``ModelConfig`` overrides ``{"decoder_self_attention": spec | None, "cross_attention": spec | None}``
    for the places ``decoder_self`` / ``cross`` named in ``where`` (None = plain attention).
    ``layers`` applies to every place named in ``where``; here it is checked against the decoder's
    ``n_layers`` (against the encoder's in :func:`smoothing_spec`). ValueError naming the key."""
    # the whole definition is checked as for the encoder (unknown keys, prior, γ, where, band ...)
    smoothing_spec([{"type": "full"}] * n_layers, sdef, n_layers, key=key)
    where = sdef.get("where", ["encoder"])
    opts = {name: sdef[name] for name in ("prior", "gamma", "recursive", "train_only", "layers", "gate_init")
            if name in sdef}
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

# ----------------------------------------------------------------------------------------
# Head selection (docs/variants.md): params.yaml `multi.head_selection` plus the system's
# strategy -> the encoder's per-layer spec, the decoder's ModelConfig override, the training options.

HEAD_SELECTION_APPLY_TO = ("encoder_self", "decoder_self")
# Keys of a head-selection definition: `multi.head_selection` + `strategy` (from the system name).
HEAD_SELECTION_KEYS = ("strategy", "candidates", "apply_to", "tau_start", "tau_end", "anneal_updates", "kl_weight",
                       "estimator", "noise_start", "noise_end", "variant_lr")
HEAD_SELECTION_DEFAULTS: dict[str, Any] = {"candidates": 8, "apply_to": list(HEAD_SELECTION_APPLY_TO),
                                           "tau_start": 5.0, "tau_end": 5.0, "anneal_updates": None, "kl_weight": 0.0,
                                           "estimator": "paper", "noise_start": 1.0, "noise_end": 0.1,
                                           "variant_lr": None}


def _number(val: Any) -> bool:
    return not isinstance(val, bool) and isinstance(val, (int, float)) and math.isfinite(val)


def head_selection_options_from(hdef: dict, *, n_heads: int, tasks: int, key: str = "multi.head_selection") -> dict:
    """Validate a whole head-selection definition (docs/variants.md params: ``strategy`` subset | group,
    ``candidates`` H', ``apply_to`` ⊆ [encoder_self, decoder_self], ``tau_start``, ``tau_end``,
    ``anneal_updates``, ``kl_weight`` a float >= 0 or ``elbo``) and fill the defaults of
    :data:`HEAD_SELECTION_DEFAULTS`. ``n_heads`` H and ``tasks`` (the number of pairs) come from the
    model and the data. ValueError naming ``<key>.<option>``."""
    if not isinstance(hdef, dict):
        raise ValueError(f"{key}: a head-selection definition must be a mapping, got {hdef!r}")
    unknown = sorted(set(hdef) - set(HEAD_SELECTION_KEYS))
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {unknown}; allowed: {list(HEAD_SELECTION_KEYS)}")
    if "strategy" not in hdef:
        raise ValueError(f"{key}.strategy: missing (subset or group)")
    d = {**HEAD_SELECTION_DEFAULTS, **hdef}
    opts = asdict(HeadSelectionOptions.validated(strategy=d["strategy"], candidates=d["candidates"], tasks=tasks,
                                                 n_heads=n_heads, estimator=d["estimator"], key=key))
    apply_to = d["apply_to"]
    if isinstance(apply_to, str) or not isinstance(apply_to, (list, tuple)) or not apply_to:
        raise ValueError(f"{key}.apply_to: must be a non-empty list of {list(HEAD_SELECTION_APPLY_TO)}, got {apply_to!r}")
    bad = [a for a in apply_to if a not in HEAD_SELECTION_APPLY_TO]
    if bad:
        raise ValueError(f"{key}.apply_to: unknown place(s) {bad}; known: {list(HEAD_SELECTION_APPLY_TO)} "
                         "(head selection is for self-attention only)")
    if len(set(apply_to)) != len(apply_to):
        raise ValueError(f"{key}.apply_to: duplicates in {list(apply_to)}")
    for name in ("tau_start", "tau_end"):
        if not _number(d[name]) or d[name] <= 0:
            raise ValueError(f"{key}.{name}: the temperature must be a number > 0, got {d[name]!r}")
    if d["tau_end"] > d["tau_start"]:
        raise ValueError(f"{key}.tau_end: the schedule anneals downwards (tau_end <= tau_start = {d['tau_start']}), "
                         f"got {d['tau_end']!r}")
    if d["anneal_updates"] is not None and (isinstance(d["anneal_updates"], bool) or not isinstance(d["anneal_updates"], int)
                                            or d["anneal_updates"] < 0):
        raise ValueError(f"{key}.anneal_updates: must be an integer >= 0 or null (the run's length), "
                         f"got {d['anneal_updates']!r}")
    for name in ("noise_start", "noise_end"):
        if not _number(d[name]) or d[name] < 0:
            raise ValueError(f"{key}.{name}: the Gumbel noise scale must be a number >= 0, got {d[name]!r}")
    if d["variant_lr"] is not None and (not _number(d["variant_lr"]) or d["variant_lr"] <= 0):
        raise ValueError(f"{key}.variant_lr: must be a number > 0 or null, got {d['variant_lr']!r}")
    if d["kl_weight"] != "elbo" and (not _number(d["kl_weight"]) or d["kl_weight"] < 0):
        raise ValueError(f"{key}.kl_weight: must be a number >= 0 or 'elbo', got {d['kl_weight']!r}")
    return {"strategy": opts["strategy"], "candidates": opts["candidates"], "tasks": opts["tasks"],
            "apply_to": list(apply_to), "tau_start": float(d["tau_start"]), "tau_end": float(d["tau_end"]),
            "anneal_updates": d["anneal_updates"], "estimator": opts["estimator"],
            "noise_start": float(d["noise_start"]), "noise_end": float(d["noise_end"]),
            "variant_lr": None if d["variant_lr"] is None else float(d["variant_lr"]),
            "kl_weight": d["kl_weight"] if d["kl_weight"] == "elbo" else float(d["kl_weight"])}


def head_selection_spec(base: Sequence[dict], hdef: dict, n_layers: int, *, n_heads: int, tasks: int,
                        key: str = "multi.head_selection") -> list[dict]:
    """Overlay a head-selection definition on a per-layer encoder spec (docs/variants.md).

    ``base``: one spec per encoder layer, each ``{"type": "full"}`` or ``{"type": "local", "window":
    w}``. With ``encoder_self`` in ``apply_to`` every layer becomes ``{"type": "head_select",
    strategy, candidates, tasks}`` (a local layer keeps its ``window``: local attention on the selected
    heads); otherwise the base is returned unchanged. The whole definition is validated
    (:func:`head_selection_options_from`); ValueError naming ``<key>.<option>``."""
    opts = head_selection_options_from(hdef, n_heads=n_heads, tasks=tasks, key=key)
    if len(base) != n_layers:
        raise ValueError(f"{key}: base spec has {len(base)} layer specs for {n_layers} encoder layers")
    out = [dict(s) for s in base]
    if "encoder_self" not in opts["apply_to"]:
        return out
    for i, s in enumerate(out):
        if not isinstance(s, dict) or s.get("type") not in ("full", "local"):
            raise ValueError(f"{key}: layer {i + 1} has base attention {s!r}; head selection overlays full or "
                             "local layers only")
        out[i] = {"type": "head_select", "strategy": opts["strategy"], "candidates": opts["candidates"],
                  "tasks": opts["tasks"]}
        if opts["estimator"] != "paper":
            out[i]["estimator"] = opts["estimator"]
        if s["type"] == "local":
            out[i]["window"] = s["window"]
    return out


def decoder_head_selection_spec(hdef: dict, n_layers: int, *, n_heads: int, tasks: int,
                                key: str = "multi.head_selection") -> dict[str, dict | None]:
    """The decoder side of a head-selection definition: the ``ModelConfig`` override
    ``{"decoder_self_attention": {"type": "head_select", strategy, candidates, tasks, layers} | None}``
    (None when ``decoder_self`` is not in ``apply_to``: plain decoder attention). ValueError naming
    ``<key>.<option>``."""
    opts = head_selection_options_from(hdef, n_heads=n_heads, tasks=tasks, key=key)
    if "decoder_self" not in opts["apply_to"]:
        return {"decoder_self_attention": None}
    spec = {"type": "head_select", "strategy": opts["strategy"], "candidates": opts["candidates"], "tasks": tasks}
    if opts["estimator"] != "paper":
        spec["estimator"] = opts["estimator"]
    return {"decoder_self_attention": decoder_attention_spec(spec, n_layers, key=key, n_heads=n_heads)}

# ----------------------------------------------------------------------------------------
# Controls for Algorithm 1 (params.yaml `controls`, stage train_control): the local system's
# per-layer windows replaced by a simpler choice of the same budget, so that a comparison with
# `local` tells whether Algorithm 1's per-layer assignment matters or only the windows' mean width.

#: The control systems: ``local_uniform`` (every local layer at one window, the rounded mean of
#: Algorithm 1's windows) and ``local_shuffled`` (Algorithm 1's windows permuted across the local layers).
CONTROL_SYSTEMS = ("local_uniform", "local_shuffled")


def _check_windows(windows: Sequence[Any], key: str) -> list[int]:
    if not windows:
        raise ValueError(f"{key}: no windows")
    for i, w in enumerate(windows):
        odd_window(w, f"{key}[{i}]: window")
    return list(windows)


def uniform_control_window(windows: Sequence[int], *, key: str = "windows") -> int:
    """The ``local_uniform`` control's one window: the mean m of ``windows`` rounded to the nearest
    odd integer, a tie (m an even integer, equally far from m - 1 and m + 1) rounded up, so
    ``w = 2 * floor(m / 2) + 1`` (>= 1 for windows >= 1). Computed on integers (``sum // (2 n)``): no
    float noise can decide a tie. E.g. 1 1 3 5 3 15 17 3 13 (m = 6.78) -> 7; m = 6 -> 7; m = 5.9 -> 5;
    all windows 1 -> 1. ValueError naming ``key`` for no window or one that is not a positive odd int."""
    ws = _check_windows(windows, key)
    return 2 * (sum(ws) // (2 * len(ws))) + 1


def shuffled_control_windows(windows: Sequence[int], seed: int, *, key: str = "windows") -> list[int]:
    """The ``local_shuffled`` control's windows: ``windows`` permuted with a fixed seed, so exactly the
    same multiset in another layer order, the same permutation for the same seed and length.

    A Fisher-Yates shuffle driven by ``random.Random(seed).random()``: the one stream Python promises
    to keep across versions (``random.shuffle``'s integer draws are not promised). The permutation may
    leave some windows (or, rarely, all) in place; the result records what was trained."""
    import random

    out = _check_windows(windows, key)
    rng = random.Random(seed)
    for i in range(len(out) - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        out[i], out[j] = out[j], out[i]
    return out


def control_windows(control: str, windows: Sequence[int], *, shuffle_seed: int, key: str = "windows") -> list[int]:
    """The local layers' windows of ``control`` (one of :data:`CONTROL_SYSTEMS`) from Algorithm 1's
    ``windows`` (one per local layer). ValueError naming the control or ``key``."""
    if control == "local_uniform":
        return [uniform_control_window(windows, key=key)] * len(windows)
    if control == "local_shuffled":
        return shuffled_control_windows(windows, shuffle_seed, key=key)
    raise ValueError(f"unknown control {control!r}; known: {list(CONTROL_SYSTEMS)}")


def control_attention_spec(local_spec: Sequence[dict], control: str, *, shuffle_seed: int,
                           key: str = "encoder_attention") -> list[dict]:
    """The per-layer encoder spec of ``control`` from the local system's spec (layers full, then
    local with Algorithm 1's windows): the full layers as they are, the local layers' windows
    replaced by :func:`control_windows`. ValueError naming ``key`` for a layer that is neither full nor
    local, or a spec without local layers."""
    local = [i for i, s in enumerate(local_spec) if s.get("type") == "local"]
    other = [i for i, s in enumerate(local_spec) if s.get("type") not in ("full", "local")]
    if other:
        raise ValueError(f"{key}[{other[0]}] (layer {other[0] + 1}): a control replaces the windows of full/local "
                         f"specs only, got {local_spec[other[0]]!r}")
    if not local:
        raise ValueError(f"{key}: no local layer, nothing for a control to replace")
    new = control_windows(control, [local_spec[i]["window"] for i in local], shuffle_seed=shuffle_seed,
                          key=f"{key} windows")
    out = [dict(s) for s in local_spec]
    for i, w in zip(local, new):
        out[i]["window"] = w
    return out
