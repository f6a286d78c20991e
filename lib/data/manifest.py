"""The prepared manifests ``<split>.tsv`` (lib/data/prepare.py writes them): format and reader.
No torch, so that stages which only read manifests (corpus_stats) start fast."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST_COLUMNS", "read_manifest", "tsv_writer"]

MANIFEST_COLUMNS = ("id", "audio", "n_frames", "src_text", "tgt_text", "speaker")


def tsv_writer(f: Any) -> Any:
    # No quoting and no escaping: fields never hold tabs or line breaks (checked upfront), so
    # every line splits on "\t" into exactly the original strings.
    return csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, quotechar=None, escapechar=None,
                      lineterminator="\n")


def read_manifest(path: Path) -> list[dict[str, str]]:
    """Rows of a manifest written by :func:`lib.data.prepare.prepare_pair` as dicts keyed by :data:`MANIFEST_COLUMNS`."""
    with open(path, encoding="utf-8", newline="") as f:
        header = f.readline().rstrip("\n").split("\t")
        if tuple(header) != MANIFEST_COLUMNS:
            raise ValueError(f"{path}: header {header} is not {list(MANIFEST_COLUMNS)}")
        rows = []
        for lineno, line in enumerate(f, start=2):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != len(MANIFEST_COLUMNS):
                raise ValueError(f"{path}:{lineno}: {len(fields)} fields, expected {len(MANIFEST_COLUMNS)}")
            rows.append(dict(zip(MANIFEST_COLUMNS, fields)))
    return rows
