"""Atomic output helpers.

Every stage writes through these so that a crash, a kill or a bad input never leaves a
half-written file or folder where DVC (or the next stage) would take it for a finished one:
content goes to a temporary name next to the target and is renamed onto it when complete
(rename is atomic within one file system).

Temporary names carry the writer's pid (``.<name>.tmp-<pid>`` for files,
``.<name>.tmp-<pid>-<random>`` for folders, ``.<name>.old-<pid>`` for a folder being replaced).
An exception or a SIGINT/SIGTERM (stages/_common.py turns SIGTERM into KeyboardInterrupt) removes
them on the way out; a SIGKILL or a power cut cannot, so each writer first sweeps the leftovers
of the *same* target whose pid is no longer running. A live pid's temporary is never touched: it
may be a concurrent writer (e.g. another DVC queue worker).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Iterator


class InputError(ValueError):
    """An input file that exists but cannot be read as what it should be (truncated, not JSON, a key
    missing, a checkpoint torch cannot load). The message names the file, what is wrong and the stage
    that writes it; stages print it as one line (stages/_common.py ``run_stage``)."""


def read_json(path: str | os.PathLike, producer: str | None = None, keys: tuple[str, ...] = (),
              numbers: tuple[str, ...] = ()) -> Any:
    """A pipeline output's JSON. FileNotFoundError for a missing file and :class:`InputError` for one
    that is not UTF-8 JSON, lacks one of ``keys`` or ``numbers``, or holds anything but a finite number
    (int or float, not bool) under one of ``numbers``, each naming the file and (``producer``) the stage
    that writes it, to rerun."""
    path = Path(path)
    by = f" (written by the {producer} stage)" if producer else ""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing{by}")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({e}){by}; rerun {producer or 'the stage that writes it'}") from None
    missing = [k for k in dict.fromkeys((*keys, *numbers)) if not isinstance(obj, dict) or k not in obj]
    if missing:
        raise InputError(f"{path}: no {', '.join(repr(k) for k in missing)}{by}; rerun "
                         f"{producer or 'the stage that writes it'} (the file is from another version of it?)")
    for k in numbers:
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(f"{path}: {k!r} is {v!r}, not a finite number{by}; rerun "
                             f"{producer or 'the stage that writes it'}")
    return obj


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine.

    Errs on the side of "alive": a pid recycled by an unrelated process keeps the leftover
    (harmless, swept once that pid is gone), and a permission error means the process exists.
    Pids are per machine: a temporary written by another host on a shared file system may be
    judged by an unrelated local pid -- or swept if none has that number."""
    if pid <= 0:
        return True  # 0 / negative address process groups in os.kill; never ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False  # no such pid can exist
    return True


def sweep_stale(target: str | os.PathLike) -> list[Path]:
    """Remove the temporaries of ``target`` left by writers that no longer run (killed with SIGKILL,
    out of memory, power cut); return what was removed. Only exact sibling names of this target's
    pattern are considered, so another output's temporaries in the same folder are left alone."""
    target = Path(target)
    parent = target.parent
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(?:tmp|old)-(\d+)(?:-[0-9a-z_]+)?$")
    removed = []
    try:
        entries = list(parent.iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        # Two sweepers may race for the same leftover: a vanished entry is not an error.
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        removed.append(entry)
    return removed


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(path)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON atomically (stable bytes for DVC)."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _make_tmp_dir(final_dir: Path) -> Path:
    """A fresh ``.<name>.tmp-<pid>-<random>`` folder next to ``final_dir``.

    Made with ``os.mkdir(..., 0o777)``, i.e. the mode the umask gives any folder (0755 under the
    usual 022), not ``tempfile.mkdtemp``'s 0700: the temporary becomes the output, and an output
    must have the same mode whether a stage wrote it or ``dvc checkout`` restored it."""
    while True:
        tmp = final_dir.with_name(f".{final_dir.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(tmp, 0o777)
        except FileExistsError:
            continue
        return tmp


@contextlib.contextmanager
def atomic_dir(final_dir: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary directory next to ``final_dir``; on success it replaces
    ``final_dir`` (an existing one is kept intact until then); on error it is removed."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(final_dir)
    tmp = _make_tmp_dir(final_dir)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old-{os.getpid()}")
        os.replace(final_dir, old)
    os.replace(tmp, final_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
