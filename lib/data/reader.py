"""What preparation needs from a speech-translation corpus: the reader interface.

A reader turns one language pair of a corpus on disk into :class:`Segment` s (a talk's audio file,
an offset and a duration in it, a speaker, the source text and the target text) and reads the
talks' audio. Preparation (:mod:`lib.data.prepare`) knows nothing else about a layout, so another
corpus means another reader, not an edit to preparation: subclass :class:`CorpusReader`, implement
``recognises``, ``read_split``, ``listing_of`` and ``text_file``, and add the class to
:data:`lib.data.corpora.READERS`. The audio methods below serve any corpus of 16 kHz mono files
that soundfile reads (WAV, FLAC); a corpus in another format overrides them.

Every problem with the input raises :class:`CorpusError`, whose message names the offending file
(and the 1-based text line or the 0-based entry index where relevant), so that a broken corpus is
fixed at the right place instead of being silently skipped.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Sequence

import numpy as np
import soundfile as sf

SAMPLE_RATE = 16000
"""Sample rate the features are computed at (Hz): MuST-C's."""


class CorpusError(ValueError):
    """Bad input; message always names the file (and line / entry index where relevant)."""


@dataclass(frozen=True)
class Segment:
    """One segment of a talk, with its transcript and translation.

    ``id`` is unique within a split (MuST-C: ``f"{wav_stem}_{i}"``, ``i`` the segment's index within
    its talk). ``offset`` and ``duration`` are in seconds.
    """

    id: str
    wav: Path
    offset: float
    duration: float
    speaker: str
    src_text: str
    tgt_text: str


@dataclass(frozen=True)
class CorpusReader(ABC):
    """One language pair (``pair``, e.g. ``"en-de"``) of a corpus whose root folder is ``root``.

    Frozen and made of paths only, so it pickles into preparation's worker processes.
    """

    root: Path
    pair: str

    name: ClassVar[str]
    """The reader's name, as errors and the documentation give it (e.g. ``"mustc_v1"``)."""
    sample_rate: ClassVar[int] = SAMPLE_RATE

    @classmethod
    @abstractmethod
    def recognises(cls, root: Path, pair: str) -> bool:
        """Whether ``root`` holds ``pair`` in this reader's layout (a cheap look at the folders)."""

    @abstractmethod
    def read_split(self, split: str) -> list[Segment]:
        """Every segment of ``split``, in the corpus's order, checked (CorpusError naming the file)."""

    @abstractmethod
    def listing_of(self, segment: Segment) -> Path:
        """The file that lists ``segment`` (errors about the segment name it)."""

    @abstractmethod
    def text_file(self, split: str, lang: str) -> Path:
        """The file that holds ``split``'s text in language ``lang`` (errors about a text line name it)."""

    def check_layout(self, splits: Sequence[str]) -> None:
        """CorpusError naming what is missing when a split's folders are not there: a cheap look at the
        folders, nothing is read (:func:`lib.data.corpora.check_corpus`). The default checks nothing."""

    def probe_talk(self, wav: Path) -> int:
        return probe_talk(wav, self.sample_rate)

    def load_talk(self, wav: Path) -> np.ndarray:
        return load_talk(wav, self.sample_rate)

    def segment_bounds(self, segment: Segment, talk_samples: int, entry_index: int) -> tuple[int, int]:
        return segment_bounds(segment, talk_samples, entry_index, self.sample_rate, self.listing_of(segment))

    def cut_segment(self, talk: np.ndarray, segment: Segment, entry_index: int) -> np.ndarray:
        start, end = self.segment_bounds(segment, len(talk), entry_index)
        return talk[start:end]


def probe_talk(path: Path, expected_sample_rate: int = SAMPLE_RATE) -> int:
    """Number of samples of talk ``path``, from its header only (cheap; used to validate upfront).

    Raises CorpusError like :func:`load_talk` for an unreadable file, a wrong sample rate or
    more than one channel.
    """
    try:
        info = sf.info(str(path))
    except (sf.SoundFileError, RuntimeError, OSError) as e:
        raise CorpusError(f"{path}: cannot read audio file: {_reason(path, e)}") from None
    _check_format(path, info.samplerate, info.channels, expected_sample_rate)
    return int(info.frames)


