"""lib/io.py: atomic writers sweep the stale temporaries of a killed writer (never a live one's) and
create folders with the mode mkdir would give."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from lib.io import atomic_dir, atomic_write_bytes


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The pid of a running process that is not this one (a concurrent writer, e.g. a DVC queue worker)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_atomic_write_bytes_sweeps_stale_temps_of_the_same_target_only(tmp_path: Path, live_pid: int) -> None:
    dead = _dead_pid()
    stale = tmp_path / f".out.json.tmp-{dead}"
    stale.write_bytes(b"half")
    live = tmp_path / f".out.json.tmp-{live_pid}"
    live.write_bytes(b"being written")
    other = tmp_path / f".other.json.tmp-{dead}"  # another target's temporary: not ours to judge
    other.write_bytes(b"x")
    atomic_write_bytes(tmp_path / "out.json", b"{}")
    assert (tmp_path / "out.json").read_bytes() == b"{}"
    assert not stale.exists()
    assert live.exists() and other.exists()


def test_atomic_dir_sweeps_stale_temp_folders(tmp_path: Path, live_pid: int) -> None:
    dead = _dead_pid()
    stale_dir = tmp_path / f".en-de.tmp-{dead}-0a1b2c3d"
    (stale_dir / "sub").mkdir(parents=True)
    (stale_dir / "sub" / "f.npy").write_bytes(b"x")
    stale_old = tmp_path / f".en-de.old-{dead}"  # killed between its two renames
    stale_old.mkdir()
    live_dir = tmp_path / f".en-de.tmp-{live_pid}-00ff00ff"
    live_dir.mkdir()
    unrelated = tmp_path / f".en-de-x.tmp-{dead}"
    unrelated.mkdir()
    with atomic_dir(tmp_path / "en-de") as tmp:
        assert tmp.name.startswith(f".en-de.tmp-{os.getpid()}")  # the owner's pid is in the name
        (tmp / "a.txt").write_text("a")
    assert (tmp_path / "en-de" / "a.txt").read_text() == "a"
    assert not stale_dir.exists() and not stale_old.exists()
    assert live_dir.exists() and unrelated.exists()


def test_atomic_dir_mode_is_what_mkdir_gives(tmp_path: Path) -> None:
    """Not tempfile.mkdtemp's 0700: a stage's output must have the mode `dvc checkout` gives it."""
    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "f").write_text("x")
        (tmp_path / "ref").mkdir()
    finally:
        os.umask(old)
    mode = (tmp_path / "out").stat().st_mode & 0o777
    assert mode == 0o755 == (tmp_path / "ref").stat().st_mode & 0o777


def test_read_json_names_the_file_the_stage_and_what_is_wrong(tmp_path: Path) -> None:
    from lib.io import InputError, read_json

    path = tmp_path / "m.json"
    with pytest.raises(FileNotFoundError, match=r"m\.json: missing \(written by the train_local@en-it-2 stage\)"):
        read_json(path, "train_local@en-it-2")
    path.write_text('{"bleu": 1.0, "chrf": 2.0}')
    assert read_json(path, "x", keys=("bleu", "chrf")) == {"bleu": 1.0, "chrf": 2.0}
    with pytest.raises(InputError, match=r"m\.json: no 'wer' \(written by the x stage\); rerun x"):
        read_json(path, "x", keys=("bleu", "wer"))
    path.write_text('{"bleu": 1.')
    with pytest.raises(InputError, match=r"m\.json: not valid JSON \(.*\) \(written by the x stage\); rerun x"):
        read_json(path, "x")
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(InputError, match="not valid JSON"):
        read_json(path)
    assert issubclass(InputError, ValueError)


@pytest.mark.parametrize("text, shown", [('{"bleu": "abc"}', "'abc'"), ('{"bleu": null}', "None"),
                                         ('{"bleu": NaN}', "nan"), ('{"bleu": true}', "True"),
                                         ('{"bleu": [1]}', r"\[1\]")])
def test_read_json_numbers_must_be_finite_numbers(tmp_path: Path, text: str, shown: str) -> None:
    """A metric the report computes with (BLEU, WER) that is not a number stops naming the file and the key,
    not as a TypeError from deep inside the statistics or a Markdown cell with 'nan'."""
    from lib.io import InputError, read_json

    path = tmp_path / "seed1.json"
    path.write_text(text)
    with pytest.raises(InputError,
                       match=rf"seed1\.json: 'bleu' is {shown}, not a finite number \(written by the x stage\); rerun x"):
        read_json(path, "x", numbers=("bleu",))
    path.write_text('{"bleu": 12, "chrf": 40.5}')
    assert read_json(path, "x", numbers=("bleu", "chrf")) == {"bleu": 12, "chrf": 40.5}
    with pytest.raises(InputError, match=r"no 'wer'"):
        read_json(path, "x", numbers=("wer",))
