"""The prepared manifests ``<split>.tsv`` (lib/data/prepare.py writes them): format and reader.
No torch, so that stages which only read manifests (corpus_stats) start fast."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from lib.io import InputError

__all__ = ["MANIFEST_COLUMNS", "read_manifest", "tsv_writer"]

MANIFEST_COLUMNS = ("id", "audio", "n_frames", "src_text", "tgt_text", "speaker")


def tsv_writer(f: Any) -> Any:
    # No quoting and no escaping: fields never hold tabs or line breaks (checked upfront), so
    # every line splits on "\t" into exactly the original strings.
    return csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, quotechar=None, escapechar=None,
                      lineterminator="\n")


PREPARE_REMEDY = "; it is written by the prepare stage: `dvc repro` writes it again"
"""What a message about a damaged prepared file ends with (the feature store's too)."""


def read_manifest(path: Path) -> list[dict[str, str]]:
    """Rows of a manifest written by :func:`lib.data.prepare.prepare_pair` as dicts keyed by :data:`MANIFEST_COLUMNS`.
    :class:`lib.io.InputError` (a ValueError) names the file and line of a header or row of another
    shape, an ``n_frames`` that is not a count, or bytes that are not UTF-8 (a damaged or truncated file)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            header = f.readline().rstrip("\n").split("\t")
            if tuple(header) != MANIFEST_COLUMNS:
                raise InputError(f"{path}: header {header} is not {list(MANIFEST_COLUMNS)}{PREPARE_REMEDY}")
            rows = []
            for lineno, line in enumerate(f, start=2):
                fields = line.rstrip("\n").split("\t")
                if len(fields) != len(MANIFEST_COLUMNS):
                    raise InputError(f"{path}:{lineno}: {len(fields)} fields, expected {len(MANIFEST_COLUMNS)}{PREPARE_REMEDY}")
                row = dict(zip(MANIFEST_COLUMNS, fields))
                if not (row["n_frames"].isascii() and row["n_frames"].isdigit()):
                    raise InputError(f"{path}:{lineno}: n_frames {row['n_frames']!r} is not a count of frames{PREPARE_REMEDY}")
                rows.append(row)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason}){PREPARE_REMEDY}") from None
    return rows
