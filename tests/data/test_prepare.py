"""prepare_pair end to end on tiny corpora: manifests, stores, vocabularies, report, atomicity."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import lib.data.prepare as prep
from lib.data.features import fbank
from lib.data.mustc import CorpusError, MustcV1Reader, load_talk
from lib.data.manifest import MANIFEST_COLUMNS, read_manifest
from lib.data.prepare import prepare_pair
from lib.params import PrepareParams
from lib.data.store import read_features
from lib.data.vocab import load_sentencepiece

SR = 16000


def planted_spec(spec_factory, talk_factory) -> dict:
    """The default spec plus a 4th train talk (ted_4; dev is then ted_5, tst-COMMON ted_6) with one too-short, one empty-text and one too-long segment
    (too long for max_frames_train=150, i.e. > 1.5 s); dev gets a 2 s segment that must be kept."""
    spec = spec_factory()
    extra = talk_factory(2, 7, speaker="spk.5")
    t = extra[-1]["offset"] + extra[-1]["duration"] + 0.1
    extra += [
        {"offset": round(t, 2), "duration": 0.05, "src": "uh", "tgt": "äh", "speaker": "spk.5"},  # 4 frames
        {"offset": round(t + 0.2, 2), "duration": 0.6, "src": "applause", "tgt": "   ", "speaker": "spk.5"},
        {"offset": round(t + 0.9, 2), "duration": 2.0, "src": "a very long one", "tgt": "ein sehr langes",
         "speaker": "spk.5"},
    ]
    spec["train"].append(extra)
    d = spec["dev"][0]
    d.append({"offset": d[-1]["offset"] + d[-1]["duration"] + 0.1, "duration": 2.0, "src": "long dev",
              "tgt": "langer dev", "speaker": "spk.3"})
    return spec


CFG = dict(max_frames_train=150, asr_vocab_size=40, st_vocab_size=45)


@pytest.fixture
def planted(tmp_path: Path, corpus_builder, spec_factory, talk_factory) -> Path:
    return corpus_builder(tmp_path / "mustc", planted_spec(spec_factory, talk_factory))


def test_end_to_end(planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared" / "en-de"
    report = prepare_pair(planted, "en-de", out, PrepareParams(workers=1, **CFG), progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["report.json", "spm_asr.model", "spm_st.model"]
        + [f"{s}.{ext}" for s in ("train", "dev", "tst-COMMON") for ext in ("tsv", "fbank.npy")])
    assert json.loads((out / "report.json").read_text()) == report

    tr = report["splits"]["train"]
    assert tr["segments"] == 16 and tr["kept"] == 13 and tr["talks"] == 4
    assert tr["dropped"] == {"too_short": 1, "empty_text": 1, "too_long": 1}
    dev = report["splits"]["dev"]
    assert dev["segments"] == dev["kept"] == 4 and dev["dropped"] == {"too_short": 0, "empty_text": 0, "too_long": 0}
    assert report["splits"]["tst-COMMON"]["kept"] == 3
    assert report["vocab"]["asr"]["requested"] == 40 and report["vocab"]["st"]["requested"] == 45
    for key, name in (("asr", "spm_asr.model"), ("st", "spm_st.model")):
        sp = load_sentencepiece(out / name)
        assert sp.get_piece_size() == report["vocab"][key]["actual"] <= report["vocab"][key]["requested"]

    header = (out / "train.tsv").read_text(encoding="utf-8").split("\n")[0]
    assert header == "\t".join(MANIFEST_COLUMNS) == "id\taudio\tn_frames\tsrc_text\ttgt_text\tspeaker"
    rows = read_manifest(out / "train.tsv")
    ids = [r["id"] for r in rows]
    assert "ted_4_2" not in ids and "ted_4_3" not in ids and "ted_4_4" not in ids  # short, empty, long
    assert ids[:4] == ["ted_1_0", "ted_1_1", "ted_1_2", "ted_1_3"] and ids[-2:] == ["ted_4_0", "ted_4_1"]
    assert sum(int(r["n_frames"]) for r in rows) == tr["kept_frames"] == np.load(out / "train.fbank.npy").shape[0]

    # every stored feature equals a direct fbank of the cut
    from lib.data.mustc import read_split
    segs = {s.id: s for s in read_split(planted, "en-de", "train")}
    for r in rows:
        seg = segs[r["id"]]
        talk = load_talk(seg.wav)
        wave = talk[round(seg.offset * SR): round((seg.offset + seg.duration) * SR)]
        feats = read_features(out, r["audio"])
        assert feats.shape == (int(r["n_frames"]), 80)
        np.testing.assert_array_equal(feats, fbank(wave))
        assert r["src_text"] == seg.src_text and r["tgt_text"] == seg.tgt_text and r["speaker"] == seg.speaker
    # each vocabulary is trained on its own side of the kept train text: spm_asr covers every transcript and
    # spm_st every translation with no unknown piece (German has letters, z and v, that no English line has)
    for name, column in (("spm_asr.model", "src_text"), ("spm_st.model", "tgt_text")):
        sp = load_sentencepiece(out / name)
        for r in rows:
            ids = sp.encode(r[column])
            assert sp.unk_id() not in ids and sp.decode(ids) == r[column], (name, r[column])
    asr_sp = load_sentencepiece(out / "spm_asr.model")  # while the transcripts' vocabulary lacks them
    assert any(asr_sp.unk_id() in asr_sp.encode(r["tgt_text"]) for r in rows)
    dev_rows = read_manifest(out / "dev.tsv")
    assert max(int(r["n_frames"]) for r in dev_rows) > 150  # too_long applies to train only
    assert tr["kept_audio_seconds"] == pytest.approx(sum(segs[r["id"]].duration for r in rows), abs=1e-3)


def test_workers_byte_identical(planted: Path, tmp_path: Path) -> None:
    outs = []
    for w in (1, 2):
        out = tmp_path / f"w{w}"
        prepare_pair(planted, "en-de", out, PrepareParams(workers=w, **CFG), progress=False)
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert names == sorted(p.name for p in outs[1].iterdir())
    for n in names:
        assert (outs[0] / n).read_bytes() == (outs[1] / n).read_bytes(), n


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_bad_corpus_leaves_no_out_dir(planted: Path, tmp_path: Path) -> None:
    (planted / "en-de" / "data" / "dev" / "wav" / "ted_5.wav").write_bytes(b"\0garbage" * 100)
    out = tmp_path / "prepared" / "en-de"
    with pytest.raises(CorpusError, match="ted_5.wav"):
        prepare_pair(planted, "en-de", out, PrepareParams(workers=2, **CFG), progress=False)
    assert not out.exists()
    assert not (tmp_path / "prepared").exists() or _leftovers(tmp_path / "prepared") == []


@pytest.mark.parametrize("where,workers", [("validation", 1), ("extraction", 1), ("extraction", 2)])
def test_failure_keeps_existing_out_dir(planted: Path, tmp_path: Path, monkeypatch, where: str, workers: int) -> None:
    out = tmp_path / "prepared" / "en-de"
    prepare_pair(planted, "en-de", out, PrepareParams(workers=1, **CFG), progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    wav = planted / "en-de" / "data" / "tst-COMMON" / "wav" / "ted_6.wav"
    if where == "validation":
        # truncated talk: its segments now run past its end
        data = wav.read_bytes()
        wav.write_bytes(data[: len(data) // 3])
    else:
        # the last talk of the last split fails to decode, after train/dev stores were written
        # into the temporary folder (forked workers inherit the patched module attribute)
        if workers > 1 and prep._start_method() != "fork":
            pytest.skip("needs the fork start method to inject the failure into workers")
        real = MustcV1Reader.load_talk

        def failing(self, path):
            if Path(path).name == "ted_6.wav":
                raise CorpusError(f"{path}: simulated decoding failure")
            return real(self, path)

        monkeypatch.setattr(MustcV1Reader, "load_talk", failing)
    match = "past the end of .*ted_6.wav" if where == "validation" else "ted_6.wav: simulated"
    with pytest.raises(CorpusError, match=match):
        prepare_pair(planted, "en-de", out, PrepareParams(workers=workers, **CFG), progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _leftovers(tmp_path / "prepared") == []


def test_segment_past_end_fails_before_work(planted: Path, tmp_path: Path) -> None:
    y = planted / "en-de" / "data" / "dev" / "txt" / "dev.yaml"
    lines = y.read_text().split("\n")
    lines[1] = lines[1].replace("offset: ", "offset: 10")  # 10x.xx s into a ~6 s talk
    y.write_text("\n".join(lines))
    with pytest.raises(CorpusError) as e:
        prepare_pair(planted, "en-de", tmp_path / "o", PrepareParams(workers=1, **CFG), progress=False)
    assert "dev.yaml" in str(e.value) and "entry 1" in str(e.value) and "ted_5.wav" in str(e.value)
    assert not (tmp_path / "o").exists()


def test_no_train_segment_left_names_the_drops(planted: Path, tmp_path: Path) -> None:
    p = planted / "en-de" / "data" / "train" / "txt" / "train.de"
    p.write_text("\n" * len(p.read_text(encoding="utf-8").split("\n")[:-1]), encoding="utf-8")  # every line empty
    with pytest.raises(CorpusError) as e:
        prepare_pair(planted, "en-de", tmp_path / "o", PrepareParams(workers=1, **CFG), progress=False)
    msg = str(e.value)
    assert "no segment of the train split survives" in msg and "empty_text" in msg and "\n" not in msg, msg
    assert not (tmp_path / "o").exists()


def test_8khz_talk_in_corpus(planted: Path, tmp_path: Path, audio_factory) -> None:
    import soundfile as sf
    wav = planted / "en-de" / "data" / "train" / "wav" / "ted_2.wav"
    sf.write(wav, audio_factory(10.0, 0, sample_rate=8000), 8000, subtype="PCM_16")
    with pytest.raises(CorpusError, match=r"ted_2\.wav.*8000"):
        prepare_pair(planted, "en-de", tmp_path / "o", PrepareParams(workers=1, **CFG), progress=False)


def test_tab_in_text_is_an_error(planted: Path, tmp_path: Path) -> None:
    p = planted / "en-de" / "data" / "train" / "txt" / "train.de"
    lines = p.read_text(encoding="utf-8").split("\n")
    lines[4] = lines[4].replace(" ", "\t", 1)
    p.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(CorpusError, match=r"train\.de:5"):
        prepare_pair(planted, "en-de", tmp_path / "o", PrepareParams(workers=1, **CFG), progress=False)


def test_config_validation(planted: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prepare.splits: must include 'train'"):
        prepare_pair(planted, "en-de", tmp_path / "o", PrepareParams(splits=("dev",), **CFG), progress=False)


@pytest.mark.slow
def test_spawn_start_method_gives_same_bytes(planted: Path, tmp_path: Path, monkeypatch) -> None:
    """Workers get everything through their task arguments: spawn (no inherited state) works too."""
    prepare_pair(planted, "en-de", tmp_path / "w1", PrepareParams(workers=1, **CFG), progress=False)
    monkeypatch.setattr(prep, "_start_method", lambda: "spawn")
    prepare_pair(planted, "en-de", tmp_path / "sp", PrepareParams(workers=2, **CFG), progress=False)
    for p in (tmp_path / "w1").iterdir():
        assert p.read_bytes() == (tmp_path / "sp" / p.name).read_bytes(), p.name


class _StubPool:
    """Runs tasks on .result(); records how many were submitted but not yet consumed."""

    def __init__(self) -> None:
        self.outstanding = 0
        self.max_outstanding = 0

    def submit(self, fn, *args):
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        pool = self

        class _Future:
            def result(self):
                pool.outstanding -= 1
                return fn(*args)

            def cancel(self):
                return False

        return _Future()


def test_in_flight_talks_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(prep, "_extract_talk", lambda task: [task])
    pool = _StubPool()
    tasks = list(range(50))
    got = []
    for out in prep._features(tasks, pool, max_in_flight=4):
        assert pool.outstanding <= 4
        got.extend(out)
    assert got == tasks and pool.max_outstanding == 4


# --------------------------------------------------------------------------- reliability (bad input)


def test_free_space_check_message() -> None:
    from lib.data.store import InsufficientSpaceError, check_free_space
    with pytest.raises(InsufficientSpaceError) as e:
        check_free_space(12_300_000_000, Path("/some/folder"), free=4_100_000_000)
    msg = str(e.value)
    assert "/some/folder" in msg and "needs 12.3 GB" in msg and "4.1 GB free" in msg
    assert "12300000000" in msg.replace(",", "") and "4100000000" in msg.replace(",", "")
    check_free_space(1_000, Path("/some/folder"), free=10**12)  # plenty: no error


def test_disk_full_fails_before_writing(planted: Path, tmp_path: Path, monkeypatch) -> None:
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    seen = []

    def tiny_disk(path):
        seen.append(Path(path))
        return usage(10**9, 10**9 - 50_000, 50_000)

    monkeypatch.setattr(shutil, "disk_usage", tiny_disk)
    parent = tmp_path / "prepared"
    with pytest.raises(OSError) as e:
        prepare_pair(planted, "en-de", parent / "en-de", PrepareParams(workers=1, **CFG), progress=False)
    msg = str(e.value)
    assert str(parent) in msg and "needs" in msg and "free" in msg, msg
    assert seen, "shutil.disk_usage was not consulted"
    assert not (parent / "en-de").exists()
    assert not parent.exists() or _leftovers(parent) == []


_REAL_EXTRACT = prep._extract_talk


def _extract_or_die(task):
    """Worker stand-in: dies like an OOM-killed process (SIGKILL) on talk ted_2."""
    import os
    import signal
    if Path(task[1]).name == "ted_2.wav":  # task: (reader, wav, items, n_mels)
        os.kill(os.getpid(), signal.SIGKILL)
    return _REAL_EXTRACT(task)


def test_killed_worker_fails_fast(planted: Path, tmp_path: Path, monkeypatch) -> None:
    if prep._start_method() != "fork":
        pytest.skip("needs the fork start method to inject the kill into workers")
    from tests.deadline import deadline
    monkeypatch.setattr(prep, "_extract_talk", _extract_or_die)
    parent = tmp_path / "prepared"
    with deadline(30), pytest.raises(RuntimeError) as e:
        prepare_pair(planted, "en-de", parent / "en-de", PrepareParams(workers=2, **CFG), progress=False)
    msg = str(e.value)
    assert "preprocessing worker" in msg and "SIGKILL" in msg and "prepare.workers" in msg, msg
    assert "out-of-memory" in msg and "pid" in msg
    assert not (parent / "en-de").exists() and _leftovers(parent) == []


def test_workers_ignore_sigint() -> None:
    import signal
    prep._init_worker()
    try:
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_INTERRUPTED_SCRIPT = r"""
import sys, time
from pathlib import Path
import lib.data.prepare as prep
from lib.data.mustc import MustcV1Reader
from lib.params import PrepareParams
from tests.corpus_factory import default_spec, make_corpus

