"""Write the synthetic demo corpus for one language pair in the exact MuST-C v1 layout.

    <out_dir>/en-xx/data/<split>/wav/ted_<n>.wav      16 kHz mono PCM16, one "talk" per file
    <out_dir>/en-xx/data/<split>/txt/<split>.yaml     one entry per segment (offset, duration, ...)
    <out_dir>/en-xx/data/<split>/txt/<split>.en       English transcript, one segment per line
    <out_dir>/en-xx/data/<split>/txt/<split>.xx       translation, aligned with the yaml

Text comes from :mod:`lib.corpus.grammar`, speech from eSpeak NG (:mod:`lib.corpus.speech`).
A talk has one speaker (an eSpeak voice with its own rate and pitch) and holds
``segments_per_talk`` segments separated by random pauses, over faint Gaussian noise, so a
reader must cut segments by the yaml offsets exactly as for real TED talks. A segment is one
sentence, or (``sentences_per_segment = [lo, hi]``) ``lo..hi`` consecutive sentences separated by
short pauses (``sentence_pause_seconds``), like MuST-C's multi-sentence segments; its yaml entry
spans them all and its text lines join them with a space. Per sentence, the speaker's rate can
vary by ``± rate_jitter`` words per minute and eSpeak inserts ``word_gap = [lo, hi]`` x 10 ms
between words (drawn per sentence): demo-only sources of acoustic variability. With
``reverb_rt60 = [lo, hi]`` (seconds, ``hi > 0``) each talk is given a room: its speech is convolved
with a synthetic impulse response (:func:`room_impulse_response`) whose reverberation time is
drawn per talk, before the background noise is added, so every frame also holds the decaying
tails of the sounds before it. Talk numbers run on
across splits (no talk is in two splits). English sentences are unique within a pair, so no
dev/test sentence was seen in training.

Everything is driven by a seed derived from ``(seed, pair)``; the same parameters give
byte-identical files (synthesis runs in worker processes but results are consumed in order).
Workers run in a :mod:`lib.pool` pool: a worker that dies (SIGKILL from the out-of-memory killer,
a crash in eSpeak) ends the stage with an error naming it rather than hanging it, and Ctrl-C is
handled by the parent alone.
"""
from __future__ import annotations

import random
import sys
import zlib
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import soundfile as sf
from tqdm import tqdm

from lib.corpus import grammar
from lib.corpus.speech import DEFAULT_VOICES, Synthesizer, Voice
from lib.io import atomic_dir
from lib.pool import ordered_results, worker_pool

SAMPLE_RATE = 16000
SPLIT_ORDER = ("train", "dev", "tst-COMMON")


@dataclass(frozen=True)
class Speaker:
    speaker_id: str
    voice: Voice


@dataclass(frozen=True)
class SegmentPlan:
    """One segment: its sentences (``{"en": ..., <lang>: ...}``), the voice of each (the speaker's,
    with per-sentence rate / word-gap variation) and the pauses between them (seconds)."""

    sentences: tuple[dict[str, str], ...]
    voices: tuple[Voice, ...]
    inner_pauses: tuple[float, ...]  # len(sentences) - 1

    def text(self, lang: str) -> str:
        return " ".join(s[lang] for s in self.sentences)


@dataclass(frozen=True)
class TalkPlan:
    split: str
    talk_number: int
    speaker: Speaker
    segments: tuple[SegmentPlan, ...]
    pauses: tuple[float, ...]  # seconds of silence before each segment, plus one trailing pause
    noise_seed: int
    rt60: float = 0.0  # the talk's room: reverberation time in seconds (0: dry speech)


def pair_seed(seed: int, pair: str) -> int:
    """A per-pair seed that does not depend on Python's randomised ``hash``."""
    return (seed * 1_000_003 + zlib.crc32(pair.encode())) % (2**31)


def make_speakers(n: int, rng: random.Random) -> list[Speaker]:
    """``n`` speakers: eSpeak voices cycled in order, each with its own rate and pitch jitter."""
    speakers = []
    for i in range(n):
        base = DEFAULT_VOICES[i % len(DEFAULT_VOICES)]
        voice = Voice(name=base.name, rate=base.rate + rng.randint(-12, 12),
                      pitch=min(99, max(1, base.pitch + rng.randint(-10, 10))))
        speakers.append(Speaker(speaker_id=f"spk.{i + 1}", voice=voice))
    return speakers


