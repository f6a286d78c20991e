"""Feature store: all features of one split in ONE memory-mappable ``.npy`` file.

The file holds a ``(total_frames, n_mels)`` float32 array; the utterances are consecutive row
ranges. A manifest refers to an utterance by the string ``"<file name>:<start_frame>:<n_frames>"``
(the file name relative to the store folder, so a prepared folder can be moved).

Writing is sequential with an exact total known upfront (``numpy.lib.format.open_memmap``), so
the file is written once, without growing or concatenating, and its bytes are a function of
the features alone. Reading maps the file lazily (``np.load(mmap_mode="r")``) and copies out
one utterance: random access to any utterance costs one page-cache read, with no per-utterance
files and no unzipping.

The map is sparse until written: a file system that runs full while the map is filled answers with
SIGBUS (the process dies with "Bus error", no message). Hence :func:`check_free_space` (callers
check the planned total before writing anything) and the writer reserves the file's blocks
upfront (``posix_fallocate``), which turns a disk filled by someone else meanwhile into an
:class:`InsufficientSpaceError` at creation instead of a crash mid-write.
"""
from __future__ import annotations

import errno
import os
import shutil
from collections import OrderedDict
from pathlib import Path
from types import TracebackType
from typing import Iterable

import numpy as np
from numpy.lib.format import open_memmap

from lib.data.manifest import PREPARE_REMEDY
from lib.io import InputError



SPACE_MARGIN_BYTES = 64 * 1024**2
"""Fixed part of :func:`check_free_space`'s safety margin (see there)."""
SPACE_MARGIN_FRACTION = 0.01
"""Proportional part of :func:`check_free_space`'s safety margin."""
_NPY_HEADER_BYTES = 4096  # an upper bound: numpy writes a 128-byte header for a 2-d float32 array


class InsufficientSpaceError(OSError):
    """The target file system has too little free space for the output (message: folder, bytes)."""


def store_nbytes(total_frames: int, n_mels: int) -> int:
    """Upper bound of the size in bytes of a store file of ``total_frames`` rows."""
    return _NPY_HEADER_BYTES + 4 * int(total_frames) * int(n_mels)


