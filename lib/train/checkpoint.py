"""Training checkpoints: params fingerprints, snapshot averaging. The file primitives (atomic save,
``weights_only`` load) and the model file are lib/model/checkpoint.py's; re-exported here.

A training run keeps in its checkpoint folder:

- ``last.pt``: everything needed to resume bit-exactly (model, optimizer, update counter, data
  position, RNG states, fingerprint of the training config);
- ``best.pt``: model weights with the best dev score so far;
- ``snapshots/update_<n>.pt``: model weights of the last K saves of the schedule (every
  ``save_every`` updates and the last), averaged into ``avg_last_k.pt`` at the end (fairseq's
  ``average_checkpoints.py``). Which updates those are follows from the schedule
  (:func:`averaged_updates`), not from the files that happen to be there: a save off the schedule (a
  pre-emption's) writes no snapshot, and a snapshot missing at the end stops the run naming it
  instead of averaging the others.

A ``last.pt`` whose fingerprint differs from the current run's config is never resumed silently:
the run says which keys differ, sets it aside with its snapshots and starts from scratch; changing
the params back brings it back (lib/train/resume.py). Snapshots record the run's fingerprint, and the
average refuses one of another config.

``prev.pt`` is the training state one save back (:func:`save_keeping_previous`): a ``last.pt`` that
cannot be read (a half-written file after a disk fault, a truncated copy) falls back to it
(lib/train/loop.py ``decide_resume``), at the cost of the updates between the two saves.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from lib.model.checkpoint import load, save  # noqa: F401 (re-exported: the training state's files)
from lib.model.checkpoint import CheckpointError, upgrade_state_dict


def fingerprint(config: dict[str, Any]) -> str:
    """Stable hash of a JSON-serialisable config (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


PREV = "prev.pt"


def canonical_tree(obj: Any) -> Any:
    """``obj`` with every plain dict, list and tuple rebuilt and every string interned, so that pickle
    (torch.save) writes the same bytes for equal values whichever objects they were built from. Pickle
    writes an object seen before as a back-reference: a resumed run's history rows and optimizer groups,
    read from last.pt, hold other string objects than an uninterrupted run's (the code's literals), and
    a state saved from them would differ in its bytes though not in its values. Other types (tensors,
    a model's OrderedDict state dict, whose keys every run builds alike) are kept as they are."""
    if type(obj) is str:
        return sys.intern(obj)
    if type(obj) is dict:
        return {canonical_tree(k): canonical_tree(v) for k, v in obj.items()}
    if type(obj) is list:
        return [canonical_tree(v) for v in obj]
    if type(obj) is tuple:
        return tuple(canonical_tree(v) for v in obj)
    return obj


def save_keeping_previous(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` (atomically, :func:`save`) and keep the file it replaces as
    ``prev.pt`` beside it. The old file is hard-linked (copied where links are not supported) to
    ``prev.pt`` first, so ``path`` always exists and holds a complete state: a kill at any point
    leaves the newest complete state in ``path`` and the one before it (or the same) in ``prev.pt``."""
    path = Path(path)
    if path.is_file():
        prev, tmp = path.with_name(PREV), path.with_name(f".{PREV}.link-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)
        except OSError:  # a filesystem without hard links
            shutil.copyfile(path, tmp)
        os.replace(tmp, prev)
    save(path, state)


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


def average_state_dicts(paths: list[Path], fingerprint: str | None = None) -> dict[str, torch.Tensor]:
    """Element-wise mean of model state dicts (floating tensors; others taken from the last). Keys of
    earlier versions of the code are renamed first (:func:`lib.model.checkpoint.upgrade_state_dict`, e.g.
    the snapshots of a run resumed across such a change); snapshots with other keys are refused, naming
    the file, rather than averaged over fewer; an unreadable one is refused (:class:`CheckpointError`)
    naming the checkpoint folder to delete. With ``fingerprint`` (the run's), a snapshot that records
    another run config's is refused (:class:`CheckpointError`) rather than averaged in."""
    if not paths:
        raise ValueError("no checkpoints to average")
    acc: dict[str, torch.Tensor] = {}
    last: dict[str, torch.Tensor] = {}
    for p in paths:
        try:
            snap = load(p)
        except CheckpointError as e:  # truncated or corrupt: a rerun meets it again, so say what clears it
            raise CheckpointError(f"{e}; a snapshot of the run's final average, which only training writes: "
                                  f"delete {Path(p).parent.parent} to train the run again") from e
        if fingerprint is not None and snap.get("fingerprint", fingerprint) != fingerprint:
            raise CheckpointError(f"{p}: a snapshot of another config (fingerprint {snap['fingerprint']}, this "
                                  f"run's {fingerprint}): delete {Path(p).parent.parent} to train the run again")
        sd = upgrade_state_dict(snap["model"])
        if last and sd.keys() != last.keys():
            odd = sorted(set(sd) ^ set(last))
            raise ValueError(f"{p}: its weights have other keys than {paths[0]} ({', '.join(odd[:4])}"
                             f"{', ...' if len(odd) > 4 else ''}): snapshots of different models cannot be averaged")
        last = sd
        for k, v in sd.items():
            if v.is_floating_point():
                acc[k] = acc[k] + v.double() if k in acc else v.double().clone()
    return {k: (acc[k] / len(paths)).to(v.dtype) if k in acc else v for k, v in last.items()}


def averaged_updates(save_every: int, max_updates: int, average_last: int, upto: int, start: int = 0) -> list[int]:
    """The updates whose snapshots a run averages (or keeps, ``upto`` its current update): the last
    ``average_last`` of the save schedule (every ``save_every`` updates, and ``max_updates``) in
    ``(start, upto]``; ``start`` is where this run's snapshots begin (0, or the update a fork continued
    from: the snapshots before it belong to another run)."""
    saves = list(range(save_every, min(upto, max_updates) + 1, save_every))
    if upto >= max_updates and max_updates % save_every:
        saves.append(max_updates)
    return [u for u in saves if u > start][-average_last:]


def snapshot_path(snap_dir: Path, update: int) -> Path:
    return Path(snap_dir) / f"update_{update:07d}.pt"