def _sentence_voice(base: Voice, rng: random.Random, rate_jitter: int, word_gap: Sequence[int]) -> Voice:
    """The speaker's voice for one sentence (no draw when there is no variation, so the default
    corpus does not depend on these options)."""
    rate = base.rate + (rng.randint(-rate_jitter, rate_jitter) if rate_jitter else 0)
    gap = rng.randint(word_gap[0], word_gap[1]) if word_gap[1] > word_gap[0] else word_gap[0]
    return Voice(name=base.name, rate=min(450, max(80, rate)), pitch=base.pitch, word_gap=gap)


def plan_pair(pair: str, splits: dict[str, int], seed: int, segments_per_talk: int, n_speakers: int,
              pause_seconds: Sequence[float], sentences_per_segment: Sequence[int] = (1, 1),
              sentence_pause_seconds: Sequence[float] = (0.1, 0.4), rate_jitter: int = 0,
              word_gap: Sequence[int] = (0, 0), reverb_rt60: Sequence[float] = (0.0, 0.0)) -> list[TalkPlan]:
    """Decide every talk of one pair (text, speaker, pauses) before any audio is made."""
    lang = pair.split("-")[1]
    rng = random.Random(pair_seed(seed, pair))
    speakers = make_speakers(n_speakers, rng)
    lo, hi = sentences_per_segment
    per_segment = {split: [rng.randint(lo, hi) if hi > lo else lo for _ in range(n)] for split, n in splits.items()}
    total = sum(sum(v) for v in per_segment.values())
    # Oversample, then keep unique English sentences in generation order.
    seen: set[str] = set()
    unique: list[dict[str, str]] = []
    attempt = 0
    while len(unique) < total:
        attempt += 1
        if attempt > 20:
            raise ValueError(f"corpus: could not draw {total} unique sentences for {pair}; "
                             f"the grammar yields only {len(unique)} distinct ones at this seed")
        batch = grammar.generate_corpus(2 * total, seed=rng.randrange(2**31), langs=(lang,))
        for s in batch:
            if s["en"] not in seen:
                seen.add(s["en"])
                unique.append({"en": s["en"], lang: s[lang]})
                if len(unique) == total:
                    break
    plans: list[TalkPlan] = []
    talk_number = 0
    cursor = 0
    ordered = [s for s in SPLIT_ORDER if s in splits] + sorted(s for s in splits if s not in SPLIT_ORDER)
    for split in ordered:
        groups = []
        for k in per_segment[split]:
            groups.append(tuple(unique[cursor:cursor + k]))
            cursor += k
        for start in range(0, len(groups), segments_per_talk):
            talk_number += 1
            chunk = groups[start:start + segments_per_talk]
            pauses = tuple(round(rng.uniform(*pause_seconds), 3) for _ in range(len(chunk) + 1))
            speaker = rng.choice(speakers)
            segments = tuple(SegmentPlan(
                sentences=group,
                voices=tuple(_sentence_voice(speaker.voice, rng, rate_jitter, word_gap) for _ in group),
                inner_pauses=tuple(round(rng.uniform(*sentence_pause_seconds), 3) for _ in group[1:]),
            ) for group in chunk)
            noise_seed = rng.randrange(2**31)
            # the room comes from its own stream of the talk's seed: the plan's other draws (text,
            # speakers, pauses, noise) are the same with or without reverberation
            rt60 = round(float(np.random.default_rng([noise_seed, 2]).uniform(*reverb_rt60)), 3) \
                if reverb_rt60[1] > 0 else 0.0
            plans.append(TalkPlan(split=split, talk_number=talk_number, speaker=speaker,
                                  segments=segments, pauses=pauses, noise_seed=noise_seed, rt60=rt60))
    return plans


_SYNTH: Synthesizer | None = None

#: Direct-to-reverberant energy ratio of the synthetic rooms (dB): the reverberant tail carries as
#: much energy as the direct sound, a distant microphone in a lecture room.
DIRECT_TO_REVERB_DB = 0.0


