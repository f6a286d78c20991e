"""Tests for lib/corpus/speech.py (eSpeak NG through ctypes, from the espeakng-loader wheel)."""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lib.corpus.speech import DEFAULT_VOICES, Synthesizer, Voice, _Engine, _default_paths, trim_silence

REPO_ROOT = Path(__file__).resolve().parents[2]
SR = 16000
TEXT = "the small dog sees the cat"


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(sample_rate=SR)


@pytest.fixture(scope="module")
def dog_cat(synth: Synthesizer) -> dict[Voice, np.ndarray]:
    return {voice: synth.synthesize(TEXT, voice) for voice in DEFAULT_VOICES}


def _digest(waves: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for wave in waves:
        h.update(np.ascontiguousarray(wave, dtype=np.float32).tobytes())
        h.update(b"|")
    return h.hexdigest()


# --- voices ------------------------------------------------------------------------


def test_default_voices_are_distinct_speakers() -> None:
    assert len(DEFAULT_VOICES) >= 6
    assert len(set(DEFAULT_VOICES)) == len(DEFAULT_VOICES)
    assert len({v.name for v in DEFAULT_VOICES}) == len(DEFAULT_VOICES)
    for voice in DEFAULT_VOICES:
        assert 150 <= voice.rate <= 190
        assert 0 <= voice.pitch <= 100
        assert voice.name.split("+")[0] != "en-gb"  # does not load in this build


@pytest.mark.parametrize("voice", DEFAULT_VOICES, ids=str)
def test_default_voice_synthesizes(dog_cat: dict[Voice, np.ndarray], voice: Voice) -> None:
    wave = dog_cat[voice]
    assert isinstance(wave, np.ndarray)
    assert wave.dtype == np.float32 and wave.ndim == 1
    assert np.all(np.isfinite(wave))
    assert np.abs(wave).max() <= 1.0
    assert np.abs(wave).max() > 0.1  # audible, not near-silence
    duration = wave.size / SR
    assert 0.8 <= duration <= 3.0, duration  # six words at 150-190 wpm
    # trimmed: the first/last 5 ms are (nearly) silent margin, far below the loudest frame
    frame = SR // 200
    frames = wave[: wave.size // frame * frame].reshape(-1, frame)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    assert rms[0] < 0.1 * rms.max() and rms[-1] < 0.1 * rms.max()


def test_voices_differ(dog_cat: dict[Voice, np.ndarray]) -> None:
    for a, b in itertools.combinations(DEFAULT_VOICES, 2):
        wa, wb = dog_cat[a], dog_cat[b]
        assert wa.size != wb.size or not np.array_equal(wa, wb), (a, b)


def test_rate_and_pitch_are_applied(synth: Synthesizer) -> None:
    slow = synth.synthesize(TEXT, Voice("en-us", 120, 50))
    fast = synth.synthesize(TEXT, Voice("en-us", 240, 50))
    assert slow.size > 1.5 * fast.size
    low = synth.synthesize(TEXT, Voice("en-us", 170, 20))
    high = synth.synthesize(TEXT, Voice("en-us", 170, 80))
    assert low.size != high.size or not np.array_equal(low, high)


@pytest.mark.parametrize("name", ["xx-no-such-voice", "en-gb", "en+no_such_variant", "en-us+F3", "en+"])
def test_unknown_voice_raises_with_name(synth: Synthesizer, name: str) -> None:
    with pytest.raises(ValueError, match=name.replace("+", r"\+")):
        synth.synthesize(TEXT, Voice(name, 170, 50))
    # the engine is still usable afterwards
    assert synth.synthesize(TEXT, DEFAULT_VOICES[0]).size > 0


def test_invalid_inputs(synth: Synthesizer) -> None:
    with pytest.raises(ValueError):
        Voice("en-us", 20, 50)
    with pytest.raises(ValueError):
        Voice("en-us", 170, 101)
    with pytest.raises(ValueError):
        Voice("", 170, 50)
    with pytest.raises(ValueError, match="en-us"):
        synth.synthesize("   ", DEFAULT_VOICES[0])
    with pytest.raises(ValueError):
        Synthesizer(sample_rate=0)


def test_other_sample_rates(synth: Synthesizer) -> None:
    native = Synthesizer(sample_rate=synth.native_sample_rate)
    wave_native = native.synthesize(TEXT, DEFAULT_VOICES[0])
    wave_16k = synth.synthesize(TEXT, DEFAULT_VOICES[0])
    assert wave_native.dtype == np.float32
    ratio = wave_16k.size / wave_native.size
    assert ratio == pytest.approx(SR / synth.native_sample_rate, rel=0.01)


# --- determinism ---------------------------------------------------------------------


def test_deterministic_within_process(synth: Synthesizer, dog_cat: dict[Voice, np.ndarray]) -> None:
    # interleave other texts/voices: eSpeak's hidden state must not leak between utterances
    for voice in reversed(DEFAULT_VOICES):
        synth.synthesize("an unrelated sentence to change the internal state", DEFAULT_VOICES[-1])
        again = synth.synthesize(TEXT, voice)
        assert np.array_equal(again, dog_cat[voice]), voice
    a = synth.synthesize(TEXT, DEFAULT_VOICES[1])
    b = synth.synthesize(TEXT, DEFAULT_VOICES[1])
    assert a.tobytes() == b.tobytes()


_CHILD_CODE = f"""
import hashlib, multiprocessing, numpy as np
from lib.corpus.speech import DEFAULT_VOICES, Synthesizer

def digest(first_voice):
    s = Synthesizer(16000)
    s.synthesize('a different first sentence', DEFAULT_VOICES[first_voice])
    h = hashlib.sha256()
    for v in DEFAULT_VOICES:
        h.update(np.ascontiguousarray(s.synthesize({TEXT!r}, v), dtype=np.float32).tobytes())
        h.update(b'|')
    return h.hexdigest()

if __name__ == '__main__':
    print(digest(2))
    # a worker forked after the parent synthesised (and resampled) must work and agree
    with multiprocessing.get_context('fork').Pool(1) as pool:
        print(pool.apply(digest, (5,)))
"""


def test_deterministic_across_processes(dog_cat: dict[Voice, np.ndarray]) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-c", _CHILD_CODE],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    expected = _digest([dog_cat[v] for v in DEFAULT_VOICES])
    assert result.stdout.split() == [expected, expected]


# --- errors from the library -----------------------------------------------------------


def test_missing_library_raises_runtime_error() -> None:
    _, data_path = _default_paths()
    bad = "/nonexistent/dir/libespeak-ng.so"
    with pytest.raises(RuntimeError, match="/nonexistent/dir/libespeak-ng.so"):
        _Engine(bad, data_path)


def test_init_failure_names_library(tmp_path: Path) -> None:
    # espeak_Initialize touches process-global state: run it in a fresh process
    code = (
        "import sys\n"
        "from lib.corpus.speech import _Engine, _default_paths\n"
        "lib, _ = _default_paths()\n"
        "try:\n"
        f"    _Engine(lib, {str(tmp_path)!r})\n"
        "except RuntimeError as exc:\n"
        "    print('RuntimeError:', exc)\n"
        "    sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    library_path, _ = _default_paths()
    assert library_path in result.stdout


# --- trim_silence ------------------------------------------------------------------------


def _tone(seconds: float, amp: float = 0.5, freq: float = 440.0, sr: int = SR) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_trim_silence_removes_padding() -> None:
    tone = _tone(0.3)
    wave = np.concatenate([np.zeros(8000, np.float32), tone, np.zeros(8000, np.float32)])
    out = trim_silence(wave, SR, threshold_db=-40.0, margin_ms=10.0)
    assert out.dtype == np.float32
    # tone on 5 ms frame boundaries: exactly the tone plus a 10 ms (160-sample) margin each side
    assert np.array_equal(out, wave[8000 - 160 : 8000 + tone.size + 160])


@pytest.mark.parametrize("lead,tail", [(7919, 5003), (123, 8001), (0, 4000)])
def test_trim_silence_unaligned_padding(lead: int, tail: int) -> None:
    tone = _tone(0.25, freq=300.0)
    wave = np.concatenate([np.zeros(lead, np.float32), tone, np.zeros(tail, np.float32)])
    out = trim_silence(wave, SR, margin_ms=10.0)
    margin, frame = 160, 80  # 10 ms margin, 5 ms analysis frames at 16 kHz
    assert out.size <= tone.size + 2 * margin + 2 * frame
    assert out.size >= tone.size + min(lead, margin) + min(tail, margin)
    # the whole tone is kept: ``out`` is a contiguous slice of ``wave`` covering it
    start = lead - int(np.flatnonzero(out)[0]) + 1  # tone[0] == 0, its first non-zero is tone[1]
    assert 0 <= start <= lead
    assert np.array_equal(out, wave[start : start + out.size])
    assert start <= lead and start + out.size >= lead + tone.size


def test_trim_silence_drops_low_noise_and_keeps_quiet_speech() -> None:
    rng = np.random.default_rng(0)
    noise = lambda n: (1e-4 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731  (~ -80 dB)
    quiet = _tone(0.1, amp=0.5 * 10 ** (-30 / 20))  # 30 dB below the loud part
    loud = _tone(0.2)
    wave = np.concatenate([noise(4000), quiet, loud, noise(4000)])
    kept = trim_silence(wave, SR, threshold_db=-40.0, margin_ms=0.0)
    assert quiet.size + loud.size <= kept.size <= quiet.size + loud.size + 2 * 80
    cut = trim_silence(wave, SR, threshold_db=-20.0, margin_ms=0.0)
    assert loud.size <= cut.size <= loud.size + 2 * 80


def test_trim_silence_edge_cases() -> None:
    assert trim_silence(np.zeros(1000, np.float32), SR).size == 0
    assert trim_silence(np.zeros(0, np.float32), SR).size == 0
    tone = _tone(0.2)
    out = trim_silence(tone, SR, margin_ms=50.0)  # margin clipped at both ends
    assert np.array_equal(out, tone) and out is not tone
    ints = (np.concatenate([np.zeros(800), _tone(0.1), np.zeros(800)]) * 32767).astype(np.int16)
    assert trim_silence(ints, SR).dtype == np.int16
    with pytest.raises(ValueError):
        trim_silence(np.zeros((2, 100), np.float32), SR)
