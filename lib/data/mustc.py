"""Reader for the MuST-C v1 corpus layout (the real corpus and the demo corpus alike).

Layout of one language pair ``<root>/<pair>/data/<split>/``::

    wav/ted_<n>.wav          16 kHz mono PCM16, one file per talk (many segments each)
    txt/<split>.yaml         YAML list, one entry per segment:
                             - {duration: 3.41, offset: 12.25, rW: 7, uW: 0, speaker_id: spk.3, wav: ted_3.wav}
    txt/<split>.en           source transcripts, one segment per line, aligned with the yaml
    txt/<split>.<tgt>        target translations, idem

MuST-C v2.0 and v3.0 unpack to the same layout and are read the same way (their splits hold other
talks and segmentations, so their scores do not compare with v1's). :class:`MustcV1Reader` is the
:class:`~lib.data.reader.CorpusReader` over this module's functions.

Every problem with the input raises :class:`CorpusError` whose message names the offending file
(and the 1-based text line or the 0-based yaml entry index where relevant), so that a broken
corpus is fixed at the right place instead of being silently skipped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from lib.data import reader
from lib.params.base import PAIR_PATTERN
from lib.data.reader import SAMPLE_RATE, CorpusError, CorpusReader, Segment, load_talk, probe_talk  # noqa: F401

try:  # the C loader is ~10x faster on the 200k-entry yaml of the real train split
    from yaml import CSafeLoader as _YamlLoader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _YamlLoader  # type: ignore[assignment]

REQUIRED_KEYS: dict[str, tuple[type, ...]] = {
    "wav": (str,),
    "offset": (int, float),
    "duration": (int, float),
    "speaker_id": (str,),
}
"""Keys every yaml entry must have, with the accepted value types."""


def split_dir(root: Path, pair: str, split: str) -> Path:
    """``<root>/<pair>/data/<split>``, checked to exist (CorpusError naming what is missing)."""
    root = Path(root)
    if not root.is_dir():
        raise CorpusError(f"{root}: MuST-C root folder does not exist")
    pair_dir = root / pair
    if not pair_dir.is_dir():
        existing = sorted(p.name for p in root.iterdir()  # a pair's folder: en-xx/data (not lib/data)
                          if PAIR_PATTERN.match(p.name) and p.is_dir() and (p / "data").is_dir())
        raise CorpusError(
            f"{pair_dir}: language pair folder {pair!r} not found under {root}; "
            f"pairs present: {', '.join(existing) if existing else 'none'}"
        )
    data_dir = pair_dir / "data" / split
    if not data_dir.is_dir():
        parent = pair_dir / "data"
        existing = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
        raise CorpusError(
            f"{data_dir}: split folder {split!r} not found; "
            f"splits present in {parent}: {', '.join(existing) if existing else 'none'}"
        )
    return data_dir


def yaml_path_for(wav: Path) -> Path:
    """The segment yaml that describes talk ``wav`` (``<split>/wav/x.wav`` -> ``<split>/txt/<split>.yaml``)."""
    split_root = Path(wav).parent.parent
    return split_root / "txt" / f"{split_root.name}.yaml"


def _read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file, split on ``\\n`` only, with only the newline removed.

    Only ``\\n`` separates lines (not ``str.splitlines``, which would also split inside a segment
    on U+2028, U+0085, form feeds, ... that occur in TED text). A final line without a newline
    still counts. Invalid UTF-8 raises CorpusError with the 1-based line number.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorpusError(f"{path}: text file not found") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot read text file: {e}") from None
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise CorpusError(
            f"{path}:{line}: line {line} is not valid UTF-8 "
            f"(byte 0x{data[e.start]:02x} at file offset {e.start})"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]  # a BOM is not part of the first segment
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file's final newline does not start another line
    return lines


def _read_yaml(path: Path) -> list[dict]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorpusError(f"{path}: segment yaml not found") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot read segment yaml: {e}") from None
    try:
        entries = yaml.load(data, Loader=_YamlLoader)
    except yaml.YAMLError as e:
        raise CorpusError(_yaml_error(path, data, e)) from None
    if not isinstance(entries, list):
        raise CorpusError(f"{path}: expected a YAML list of segments, got {type(entries).__name__}")
    return entries


def _yaml_error(path: Path, data: bytes, e: yaml.YAMLError) -> str:
    """One line for a YAML error: ``<file>:<line>: invalid YAML: <problem>`` (PyYAML's own message runs
    over several lines and gives a non-UTF-8 byte as a position in the stream, not a line)."""
    if isinstance(e, yaml.reader.ReaderError):  # not UTF-8, or a character YAML does not allow
        line = data[: e.position].count(b"\n") + 1
        char = e.character if isinstance(e.character, int) else ord(e.character)
        return (f"{path}:{line}: invalid YAML: line {line}: {e.reason} (#x{char:02x} at file offset {e.position}; "
                f"the yaml must be UTF-8)")
    mark = getattr(e, "problem_mark", None)
    if isinstance(e, yaml.MarkedYAMLError) and mark is not None:
        what = f"line {mark.line + 1}, column {mark.column + 1}: {e.problem}"
        if e.context:
            ctx = e.context_mark
            what += f" ({e.context}" + (f" at line {ctx.line + 1}, column {ctx.column + 1})" if ctx else ")")
        return f"{path}:{mark.line + 1}: invalid YAML: {what}"
    return f"{path}: invalid YAML: {' '.join(str(e).split())}"


def _check_entry(path: Path, i: int, entry: object) -> tuple[str, float, float, str]:
    if not isinstance(entry, dict):
        raise CorpusError(f"{path}: entry {i}: expected a mapping, got {type(entry).__name__} {entry!r}")
    missing = [k for k in REQUIRED_KEYS if k not in entry]
    if missing:
        raise CorpusError(f"{path}: entry {i}: missing key(s) {', '.join(missing)} in {entry!r}")
    for key, types in REQUIRED_KEYS.items():
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise CorpusError(
                f"{path}: entry {i}: {key} must be "
                f"{' or '.join(t.__name__ for t in types)}, got {type(value).__name__} {value!r}"
            )
    offset, duration = float(entry["offset"]), float(entry["duration"])
    if not math.isfinite(offset) or offset < 0:
        raise CorpusError(f"{path}: entry {i}: offset must be a finite number >= 0, got {offset!r}")
    if not math.isfinite(duration) or duration <= 0:
        raise CorpusError(f"{path}: entry {i}: duration must be a finite number > 0, got {duration!r}")
    wav = entry["wav"]
    if not wav or Path(wav).name != wav:
        raise CorpusError(f"{path}: entry {i}: wav must be a plain file name, got {wav!r}")
    return wav, offset, duration, entry["speaker_id"]


def read_split(root: Path, pair: str, split: str) -> list[Segment]:
    """Read all segments of ``split`` of language pair ``pair`` (e.g. ``"en-de"``), in yaml order.

    Checks (each a :class:`CorpusError` naming the file and the line / entry): the pair and split
    folders exist, the yaml is a list of mappings with keys ``wav`` (str), ``offset``/``duration``
    (numbers, offset >= 0, duration > 0) and ``speaker_id`` (str), the two text files decode as
    UTF-8 and have exactly one line per yaml entry, and every referenced wav file exists.
    Audio content (sample rate, length) is checked later, by :func:`probe_talk` / :func:`load_talk`.

    Text lines keep everything but their final newline (inner and edge spaces included).
    """
    src_lang, sep, tgt_lang = pair.partition("-")
    if not sep or not src_lang or not tgt_lang:
        raise CorpusError(f"{Path(root) / pair}: language pair must look like 'en-de', got {pair!r}")
    data_dir = split_dir(Path(root), pair, split)
    txt_dir, wav_dir = data_dir / "txt", data_dir / "wav"
    yaml_path = txt_dir / f"{split}.yaml"
    src_path, tgt_path = txt_dir / f"{split}.{src_lang}", txt_dir / f"{split}.{tgt_lang}"

    entries = _read_yaml(yaml_path)
    checked = [_check_entry(yaml_path, i, e) for i, e in enumerate(entries)]
    src_lines = _read_lines(src_path)
    tgt_lines = _read_lines(tgt_path)
    for path, lines in ((src_path, src_lines), (tgt_path, tgt_lines)):
        if len(lines) != len(entries):
            raise CorpusError(
                f"{path}: {len(lines)} lines but {yaml_path} has {len(entries)} entries "
                f"(files must be line-aligned: {path} vs {yaml_path})"
            )

    segments: list[Segment] = []
    per_talk: dict[str, int] = {}
    exists: dict[str, bool] = {}
    for i, ((wav, offset, duration, speaker), src, tgt) in enumerate(zip(checked, src_lines, tgt_lines)):
        wav_path = wav_dir / wav
        if wav not in exists:
            exists[wav] = wav_path.is_file()
        if not exists[wav]:
            raise CorpusError(f"{yaml_path}: entry {i}: wav file {wav_path} not found")
        k = per_talk.get(wav, 0)
        per_talk[wav] = k + 1
        segments.append(Segment(id=f"{wav_path.stem}_{k}", wav=wav_path, offset=offset, duration=duration,
                                speaker=speaker, src_text=src, tgt_text=tgt))
    return segments


def segment_bounds(segment: Segment, talk_samples: int, entry_index: int,
                   sample_rate: int = SAMPLE_RATE) -> tuple[int, int]:
    """Sample range ``[start, end)`` of ``segment`` in a talk of ``talk_samples`` samples.

    ``start = round(offset * sr)``, ``end = round((offset + duration) * sr)``. An end past the talk
    by at most one feature frame shift (10 ms) is clipped to the talk's end (rounding in the
    yaml times); more raises CorpusError naming the wav, the yaml file and the entry index.
    """
    return reader.segment_bounds(segment, talk_samples, entry_index, sample_rate, yaml_path_for(segment.wav))


def cut_segment(talk: np.ndarray, segment: Segment, entry_index: int,
                sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Samples ``[round(offset*sr), round((offset+duration)*sr))`` of ``talk`` (a view, no copy).

    A tail overrun of at most 10 ms is clipped; a longer one raises CorpusError naming the wav,
    the yaml file and ``entry_index`` (see :func:`segment_bounds`).
    """
    start, end = segment_bounds(segment, len(talk), entry_index, sample_rate)
    return talk[start:end]


