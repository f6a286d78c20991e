"""Feature store: one memory-mappable .npy per split, references '<file>:<start>:<n>'."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from lib.data.store import FeatureStoreWriter, make_ref, parse_ref, read_features


def _utts(seed: int = 0, lengths=(5, 17, 1, 40)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, 80)).astype(np.float32) for n in lengths]


def test_round_trip(tmp_path: Path) -> None:
    utts = _utts()
    with FeatureStoreWriter(tmp_path / "train.fbank.npy", sum(len(u) for u in utts)) as w:
        refs = [w.write(u) for u in utts]
    assert refs == ["train.fbank.npy:0:5", "train.fbank.npy:5:17", "train.fbank.npy:22:1", "train.fbank.npy:23:40"]
    for ref, u in zip(refs, utts):
        got = read_features(tmp_path, ref)
        assert got.dtype == np.float32 and got.flags.writeable
        np.testing.assert_array_equal(got, u)
    whole = np.load(tmp_path / "train.fbank.npy")
    assert whole.shape == (63, 80) and whole.dtype == np.float32
    np.testing.assert_array_equal(whole, np.concatenate(utts))


def test_bytes_depend_on_content_only(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        with FeatureStoreWriter(tmp_path / name / "x.npy", 63) as w:
            for u in _utts():
                w.write(u)
    assert (tmp_path / "a" / "x.npy").read_bytes() == (tmp_path / "b" / "x.npy").read_bytes()


def test_count_is_checked(tmp_path: Path) -> None:
    w = FeatureStoreWriter(tmp_path / "s.npy", 10)
    w.write(np.zeros((6, 80), np.float32))
    with pytest.raises(ValueError, match="overflows"):
        w.write(np.zeros((5, 80), np.float32))
    with pytest.raises(ValueError, match="wrote 6 frames"):
        w.close()
    with pytest.raises(ValueError, match="shape"):
        with FeatureStoreWriter(tmp_path / "t.npy", 10) as w2:
            w2.write(np.zeros((3, 40), np.float32))


def test_exception_inside_with_is_not_masked(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        with FeatureStoreWriter(tmp_path / "s.npy", 10) as w:
            w.write(np.zeros((2, 80), np.float32))
            raise KeyError("boom")


def test_empty_store(tmp_path: Path) -> None:
    with FeatureStoreWriter(tmp_path / "e.npy", 0):
        pass
    assert np.load(tmp_path / "e.npy").shape == (0, 80)
    assert read_features(tmp_path, "e.npy:0:0").shape == (0, 80)


def test_bad_refs(tmp_path: Path) -> None:
    with FeatureStoreWriter(tmp_path / "s.npy", 4) as w:
        w.write(np.ones((4, 80), np.float32))
    for ref in ("s.npy", "s.npy:1", "s.npy:a:2", ":0:1", "s.npy:-1:2"):
        with pytest.raises(ValueError, match="malformed"):
            read_features(tmp_path, ref)
    with pytest.raises(ValueError, match="out of range"):
        read_features(tmp_path, "s.npy:2:3")
    assert parse_ref(make_ref("a:b.npy", 3, 4)) == ("a:b.npy", 3, 4)


def test_replaced_file_is_reopened(tmp_path: Path) -> None:
    with FeatureStoreWriter(tmp_path / "s.npy", 2) as w:
        w.write(np.zeros((2, 80), np.float32))
    assert read_features(tmp_path, "s.npy:0:2").sum() == 0
    tmp = tmp_path / "new.npy"
    with FeatureStoreWriter(tmp, 3) as w:
        w.write(np.ones((3, 80), np.float32))
    os.replace(tmp, tmp_path / "s.npy")
    assert read_features(tmp_path, "s.npy:0:3").sum() == 3 * 80


def test_writer_reserves_space_and_names_the_file_when_the_disk_is_full(tmp_path: Path, monkeypatch) -> None:
    """A full disk is an error at creation (blocks reserved upfront), not SIGBUS mid-write."""
    import errno

    from lib.data import store
    if not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate on this OS")
    calls = []

    def full(fd, offset, length):
        calls.append(length)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(store.InsufficientSpaceError, match=r"x\.fbank\.npy: no space left to reserve"):
        store.FeatureStoreWriter(tmp_path / "x.fbank.npy", 1000, 80)
    assert calls and calls[0] >= 1000 * 80 * 4


def test_a_negative_frame_count_is_malformed(tmp_path: Path) -> None:
    with FeatureStoreWriter(tmp_path / "s.npy", 4) as w:
        w.write(np.ones((4, 80), np.float32))
    for ref in ("s.npy:0:-1", "s.npy:2:-2"):  # would slice rows [0, 3) / [2, 0) of the map
        with pytest.raises(ValueError, match="malformed"):
            read_features(tmp_path, ref)


def test_free_space_margin_is_the_larger_of_64_mib_and_one_percent() -> None:
    from lib.data.store import InsufficientSpaceError, check_free_space

    mib = 1024**2
    check_free_space(1_000, Path("/f"), free=1_000 + 64 * mib)  # the fixed part of the margin, exactly
    with pytest.raises(InsufficientSpaceError, match=r"plus a 67\.1 MB safety margin"):
        check_free_space(1_000, Path("/f"), free=1_000 + 64 * mib - 1)
    needed = 10 * 10**9  # 1 % = 100 MB, more than 64 MiB
    check_free_space(needed, Path("/f"), free=needed + 10**8)
    with pytest.raises(InsufficientSpaceError, match=r"plus a 100\.0 MB safety margin"):
        check_free_space(needed, Path("/f"), free=needed + 10**8 - 1)


def test_human_bytes_steps_at_every_thousand() -> None:
    from lib.data.store import human_bytes

    assert [human_bytes(n) for n in (999, 1000, 1010, 999_499, 1_010_000_000, 2.5e12, 3e15)] == \
        ["999 B", "1.0 kB", "1.0 kB", "999.5 kB", "1.0 GB", "2.5 TB", "3000.0 TB"]


def _store(tmp_path: Path) -> list[str]:
    with FeatureStoreWriter(tmp_path / "dev.fbank.npy", 63) as w:
        return [w.write(u) for u in _utts()]


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), r"not a readable feature store"),
    (lambda p: p.write_bytes(b""), r"not a readable feature store"),
    (lambda p: p.write_bytes(os.urandom(300)), r"not a readable feature store"),
    (lambda p: np.save(p, np.zeros((63, 80), np.float64)), r"not a feature store \(shape \(63, 80\), dtype float64\)"),
])
def test_a_damaged_store_is_an_input_error_naming_it(tmp_path: Path, damage, message: str) -> None:
    """numpy's own errors (``mmap length is greater than file size``, ``No data left in file``) name no file;
    a stage prints an InputError as one line naming the file and the stage to rerun."""
    from lib.io import InputError

    refs = _store(tmp_path)
    damage(tmp_path / "dev.fbank.npy")
    with pytest.raises(InputError, match=rf"dev\.fbank\.npy: {message}.*; it is written by the prepare stage"):
        read_features(tmp_path, refs[-1])


def test_check_refs_finds_a_store_too_short_for_its_manifest_before_any_read(tmp_path: Path) -> None:
    """The dataset checks every reference when it is built: a store cut short (or a manifest of another
    prepare run) stops the run then, naming the manifest and the file, not at the first batch that reaches it."""
    from lib.data.store import check_refs
    from lib.io import InputError

    refs = _store(tmp_path)
    check_refs(tmp_path, refs, "dev.tsv")  # intact: nothing to say
    np.save(tmp_path / "dev.fbank.npy", np.zeros((40, 80), np.float32))  # 63 frames written, 40 left
    with pytest.raises(InputError, match=r"dev\.fbank\.npy: dev\.tsv references 'dev\.fbank\.npy:23:40', past the "
                                         r"store's 40 frames"):
        check_refs(tmp_path, refs, "dev.tsv")
    with pytest.raises(InputError, match=r"dev\.tsv: malformed feature reference 'dev\.fbank\.npy:zz'"):
        check_refs(tmp_path, ["dev.fbank.npy:zz"], "dev.tsv")
    with pytest.raises(FileNotFoundError, match=r"other\.npy: feature store missing \(named by dev\.tsv\)"):
        check_refs(tmp_path, ["other.npy:0:1"], "dev.tsv")


@pytest.mark.parametrize("code, machine", [(errno.ENOMEM, True), (errno.EMFILE, True), (errno.EIO, False)])
def test_the_machine_failing_to_map_a_store_is_not_blamed_on_the_file(tmp_path: Path, monkeypatch, code: int,
                                                                      machine: bool) -> None:
    """Out of memory or of file handles is the machine's: it keeps its OSError (rewriting the intact file
    would not help); another OSError from opening the store names the file as damaged."""
    from lib.data import store
    from lib.io import InputError

    refs = _store(tmp_path)
    store._handles.clear()

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(store.np, "load", fail)
    expected = OSError if machine else InputError
    with pytest.raises(expected) as info:
        read_features(tmp_path, refs[0])
    assert isinstance(info.value, InputError) is not machine
