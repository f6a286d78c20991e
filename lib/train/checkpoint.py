"""Checkpoints: atomic save, safe load (``weights_only=True``), params fingerprints, averaging.

A training run keeps in its checkpoint folder:

- ``last.pt``: everything needed to resume bit-exactly (model, optimizer, update counter, data
  position, RNG states, fingerprint of the training config);
- ``best.pt``: model weights with the best dev score so far;
- ``snapshots/update_<n>.pt``: model weights of the last K saves, averaged into ``avg_last_k.pt``
  at the end (fairseq's ``average_checkpoints.py``).

A ``last.pt`` whose fingerprint differs from the current run's config is never resumed silently:
the run says which keys differ, moves it aside and starts from scratch.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import torch

from lib.io import atomic_write_bytes


def fingerprint(config: dict[str, Any]) -> str:
    """Stable hash of a JSON-serialisable config (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """``torch.save`` to a temporary file, then rename: a kill never leaves a truncated checkpoint."""
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (no arbitrary code from pickles)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - re-raised with the file named
        raise RuntimeError(f"{path}: cannot load checkpoint ({e})") from e


def config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys whose values differ between two nested configs, as dotted paths."""
    keys = sorted(set(old) | set(new))
    out = []
    for k in keys:
        a, b = old.get(k, "<missing>"), new.get(k, "<missing>")
        key = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, key + ".")
        elif a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def average_state_dicts(paths: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of model state dicts (floating tensors; others taken from the last)."""
    if not paths:
        raise ValueError("no checkpoints to average")
    acc: dict[str, torch.Tensor] = {}
    last: dict[str, torch.Tensor] = {}
    for p in paths:
        sd = load(p)["model"]
        last = sd
        for k, v in sd.items():
            if v.is_floating_point():
                acc[k] = acc[k] + v.double() if k in acc else v.double().clone()
    return {k: (acc[k] / len(paths)).to(v.dtype) if k in acc else v for k, v in last.items()}
