"""Demo corpus writer: MuST-C layout, exact offsets, unique sentences, determinism."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

from lib.corpus.demo import SAMPLE_RATE, pair_seed, plan_pair, write_pair

SPLITS = {"train": 10, "dev": 3, "tst-COMMON": 4}
KW = dict(splits=SPLITS, seed=3, segments_per_talk=4, n_speakers=4, pause_seconds=[0.2, 0.5])


def test_plan_is_unique_deterministic_and_talks_do_not_span_splits() -> None:
    a = plan_pair("en-it", **KW)
    assert a == plan_pair("en-it", **KW)
    assert a != plan_pair("en-it", **{**KW, "seed": 4})
    english = [s["en"] for p in a for seg in p.segments for s in seg.sentences]
    assert len(english) == sum(SPLITS.values()) == len(set(english))
    assert [p.talk_number for p in a] == list(range(1, len(a) + 1))
    for split, n in SPLITS.items():
        assert sum(len(p.segments) for p in a if p.split == split) == n
    assert all(len(p.pauses) == len(p.segments) + 1 for p in a)
    assert all(seg.voices == (p.speaker.voice,) for p in a for seg in p.segments)  # no variation by default


def test_multi_sentence_segments_and_voice_variation() -> None:
    a = plan_pair("en-de", **KW, sentences_per_segment=[2, 4], rate_jitter=20, word_gap=[0, 5])
    segs = [seg for p in a for seg in p.segments]
    assert len(segs) == sum(SPLITS.values())
    counts = [len(seg.sentences) for seg in segs]
    assert min(counts) >= 2 and max(counts) <= 4 and len(set(counts)) > 1
    english = [s["en"] for seg in segs for s in seg.sentences]
    assert len(english) == len(set(english)) == sum(counts)
    for p in a:
        for seg in p.segments:
            assert len(seg.inner_pauses) == len(seg.sentences) - 1
            assert seg.text("en") == " ".join(s["en"] for s in seg.sentences)
            for v in seg.voices:
                assert v.name == p.speaker.voice.name and abs(v.rate - p.speaker.voice.rate) <= 20
                assert 0 <= v.word_gap <= 5
    assert len({v.rate for seg in segs for v in seg.voices}) > 3
    # the default options draw nothing extra: the default plan is unchanged by their existence
    assert plan_pair("en-de", **KW) == plan_pair("en-de", **KW, sentences_per_segment=[1, 1], rate_jitter=0,
                                                   word_gap=[0, 0])


def test_multi_sentence_segment_audio_and_text(tmp_path: Path) -> None:
    kw = {**KW, "splits": {"train": 3, "dev": 1, "tst-COMMON": 1}}
    write_pair(tmp_path, "en-es", noise_level=0.0, progress=False, sentences_per_segment=[2, 2], **kw)
    txt = tmp_path / "en-es" / "data" / "train" / "txt"
    entries = yaml.safe_load((txt / "train.yaml").read_text())
    en = (txt / "train.en").read_text(encoding="utf-8").splitlines()
    es = (txt / "train.es").read_text(encoding="utf-8").splitlines()
    assert len(entries) == len(en) == len(es) == 3
    plan = plan_pair("en-es", **kw, sentences_per_segment=[2, 2])
    first = plan[0].segments[0]
    assert en[0] == first.text("en") and es[0] == first.text("es")
    assert entries[0]["rW"] == len(en[0].split())


def test_write_pair_layout_offsets_and_workers_identical(tmp_path: Path) -> None:
    write_pair(tmp_path / "w1", "en-de", noise_level=0.001, workers=1, progress=False, **KW)
    write_pair(tmp_path / "w2", "en-de", noise_level=0.001, workers=2, progress=False, **KW)
    root = tmp_path / "w1" / "en-de" / "data"
    for split, n in SPLITS.items():
        txt = root / split / "txt"
        entries = yaml.safe_load((txt / f"{split}.yaml").read_text())
        en = (txt / f"{split}.en").read_text(encoding="utf-8").splitlines()
        de = (txt / f"{split}.de").read_text(encoding="utf-8").splitlines()
        assert len(entries) == len(en) == len(de) == n
        first = entries[0]
        wave, sr = sf.read(root / split / "wav" / first["wav"], dtype="int16")
        assert sr == SAMPLE_RATE and wave.ndim == 1
        start = round(first["offset"] * sr)
        end = round((first["offset"] + first["duration"]) * sr)
        assert end <= len(wave)
        segment = wave[start:end].astype(np.float32)
        # the cut holds speech (well above the noise floor), the pause before it does not
        assert np.abs(segment).max() > 3000
        assert np.abs(wave[:int(0.15 * sr)]).max() < 300
        assert first["rW"] == len(en[0].split()) and first["speaker_id"].startswith("spk.")
    files = sorted(p.relative_to(tmp_path / "w1") for p in (tmp_path / "w1").rglob("*") if p.is_file())
    for rel in files:
        assert (tmp_path / "w1" / rel).read_bytes() == (tmp_path / "w2" / rel).read_bytes(), rel


def test_unknown_target_language(tmp_path: Path) -> None:
    import pytest
    with pytest.raises(ValueError, match="en-fr"):
        write_pair(tmp_path, "en-fr", noise_level=0.0, progress=False, **KW)
    assert not (tmp_path / "en-fr").exists()


def _render_or_die(args):
    """Worker stand-in: dies like an OOM-killed process (SIGKILL) on talk 2."""
    import os
    import signal
    from lib.corpus import demo
    if args[0].talk_number == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return demo._render_talk(*args)


def test_killed_worker_fails_fast(tmp_path: Path, monkeypatch) -> None:
    import sys
    import pytest
    from lib.corpus import demo
    from tests.deadline import deadline
    if sys.platform != "linux":
        pytest.skip("the kill is injected into forked workers")
    monkeypatch.setattr(demo, "_render_star", _render_or_die)
    kw = {**KW, "splits": {"train": 8, "dev": 1, "tst-COMMON": 1}, "segments_per_talk": 2}
    with deadline(30), pytest.raises(RuntimeError) as e:
        write_pair(tmp_path, "en-de", noise_level=0.0, workers=2, progress=False, **kw)
    msg = str(e.value)
    assert "SIGKILL" in msg and "corpus.workers" in msg and "pid" in msg, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_room_impulse_response_decay_and_energy() -> None:
    from lib.corpus.demo import room_impulse_response

    rir = room_impulse_response(0.5, SAMPLE_RATE, np.random.default_rng(0), direct_to_reverb_db=0.0)
    assert len(rir) == SAMPLE_RATE // 2 and rir[0] == 1.0
    assert np.sum(rir[1:] ** 2) == __import__("pytest").approx(1.0)  # 0 dB: tail energy = direct energy
    # the envelope falls by 60 dB over rt60: the last tenth holds far less energy than the first
    tenth = len(rir) // 10
    first, last = np.sum(rir[1:tenth] ** 2), np.sum(rir[-tenth:] ** 2)
    assert 1e-6 < last / first < 1e-4  # exp(-6 ln 10 * 0.9) ≈ 4e-6 .. edge effects
    rir6 = room_impulse_response(0.5, SAMPLE_RATE, np.random.default_rng(0), direct_to_reverb_db=6.0)
    assert np.sum(rir6[1:] ** 2) == __import__("pytest").approx(10 ** -0.6)
    with __import__("pytest").raises(ValueError, match="rt60"):
        room_impulse_response(0.0, SAMPLE_RATE, np.random.default_rng(0))


def test_reverberate_smears_an_impulse_and_keeps_the_level() -> None:
    from lib.corpus.demo import reverberate

    wave = np.zeros(1000, dtype=np.float32)
    wave[100] = 1.0
    rir = np.array([1.0, 0.5, 0.25], dtype=np.float64)
    wet = reverberate(wave, rir)
    assert wet.dtype == np.float32 and len(wet) == len(wave)
    scale = 1.0 / np.sqrt(1.0 + 0.25 + 0.0625)  # rescaled to the dry rms
    np.testing.assert_allclose(wet[100:103], np.array([1.0, 0.5, 0.25]) * scale, atol=1e-6)
    assert np.abs(wet[:100]).max() < 1e-6 and np.abs(wet[103:]).max() < 1e-6  # causal, nothing else


def test_reverb_rooms_are_drawn_per_talk_and_change_only_the_audio(tmp_path: Path) -> None:
    dry = plan_pair("en-de", **KW)
    wet = plan_pair("en-de", **KW, reverb_rt60=[0.3, 0.8])
    assert all(p.rt60 == 0.0 for p in dry)
    assert all(0.3 <= p.rt60 <= 0.8 for p in wet) and len({p.rt60 for p in wet}) > 1
    # same text, speakers, pauses and noise seeds: only the rooms differ
    assert [(p.segments, p.pauses, p.noise_seed, p.speaker) for p in dry] == \
        [(p.segments, p.pauses, p.noise_seed, p.speaker) for p in wet]
    kw = {**KW, "splits": {"train": 2, "dev": 1, "tst-COMMON": 1}}
    write_pair(tmp_path / "dry", "en-de", noise_level=0.0, progress=False, **kw)
    write_pair(tmp_path / "wet", "en-de", noise_level=0.0, progress=False, reverb_rt60=[0.5, 0.5], **kw)
    d, sr = sf.read(tmp_path / "dry/en-de/data/train/wav/ted_1.wav")
    w, _ = sf.read(tmp_path / "wet/en-de/data/train/wav/ted_1.wav")
    assert len(d) == len(w) and not np.array_equal(d, w)
    assert abs(np.sqrt(np.mean(w ** 2)) / np.sqrt(np.mean(d ** 2)) - 1) < 0.01  # the level is kept
    for name in ("train.yaml", "train.en", "train.de"):  # segmentation and text untouched
        assert (tmp_path / "dry/en-de/data/train/txt" / name).read_bytes() == \
            (tmp_path / "wet/en-de/data/train/txt" / name).read_bytes()


# ----------------------------------------------------------------------------- mutation-audit additions


def test_pair_seed_by_hand() -> None:
    """pair_seed = (seed · 1000003 + crc32(pair)) mod 2^31: pinned, since every demo corpus (a DVC output)
    is a function of it. crc32(b"en-de") = 0x40d561d7 (zlib)."""
    import zlib

    assert zlib.crc32(b"en-de") == 0x40D561D7
    assert pair_seed(0, "en-de") == 0x40D561D7 % 2**31 == 1087726039
    assert pair_seed(3, "en-de") == (3 * 1_000_003 + 1087726039) % 2**31 == 1090726048
    assert pair_seed(3, "en-de") != pair_seed(3, "en-it")


def test_each_pair_draws_its_own_sentences_at_one_seed() -> None:
    """The pair enters the plan's seed: two pairs of one demo corpus do not share their English side."""
    de = [s["en"] for p in plan_pair("en-de", **KW) for seg in p.segments for s in seg.sentences]
    it = [s["en"] for p in plan_pair("en-it", **KW) for seg in p.segments for s in seg.sentences]
    assert de != it and len(set(de) & set(it)) < len(de) // 2


def test_room_rt60_comes_from_its_own_stream() -> None:
    """rt60 is drawn from the talk's stream [noise_seed, 2] (the RIR uses [noise_seed, 1], the noise
    noise_seed itself), rounded to ms; the other draws of the plan do not change with reverberation."""
    plain = plan_pair("en-de", **KW)
    reverb = plan_pair("en-de", **KW, reverb_rt60=[0.2, 0.6])
    assert [p.noise_seed for p in plain] == [p.noise_seed for p in reverb]
    assert all(p.rt60 == 0.0 for p in plain)
    for p in reverb:
        assert p.rt60 == round(float(np.random.default_rng([p.noise_seed, 2]).uniform(0.2, 0.6)), 3)
        assert 0.2 <= p.rt60 <= 0.6