def human_bytes(n: float) -> str:
    """``12.3 GB`` (decimal units, as ``df -H`` prints them)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _existing_ancestor(folder: Path) -> Path:
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_free_space(needed: int, folder: Path, free: int | None = None) -> None:
    """Raise :class:`InsufficientSpaceError` unless ``folder``'s file system has room for
    ``needed`` bytes plus a safety margin, before anything is written.

    The margin, ``max(64 MiB, 1 % of needed)``, covers what the byte count leaves out (the
    manifests, vocabularies and report next to the stores, file system metadata) and leaves the
    disk not filled to its last byte. ``free`` defaults to ``shutil.disk_usage`` of ``folder``
    (or of its nearest existing ancestor, when it does not exist yet). Without this check a full
    disk shows up as SIGBUS in the middle of writing a memory-mapped store.
    """
    if free is None:
        free = shutil.disk_usage(_existing_ancestor(folder)).free
    margin = max(SPACE_MARGIN_BYTES, int(SPACE_MARGIN_FRACTION * needed))
    if needed + margin > free:
        raise InsufficientSpaceError(
            f"{folder}: not enough free disk space: needs {human_bytes(needed)} ({needed:,} bytes, plus a "
            f"{human_bytes(margin)} safety margin), {human_bytes(free)} free ({free:,} bytes)"
        )


def make_ref(file_name: str, start: int, n_frames: int) -> str:
    """The manifest reference ``"<file name>:<start_frame>:<n_frames>"``."""
    return f"{file_name}:{start}:{n_frames}"


def parse_ref(ref: str) -> tuple[str, int, int]:
    """Inverse of :func:`make_ref`; :class:`lib.io.InputError` (a ValueError) naming ``ref`` when malformed."""
    try:
        name, start, n = ref.rsplit(":", 2)
        start_i, n_i = int(start), int(n)
    except ValueError:
        raise InputError(f"malformed feature reference {ref!r}, expected '<file>:<start>:<n_frames>'") from None
    if not name or start_i < 0 or n_i < 0:
        raise InputError(f"malformed feature reference {ref!r}, expected '<file>:<start>:<n_frames>'")
    return name, start_i, n_i


class FeatureStoreWriter:
    """Sequential writer of one store file with exactly ``total_frames`` rows.

    ``write(feats)`` appends one utterance and returns its reference string; ``close()`` flushes
    and checks that exactly ``total_frames`` rows were written (ValueError otherwise, so that a
    wrong upfront count cannot leave uninitialised rows). Use as a context manager; on an
    exception inside the ``with`` block the file is closed without the count check (the caller's
    temporary folder is discarded anyway).
    """

    def __init__(self, path: Path, total_frames: int, n_mels: int = 80) -> None:
        if total_frames < 0 or n_mels < 1:
            raise ValueError(f"{path}: bad store shape ({total_frames}, {n_mels})")
        self.path = Path(path)
        self.total_frames = int(total_frames)
        self.n_mels = int(n_mels)
        self.position = 0
        self._mm: np.memmap | None = open_memmap(
            self.path, mode="w+", dtype=np.float32, shape=(self.total_frames, self.n_mels)
        )
        try:
            _reserve(self.path)
        except BaseException:
            self._mm = None
            raise

    def write(self, feats: np.ndarray) -> str:
        """Append ``feats`` ``(n, n_mels)``; returns ``"<file name>:<start>:<n>"``."""
        if self._mm is None:
            raise ValueError(f"{self.path}: store already closed")
        feats = np.asarray(feats)
        if feats.ndim != 2 or feats.shape[1] != self.n_mels:
            raise ValueError(f"{self.path}: expected features of shape (n, {self.n_mels}), got {feats.shape}")
        n = feats.shape[0]
        if self.position + n > self.total_frames:
            raise ValueError(
                f"{self.path}: writing {n} frames at row {self.position} overflows the store of "
                f"{self.total_frames} frames"
            )
        start = self.position
        self._mm[start : start + n] = feats
        self.position += n
        return make_ref(self.path.name, start, n)

    def close(self, check: bool = True) -> None:
        """Flush and close; with ``check``, ValueError unless exactly ``total_frames`` were written."""
        if self._mm is None:
            return
        mm, self._mm = self._mm, None
        mm.flush()
        del mm
        if check and self.position != self.total_frames:
            raise ValueError(
                f"{self.path}: wrote {self.position} frames but the store was created for {self.total_frames}"
            )

    def __enter__(self) -> FeatureStoreWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(check=exc_type is None)


def _reserve(path: Path) -> None:
    """Allocate every block of ``path`` now (see the module docstring); InsufficientSpaceError if
    the file system cannot. A no-op where the file system or OS does not support it."""
    if not hasattr(os, "posix_fallocate"):
        return
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, size)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                free = shutil.disk_usage(path.parent).free
                raise InsufficientSpaceError(
                    f"{path}: no space left to reserve {human_bytes(size)} ({size:,} bytes) for the feature "
                    f"store; {human_bytes(free)} free"
                ) from None
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise


_CACHE_SIZE = 8
_handles: OrderedDict[tuple[str, int, int, int], np.ndarray] = OrderedDict()


def _open(path: Path) -> np.ndarray:
    """A cached read-only memory map of ``path``; keyed on (path, inode, size, mtime) so that a
    store file replaced by a new prepare run is re-opened rather than read stale."""
    st = os.stat(path)
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    arr = _handles.get(key)
    if arr is not None:
        _handles.move_to_end(key)
        return arr
    try:
        arr = np.load(path, mmap_mode="r")
    except (ValueError, EOFError, OSError) as e:  # truncated, empty, not .npy: numpy's messages name no file
        if isinstance(e, OSError) and e.errno in (errno.ENOMEM, errno.EMFILE, errno.ENFILE):
            raise  # the machine, not the file: rewriting it would not help
        raise InputError(f"{path}: not a readable feature store ({e}){PREPARE_REMEDY}") from None
    if arr.ndim != 2 or arr.dtype != np.float32:
        raise InputError(f"{path}: not a feature store (shape {arr.shape}, dtype {arr.dtype}){PREPARE_REMEDY}")
    _handles[key] = arr
    while len(_handles) > _CACHE_SIZE:
        _handles.popitem(last=False)
    return arr


def read_features(store_dir: Path, ref: str) -> np.ndarray:
    """The ``(n_frames, n_mels)`` float32 features that ``ref`` points to in ``store_dir``.

    Returns a private, writable copy (safe for ``torch.from_numpy`` and independent of the map).
    :class:`lib.io.InputError` (a ValueError) naming the reference when it is malformed or out of the
    file's range, or the file when it is not a feature store.
    """
    name, start, n = parse_ref(ref)
    path = Path(store_dir) / name
    arr = _open(path)
    if start + n > arr.shape[0]:
        raise InputError(f"{path}: reference {ref!r} is out of range (store has {arr.shape[0]} frames){PREPARE_REMEDY}")
    return np.array(arr[start : start + n], dtype=np.float32, copy=True)


def check_refs(store_dir: Path, refs: Iterable[str], where: str) -> None:
    """Check that every reference of ``refs`` (a manifest's ``audio`` column; ``where`` names the manifest)
    parses and lies inside its store file, opening each file once as :func:`read_features` does: a
    truncated, replaced or damaged store stops a run when its dataset is built, before any batch,
    instead of at the first batch that reaches the damage. Reads no features. :class:`lib.io.InputError`
    naming the manifest, the reference and the file."""
    ends: dict[str, tuple[int, str]] = {}
    for ref in refs:
        try:
            name, start, n = parse_ref(ref)
        except InputError as e:
            raise InputError(f"{where}: {e}{PREPARE_REMEDY}") from None
        if start + n > ends.get(name, (-1, ""))[0]:
            ends[name] = (start + n, ref)
    for name, (end, ref) in ends.items():
        path = Path(store_dir) / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: feature store missing (named by {where}){PREPARE_REMEDY}")
        rows = _open(path).shape[0]
        if end > rows:
            raise InputError(f"{path}: {where} references {ref!r}, past the store's {rows} frames (a truncated "
                             f"or replaced store){PREPARE_REMEDY}")
