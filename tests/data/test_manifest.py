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


@pytest.mark.parametrize("n_frames", ["abc", "-5", "1.5", ""])
def test_an_n_frames_that_is_no_count_names_its_line(tmp_path: Path, n_frames: str) -> None:
    """A manifest is read by every stage after prepare: a damaged n_frames stops naming the file and the line
    (an InputError, which a stage prints as one line), not as int()'s bare ValueError in the middle of a run."""
    from lib.io import InputError

    path = tmp_path / "train.tsv"
    bad = ROW[:2] + [n_frames] + ROW[3:]
    path.write_text("\t".join(MANIFEST_COLUMNS) + "\n" + "\t".join(ROW) + "\n" + "\t".join(bad) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=rf"train\.tsv:3: n_frames '{n_frames}' is not a count of frames; .*prepare"):
        read_manifest(path)


def test_damaged_manifests_are_input_errors(tmp_path: Path) -> None:
    """Truncated (a row cut short), emptied, or not UTF-8: each an InputError naming the file."""
    from lib.io import InputError

    path = tmp_path / "dev.tsv"
    full = "\t".join(MANIFEST_COLUMNS) + "\n" + "\t".join(ROW) + "\n"
    path.write_text(full[: len(full) - 20], encoding="utf-8")
    with pytest.raises(InputError, match=r"dev\.tsv:2: \d fields, expected 6"):
        read_manifest(path)
    path.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match=r"dev\.tsv: header \[''\] is not"):
        read_manifest(path)
    path.write_bytes(full.encode("utf-8") + b"\xff\xfe\n")
    with pytest.raises(InputError, match=r"dev\.tsv: not UTF-8 text"):
        read_manifest(path)