@dataclass(frozen=True)
class MustcV1Reader(CorpusReader):
    """MuST-C v1's layout (and v2.0's and v3.0's, which are the same): ``<root>/<pair>/data/<split>/``."""

    name = "mustc_v1"

    @classmethod
    def recognises(cls, root: Path, pair: str) -> bool:
        return (Path(root) / pair / "data").is_dir()

    def read_split(self, split: str) -> list[Segment]:
        return read_split(self.root, self.pair, split)

    def listing_of(self, segment: Segment) -> Path:
        return yaml_path_for(segment.wav)

    def check_layout(self, splits: Sequence[str]) -> None:
        """Each split's folder, its ``wav/`` folder and its three ``txt/`` files are there (nothing is
        read: :func:`read_split` checks their content when ``prepare`` runs)."""
        src, _, tgt = self.pair.partition("-")
        for split in splits:
            data_dir = split_dir(self.root, self.pair, split)
            if not (data_dir / "wav").is_dir():
                raise CorpusError(f"{data_dir / 'wav'}: the talks' folder of split {split!r} is missing")
            for lang in ("yaml", src, tgt):
                path = data_dir / "txt" / f"{split}.{lang}"
                if not path.is_file():
                    folder = path.parent
                    held = (", ".join(sorted(p.name for p in folder.iterdir())) or "nothing") if folder.is_dir() \
                        else "no such folder"
                    raise CorpusError(f"{path}: missing; {folder} holds {held}")

    def text_file(self, split: str, lang: str) -> Path:
        return Path(self.root) / self.pair / "data" / split / "txt" / f"{split}.{lang}"