root, out, marker = map(Path, sys.argv[1:4])
make_corpus(root, default_spec())
real = MustcV1Reader.load_talk

def slow_load(self, path):
    marker.touch()  # extraction has started (in a worker)
    time.sleep(60)
    return real(self, path)

MustcV1Reader.load_talk = slow_load
try:
    prep.prepare_pair(root, "en-de", out, PrepareParams(workers=2, asr_vocab_size=40, st_vocab_size=45),
                      progress=False)
except KeyboardInterrupt:
    sys.exit("prepare: interrupted")
"""


def test_ctrl_c_gives_no_tracebacks_and_cleans_up(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during extraction: no
    traceback from the workers, the temporary folder is gone, the exit status is non-zero."""
    import os
    import signal
    import subprocess
    import sys
    import time
    if prep._start_method() != "fork":
        pytest.skip("the slow-worker stand-in is injected by fork")
    repo = Path(__file__).resolve().parents[2]
    marker, parent = tmp_path / "started", tmp_path / "prepared"
    proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_SCRIPT, str(tmp_path / "mustc"),
                             str(parent / "en-de"), str(marker)],
                            cwd=repo, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        t0 = time.monotonic()
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() - t0 < 60, "extraction never started"
            time.sleep(0.05)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert err.count("Traceback") == 0, err
    assert "interrupted" in err
    assert not (parent / "en-de").exists() and _leftovers(parent) == []


@pytest.mark.parametrize("key", ["asr_vocab_size", "st_vocab_size"])
def test_bad_vocab_size_names_the_param(planted: Path, tmp_path: Path, key: str) -> None:
    from lib.params import ParamError
    cfg = {**CFG, key: 5}  # fewer pieces than the corpus has characters
    parent = tmp_path / "prepared"
    with pytest.raises(ParamError) as e:
        prepare_pair(planted, "en-de", parent / "en-de", PrepareParams(workers=1, **cfg), progress=False)
    msg = str(e.value)
    assert f"prepare.{key}" in msg and "5" in msg and "required_chars" in msg, msg
    assert ".tmp-" not in msg, msg
    assert not parent.exists() or _leftovers(parent) == []
