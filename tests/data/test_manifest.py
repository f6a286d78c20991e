"""lib/data/manifest.py: a manifest reads back as the rows written, and a header or row of another shape
stops naming the file and the line."""
from __future__ import annotations

from pathlib import Path

import pytest

from lib.data.manifest import MANIFEST_COLUMNS, read_manifest, tsv_writer

ROW = ["ted_1_0", "train.fbank.npy:0:120", "120", "  two  spaces ", "grüße \u2028 inside", "spk.1"]


def test_rows_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = tsv_writer(f)
        w.writerow(MANIFEST_COLUMNS)
        w.writerow(ROW)
        w.writerow(["ted_1_1", "train.fbank.npy:120:7", "7", "", "x", "spk.2"])
    rows = read_manifest(path)
    assert rows[0] == dict(zip(MANIFEST_COLUMNS, ROW)) and rows[1]["src_text"] == "" and len(rows) == 2


@pytest.mark.parametrize("extra, n", [(["one more"], 7), ([], 5)])
def test_a_row_of_another_width_names_its_line(tmp_path: Path, extra: list[str], n: int) -> None:
    path = tmp_path / "dev.tsv"
    fields = ROW + extra if extra else ROW[:-1]
    path.write_text("\t".join(MANIFEST_COLUMNS) + "\n" + "\t".join(ROW) + "\n" + "\t".join(fields) + "\n",
                    encoding="utf-8")
    with pytest.raises(ValueError, match=rf"dev\.tsv:3: {n} fields, expected 6"):
        read_manifest(path)


def test_another_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dev.tsv"
    path.write_text("id\taudio\tn_frames\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"dev\.tsv: header \['id', 'audio', 'n_frames'\] is not"):
        read_manifest(path)
