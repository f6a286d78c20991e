"""Which reader reads the corpus at ``data.mustc_root``: the readers, and the layouts refused by name.

:func:`open_corpus` looks at the folders (nothing is read yet) and returns the first reader of
:data:`READERS` that recognises the layout. A layout it knows but has no reader for, or a copy
unpacked one level off, is refused with one line that says what was found and what to do; anything
else gets the MuST-C reader's own error (the folder that is missing, the pairs that are present).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lib.data.mustc import MustcV1Reader
from lib.data.reader import CorpusError, CorpusReader

READERS: tuple[type[CorpusReader], ...] = (MustcV1Reader,)
"""The readers, tried in order. A new corpus format is one more class here."""


def open_corpus(root: Path, pair: str) -> CorpusReader:
    """The reader for language pair ``pair`` of the corpus at ``root`` (CorpusError naming ``root``)."""
    root = Path(root)
    src, sep, tgt = pair.partition("-")
    if not sep or not src or not tgt:
        raise CorpusError(f"{root / pair}: language pair must look like 'en-de', got {pair!r}")
    if root.exists() and not root.is_dir():
        raise CorpusError(f"{root}: a file, not the corpus root folder (data.mustc_root: the folder that holds {pair}/)")
    if not root.is_dir():
        raise CorpusError(f"{root}: corpus root folder does not exist (data.mustc_root)")
    for reader in READERS:
        if reader.recognises(root, pair):
            return reader(root, pair)
    _refuse_known_layouts(root, pair)
    return MustcV1Reader(root, pair)  # its read_split names what is missing


def check_corpus(root: Path, pair: str, splits: Sequence[str]) -> CorpusReader:
    """:func:`open_corpus`, then the folders of ``splits`` checked (nothing is read): what `make repro`
    (scripts/repro.py) and ``scripts/params_profile.py --mustc-root`` look at before DVC runs. DVC
    checks a stage's dependencies first, so a wrong root would otherwise stop ``prepare`` with DVC's
    "No such file or directory" for ``<root>/<pair>``, which names neither data.mustc_root nor what to
    set."""
    reader = open_corpus(root, pair)
    reader.check_layout(splits)
    return reader


def _refuse_known_layouts(root: Path, pair: str) -> None:
    """CorpusError for a layout this module recognises but no reader reads."""
    names = {p.name for p in root.iterdir()}
    readers = ", ".join(r.name for r in READERS)
    if (root / "data").is_dir() and any((root / "data" / s / "txt").is_dir() for s in ("train", "dev", "tst-COMMON")):
        raise CorpusError(f"{root}: this is a language pair's folder ({root.name}/data/<split>/txt); set "
                          f"data.mustc_root to the folder above it, {root.parent}, which must hold {pair}/")
    archives = sorted(n for n in names if n.endswith((".tar.gz", ".tgz")) and pair in n)
    if archives:
        raise CorpusError(f"{root}: holds {archives[0]} but no {pair}/ folder; unpack it first "
                          f"(tar -xzf {root / archives[0]} -C {root})")
    nested = sorted(p for p in root.iterdir() if p.is_dir() and (p / pair / "data").is_dir())
    if nested:
        raise CorpusError(f"{root}: {pair}/ is one level down, in {nested[0].name}/; set data.mustc_root to {nested[0]}")
    if "clips" in names and any(n.endswith(".tsv") for n in names):
        raise CorpusError(f"{root}: a Common Voice / CoVoST 2 layout (clips/ and TSV files); no reader reads it "
                          f"(readers: {readers}; a new one is a CorpusReader in lib/data/reader.py, listed in "
                          f"lib/data/corpora.py)")
