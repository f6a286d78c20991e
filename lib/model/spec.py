"""Per-layer encoder attention specs (which layers are full, which local with which window)."""
from __future__ import annotations

from typing import Any, Sequence


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