def _check_format(path: Path, sample_rate: int, channels: int, expected_sample_rate: int) -> None:
    if sample_rate != expected_sample_rate:
        raise CorpusError(
            f"{path}: sample rate {sample_rate} Hz, expected {expected_sample_rate} Hz "
            f"(MuST-C audio is {expected_sample_rate} Hz; refusing to resample a corpus that is not MuST-C-like)"
        )
    if channels != 1:
        raise CorpusError(f"{path}: {channels} channels, expected mono audio")


def load_talk(path: Path, expected_sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Read a whole talk as float32 mono samples in [-1, 1] (PCM16 / 32768, as torchaudio.load).

    Uses soundfile (no FFmpeg). A sample rate other than ``expected_sample_rate`` is refused with
    a CorpusError naming the file and the rate, rather than resampled: real MuST-C is 16 kHz, so
    another rate means a wrong or corrupted corpus, and resampling would silently change the
    features. Unreadable files and multi-channel audio raise CorpusError too.
    """
    try:
        with sf.SoundFile(str(path)) as f:
            _check_format(path, f.samplerate, f.channels, expected_sample_rate)
            data = f.read(dtype="float32", always_2d=True)
    except CorpusError:
        raise
    except (sf.SoundFileError, RuntimeError, OSError) as e:
        raise CorpusError(f"{path}: cannot read audio file: {_reason(path, e)}") from None
    return np.ascontiguousarray(data[:, 0])


def _reason(path: Path, e: Exception) -> str:
    """libsndfile's reason without its own ``Error opening '<path>': `` prefix (the line names the file once)."""
    return str(e).replace(f"Error opening '{path}': ", "")


def declared_seconds(path: Path) -> float | None:
    """Seconds of audio a RIFF/WAVE file's header declares (its ``data`` chunk's size), or None when the file
    is no plain WAV or the size is a streaming placeholder (0 or 0xFFFFFFFF). soundfile counts only the
    samples present, so a truncated copy reads as a shorter talk: this tells the two apart in errors."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            rate = block = 0
            while len(chunk := f.read(8)) == 8:
                cid, size = chunk[:4], int.from_bytes(chunk[4:], "little")
                if cid == b"fmt ":
                    fmt = f.read(size)
                    if len(fmt) < 14:
                        return None
                    rate, block = int.from_bytes(fmt[4:8], "little"), int.from_bytes(fmt[12:14], "little")
                    f.seek(size % 2, 1)
                elif cid == b"data":
                    if not rate or not block or size in (0, 0xFFFFFFFF):
                        return None
                    return size // block / rate
                else:
                    f.seek(size + size % 2, 1)
    except OSError:
        return None
    return None


def segment_bounds(segment: Segment, talk_samples: int, entry_index: int, sample_rate: int,
                   listing: Path) -> tuple[int, int]:
    """Sample range ``[start, end)`` of ``segment`` in a talk of ``talk_samples`` samples.

    ``start = round(offset * sr)``, ``end = round((offset + duration) * sr)``. An end past the talk
    by at most one feature frame shift (10 ms) is clipped to the talk's end (rounding in the
    listed times); more raises CorpusError naming the listing, the entry index and the wav.
    """
    start = round(segment.offset * sample_rate)
    end = round((segment.offset + segment.duration) * sample_rate)
    tolerance = sample_rate // 100  # one 10 ms frame shift
    if end - talk_samples > tolerance:
        declared = declared_seconds(segment.wav)
        truncated = (f"; its header declares {declared:.3f} s: a truncated copy? (compare its size with the original)"
                     if declared is not None and declared - talk_samples / sample_rate > 0.01 else "")
        raise CorpusError(
            f"{listing}: entry {entry_index} ({segment.id}): segment "
            f"[{segment.offset:.3f} s, {segment.offset + segment.duration:.3f} s) runs past the end of "
            f"{segment.wav} ({talk_samples / sample_rate:.3f} s, {talk_samples} samples){truncated}"
        )
    end = min(end, talk_samples)
    start = min(start, end)
    return start, end