def room_impulse_response(rt60: float, sample_rate: int, rng: np.random.Generator,
                          direct_to_reverb_db: float = DIRECT_TO_REVERB_DB) -> np.ndarray:
    """A synthetic room impulse response: a unit direct path followed by exponentially decaying
    Gaussian noise (the statistical model of a diffuse late reverberation: the amplitude envelope
    falls by 60 dB over ``rt60`` seconds, ``exp(-3 ln(10) t / rt60)``), scaled so that the tail
    holds ``direct_to_reverb_db`` dB less energy than the direct path. Length: ``rt60`` seconds."""
    if rt60 <= 0:
        raise ValueError(f"rt60 must be > 0 seconds, got {rt60}")
    n = max(2, int(round(rt60 * sample_rate)))
    t = np.arange(n) / sample_rate
    tail = rng.standard_normal(n) * np.exp(-3.0 * np.log(10.0) * t / rt60)
    tail[0] = 0.0
    tail *= np.sqrt(10.0 ** (-direct_to_reverb_db / 10.0) / np.sum(tail ** 2))
    tail[0] = 1.0
    return tail


def reverberate(wave: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """``wave`` convolved with ``rir`` (FFT, truncated to ``len(wave)``: the tail after the talk's
    last sample is dropped) and rescaled to the dry signal's rms, so the level, and with it the
    background noise's signal-to-noise ratio, stays that of the dry talk."""
    n = len(wave) + len(rir) - 1
    size = 1 << (n - 1).bit_length()
    wet = np.fft.irfft(np.fft.rfft(wave, size) * np.fft.rfft(rir, size), size)[:len(wave)]
    dry_rms = float(np.sqrt(np.mean(np.square(wave, dtype=np.float64))))
    wet_rms = float(np.sqrt(np.mean(np.square(wet))))
    return (wet * (dry_rms / wet_rms if wet_rms > 0 else 1.0)).astype(np.float32)


def _render_talk(plan: TalkPlan, noise_level: float) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Audio of one talk (int16) and each segment's (start, length) in samples."""
    global _SYNTH
    if _SYNTH is None:  # one eSpeak instance per process: the C library is process-global
        _SYNTH = Synthesizer(sample_rate=SAMPLE_RATE)
    pieces: list[np.ndarray] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    for segment, pause in zip(plan.segments, plan.pauses):
        gap = np.zeros(int(round(pause * SAMPLE_RATE)), dtype=np.float32)
        parts = []
        for i, (sentence, voice) in enumerate(zip(segment.sentences, segment.voices)):
            if i:
                parts.append(np.zeros(int(round(segment.inner_pauses[i - 1] * SAMPLE_RATE)), dtype=np.float32))
            parts.append(_SYNTH.synthesize(sentence["en"], voice))
        speech = np.concatenate(parts)
        pieces += [gap, speech]
        pos += len(gap)
        spans.append((pos, len(speech)))
        pos += len(speech)
    pieces.append(np.zeros(int(round(plan.pauses[-1] * SAMPLE_RATE)), dtype=np.float32))
    wave = np.concatenate(pieces)
    if plan.rt60 > 0:  # its own stream of the talk's seed: the noise below is the same with or without
        rir = room_impulse_response(plan.rt60, SAMPLE_RATE, np.random.default_rng([plan.noise_seed, 1]))
        wave = reverberate(wave, rir)
    if noise_level > 0:
        wave = wave + noise_level * np.random.default_rng(plan.noise_seed).standard_normal(len(wave)).astype(np.float32)
    pcm = np.clip(np.round(wave * 32767.0), -32768, 32767).astype(np.int16)
    return pcm, spans


def _render_star(args: tuple[TalkPlan, float]) -> tuple[np.ndarray, list[tuple[int, int]]]:
    return _render_talk(*args)


def _rendered(plans: list[TalkPlan], noise_level: float, workers: int) -> Iterator[tuple[np.ndarray, list]]:
    jobs = [(p, noise_level) for p in plans]
    if workers <= 1:
        yield from map(_render_star, jobs)
        return
    # fork is cheap (no re-import of torch); elsewhere spawn is the only safe choice.
    with worker_pool(workers, "fork" if sys.platform == "linux" else "spawn") as pool:
        yield from ordered_results(pool, _render_star, jobs, 2 * workers, what="a speech synthesis worker",
                                   hint="lower corpus.workers")


def yaml_entry(offset: float, duration: float, words: int, speaker_id: str, wav: str) -> str:
    """One MuST-C yaml line, formatted like the real corpus (6 decimals, flow mapping)."""
    return (f"- {{duration: {duration:.6f}, offset: {offset:.6f}, rW: {words}, uW: 0, "
            f"speaker_id: {speaker_id}, wav: {wav}}}\n")


def write_pair(out_dir: Path, pair: str, splits: dict[str, int], seed: int, segments_per_talk: int,
               n_speakers: int, pause_seconds: Sequence[float], noise_level: float, workers: int = 1,
               progress: bool = True, sentences_per_segment: Sequence[int] = (1, 1),
               sentence_pause_seconds: Sequence[float] = (0.1, 0.4), rate_jitter: int = 0,
               word_gap: Sequence[int] = (0, 0), reverb_rt60: Sequence[float] = (0.0, 0.0)) -> dict:
    """Write ``<out_dir>/<pair>`` atomically; return a small summary (counts, hours)."""
    lang = pair.split("-")[1]
    if lang not in grammar.LANGUAGES:
        raise ValueError(f"corpus: no demo grammar for target language {lang!r} of pair {pair!r}; "
                         f"available: {', '.join('en-' + x for x in grammar.LANGUAGES)}")
    plans = plan_pair(pair, splits, seed, segments_per_talk, n_speakers, pause_seconds,
                      sentences_per_segment=sentences_per_segment, sentence_pause_seconds=sentence_pause_seconds,
                      rate_jitter=rate_jitter, word_gap=word_gap, reverb_rt60=reverb_rt60)
    summary: dict = {"pair": pair, "splits": {}}
    with atomic_dir(Path(out_dir) / pair) as tmp:
        yaml_lines: dict[str, list[str]] = {s: [] for s in splits}
        src_lines: dict[str, list[str]] = {s: [] for s in splits}
        tgt_lines: dict[str, list[str]] = {s: [] for s in splits}
        audio_seconds: dict[str, float] = {s: 0.0 for s in splits}
        bar = tqdm(total=sum(splits.values()), desc=f"corpus {pair}", unit="seg", disable=not progress)
        # closing: an error here must stop the workers now, not when the generator is collected
        with closing(_rendered(plans, noise_level, workers)) as rendered:
            for plan, (pcm, spans) in zip(plans, rendered):
                wav_name = f"ted_{plan.talk_number}.wav"
                wav_dir = tmp / "data" / plan.split / "wav"
                wav_dir.mkdir(parents=True, exist_ok=True)
                sf.write(wav_dir / wav_name, pcm, SAMPLE_RATE, subtype="PCM_16", format="WAV")
                for segment, (start, length) in zip(plan.segments, spans):
                    english = segment.text("en")
                    yaml_lines[plan.split].append(yaml_entry(start / SAMPLE_RATE, length / SAMPLE_RATE,
                                                             len(english.split()),
                                                             plan.speaker.speaker_id, wav_name))
                    src_lines[plan.split].append(english + "\n")
                    tgt_lines[plan.split].append(segment.text(lang) + "\n")
                    audio_seconds[plan.split] += length / SAMPLE_RATE
                bar.update(len(plan.segments))
        bar.close()
        for split in splits:
            txt = tmp / "data" / split / "txt"
            txt.mkdir(parents=True, exist_ok=True)
            (txt / f"{split}.yaml").write_text("".join(yaml_lines[split]), encoding="utf-8")
            (txt / f"{split}.en").write_text("".join(src_lines[split]), encoding="utf-8")
            (txt / f"{split}.{lang}").write_text("".join(tgt_lines[split]), encoding="utf-8")
            summary["splits"][split] = {
                "segments": len(src_lines[split]),
                "talks": sum(1 for p in plans if p.split == split),
                "speech_hours": round(audio_seconds[split] / 3600, 4),
            }
    return summary
