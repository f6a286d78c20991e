"""Prepare one MuST-C language pair: fbank feature stores, TSV manifests, SentencePiece models.

fairseq's S2T MuST-C recipe (``examples/speech_to_text/prep_mustc_data.py``), reorganised:

0. **Pick the reader** for the layout at the corpus root (:func:`lib.data.corpora.open_corpus`;
   MuST-C v1 is the first). Everything below goes through it, nothing reads the layout itself.
1. **Validate everything first** (cheap): read every split's yaml and texts (``read_split``),
   check every referenced wav exists and probe its header (16 kHz mono, length), check every
   segment lies inside its talk and that no text holds a tab or carriage return (TSV-safe).
   Bad input fails here, before any heavy work, with a :class:`CorpusError` naming the file.
2. **Filter before extracting**: the number of fbank frames of a segment is known from its
   sample count (:func:`num_frames`), so the filters (``too_short``: n_frames < min_frames,
   ``empty_text``: blank source or target, ``too_long``: n_frames > max_frames_train on the train
   split only; a segment is counted under the first reason that applies, in that order) are
   decided upfront and each split's feature store is created with its exact size.
3. **Extract** talk by talk: a worker loads one talk, cuts its kept segments and computes their
   fbank; the parent writes them, in manifest order, into ``<split>.fbank.npy``. ``workers > 1``
   uses a process pool (:mod:`lib.pool`) with at most ``2 * workers`` talks in flight (memory
   bounded by a few talks, not the corpus); ``workers == 1`` runs in-process. Every extraction
   runs with one torch thread, so outputs are byte-identical whatever ``workers`` is. A worker
   that dies (the out-of-memory killer's SIGKILL) ends the run with :class:`lib.pool.WorkerDied`
   naming it, instead of the hang a lost task gives with ``multiprocessing.Pool``; workers ignore
   Ctrl-C, which the parent alone handles (cleanup, then KeyboardInterrupt propagates).
4. **Vocabularies** (train split, kept segments): ``spm_asr.model`` on the English transcripts,
   ``spm_st.model`` on the target translations. A size SentencePiece cannot build raises a
   :class:`~lib.params.ParamError` naming ``prepare.asr_vocab_size`` / ``prepare.st_vocab_size``.

Between planning and writing, the free space of the output's file system is checked against the
exact size of the feature stores (:func:`lib.data.store.check_free_space`): a full disk is an
error naming the folder and the bytes, not a "Bus error" from the memory-mapped store.

Everything is written into a temporary folder that replaces ``out_dir`` only on success
(:func:`lib.io.atomic_dir`): a failure leaves no partial ``out_dir`` and an old one intact.

Outputs in ``out_dir``: ``<split>.fbank.npy``, ``<split>.tsv`` (columns :data:`MANIFEST_COLUMNS`;
``audio`` is a :mod:`lib.data.store` reference), ``spm_asr.model``, ``spm_st.model``, ``report.json``.

Manifest order: talks in order of first appearance in the yaml, segments of a talk in yaml
order; for MuST-C, whose yaml lists each talk's segments contiguously, this is the yaml order.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from lib.data.features import fbank, num_frames
from lib.data.manifest import MANIFEST_COLUMNS, read_manifest, tsv_writer  # noqa: F401 (re-exported)
from lib.data.corpora import open_corpus
from lib.data.reader import CorpusError, CorpusReader, Segment
from lib.data.store import FeatureStoreWriter, check_free_space, store_nbytes
from lib.params import ParamError, PrepareParams
from lib.data.vocab import SentencePieceError, train_sentencepiece
from lib.io import atomic_dir, atomic_write_json
from lib.pool import ignore_sigint, ordered_results, worker_pool

DROP_REASONS = ("too_short", "empty_text", "too_long")
ASR_MODEL, ST_MODEL, REPORT = "spm_asr.model", "spm_st.model", "report.json"


@dataclass(frozen=True)
class _Item:
    """One kept segment, with its position in the yaml and its size."""

    entry: int
    segment: Segment
    n_samples: int
    n_frames: int


@dataclass
class _SplitPlan:
    split: str
    n_segments: int
    talks: list[tuple[Path, list[_Item]]]  # talks with >= 1 kept segment, in manifest order
    dropped: dict[str, int]

    @property
    def kept(self) -> list[_Item]:
        return [item for _, items in self.talks for item in items]


# --------------------------------------------------------------------------- validation + plan


def _check_tsv_safe(reader: CorpusReader, segments: list[Segment], split: str) -> None:
    """CorpusError (file + line / entry) for a text with a tab or CR, or a speaker id with a tab or
    line break: the TSV manifests are written without quoting or escaping."""
    src_lang, _, tgt_lang = reader.pair.partition("-")
    for i, seg in enumerate(segments):
        for text, lang in ((seg.src_text, src_lang), (seg.tgt_text, tgt_lang)):
            if "\t" in text or "\r" in text:
                what = "a tab" if "\t" in text else "a carriage return (CRLF line ends?)"
                where = reader.text_file(split, lang)
                raise CorpusError(f"{where}:{i + 1}: line {i + 1} contains {what}, which the TSV manifest cannot hold")
        if any(ch in seg.speaker for ch in "\t\r\n"):
            raise CorpusError(f"{reader.listing_of(seg)}: entry {i}: speaker_id {seg.speaker!r} contains a tab or line break")


def _plan_split(reader: CorpusReader, split: str, segments: list[Segment], talk_samples: dict[Path, int],
                cfg: PrepareParams) -> _SplitPlan:
    sample_rate = reader.sample_rate
    dropped = {r: 0 for r in DROP_REASONS}
    talks: dict[Path, list[_Item]] = {}
    for i, seg in enumerate(segments):
        start, end = reader.segment_bounds(seg, talk_samples[seg.wav], i)  # CorpusError if past the end
        n = num_frames(end - start, sample_rate)
        if n < cfg.min_frames:
            reason = "too_short"
        elif not seg.src_text.strip() or not seg.tgt_text.strip():
            reason = "empty_text"
        elif split == cfg.train_split and n > cfg.max_frames_train:
            reason = "too_long"
        else:
            reason = None
        if reason is not None:
            dropped[reason] += 1
            continue
        talks.setdefault(seg.wav, []).append(_Item(i, seg, end - start, n))
    return _SplitPlan(split, len(segments), list(talks.items()), dropped)


def plan(reader: CorpusReader, cfg: PrepareParams) -> list[_SplitPlan]:
    """Step 1 + 2: validate the whole input and decide what is kept (no audio decoding)."""
    cfg.validate()
    per_split = {split: reader.read_split(split) for split in cfg.splits}
    for split, segments in per_split.items():
        _check_tsv_safe(reader, segments, split)
    talk_samples: dict[Path, int] = {}
    for segments in per_split.values():
        for seg in segments:
            if seg.wav not in talk_samples:
                talk_samples[seg.wav] = reader.probe_talk(seg.wav)
    return [_plan_split(reader, s, per_split[s], talk_samples, cfg) for s in cfg.splits]


# --------------------------------------------------------------------------- extraction


_Task = tuple[CorpusReader, str, list[tuple[Segment, int, int]], int]  # reader, wav, [(segment, entry, n_frames)], n_mels


def _init_worker() -> None:
    """Pool initializer: Ctrl-C is the parent's to handle; one torch thread (identical bytes)."""
    ignore_sigint()
    torch.set_num_threads(1)


def _extract_talk(task: _Task) -> list[np.ndarray]:
    """Worker: load one talk, cut its segments, return their fbank features (in order).

    Module-level and driven only by its argument, so it works under any start method."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    reader, wav, items, n_mels = task
    talk = reader.load_talk(Path(wav))
    out = []
    for seg, entry, expected in items:
        feats = fbank(reader.cut_segment(talk, seg, entry), reader.sample_rate, n_mels)
        if feats.shape[0] != expected:
            raise CorpusError(
                f"{wav}: segment {seg.id} (entry {entry} of {reader.listing_of(seg)}) gave {feats.shape[0]} "
                f"frames, expected {expected} from the file header (truncated or corrupted audio?)"
            )
        out.append(feats)
    return out


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _start_method() -> str:
    # fork is instant and safe here: workers set one torch thread before any torch op and get all
    # their input through task arguments. Elsewhere, spawn (the code is spawn-safe).
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


WORKER_DIED_HINT = "lower prepare.workers (each worker holds a whole talk's audio and features)"


def _features(tasks: list[_Task], pool: Any | None, max_in_flight: int) -> Iterator[list[np.ndarray]]:
    """Features of each task, in task order; at most ``max_in_flight`` talks submitted ahead."""
    if pool is None:
        with _one_torch_thread():
            for task in tasks:
                yield _extract_talk(task)
        return
    yield from ordered_results(pool, _extract_talk, tasks, max_in_flight, what="a preprocessing worker",
                               hint=WORKER_DIED_HINT)


def _write_split(reader: CorpusReader, p: _SplitPlan, tmp: Path, cfg: PrepareParams, pool: Any | None,
                 progress: bool) -> None:
    kept = p.kept
    total = sum(item.n_frames for item in kept)
    tasks: list[_Task] = [
        (reader, str(wav), [(it.segment, it.entry, it.n_frames) for it in items], cfg.n_mels)
        for wav, items in p.talks
    ]
    rows = []
    bar = tqdm(total=len(kept), desc=f"prepare {reader.pair} {p.split}", unit="seg", disable=not progress)
    with bar, FeatureStoreWriter(tmp / f"{p.split}.fbank.npy", total, cfg.n_mels) as store, \
            closing(_features(tasks, pool, 2 * cfg.workers)) as results:
        for (wav, items), feats in zip(p.talks, results):
            for item, f in zip(items, feats, strict=True):
                ref = store.write(f)
                seg = item.segment
                rows.append((seg.id, ref, str(item.n_frames), seg.src_text, seg.tgt_text, seg.speaker))
            bar.update(len(items))
    with open(tmp / f"{p.split}.tsv", "w", encoding="utf-8", newline="") as f:
        w = tsv_writer(f)
        w.writerow(MANIFEST_COLUMNS)
        w.writerows(rows)


# --------------------------------------------------------------------------- entry point


def prepare_pair(mustc_root: Path, pair: str, out_dir: Path, cfg: PrepareParams, progress: bool = True) -> dict:
    """Prepare language pair ``pair`` of the corpus at ``mustc_root`` into ``out_dir`` (the reader its layout
    picks: :func:`lib.data.corpora.open_corpus`).

    Returns the report (also written to ``out_dir/report.json``): per split the segments read,
    kept, dropped by reason, talks, kept frames and kept audio seconds; the requested and actual
    vocabulary sizes; the settings that determine the output (``workers`` is left out: it does
    not change a byte). Raises :class:`CorpusError` for bad input, before any heavy work;
    :class:`~lib.data.store.InsufficientSpaceError` when the stores would not fit on the output's
    file system, before anything is written; :class:`~lib.params.ParamError` for a vocabulary size
    SentencePiece cannot build; :class:`~lib.pool.WorkerDied` when a worker process dies. On any
    failure, KeyboardInterrupt included, no temporary folder is left and an old ``out_dir`` is kept.
    """
    reader = open_corpus(Path(mustc_root), pair)
    sample_rate = reader.sample_rate
    plans = plan(reader, cfg)
    train = next(p for p in plans if p.split == cfg.train_split)
    train_kept = train.kept
    if not train_kept:
        drops = ", ".join(f"{n} {r}" for r, n in train.dropped.items() if n)
        raise CorpusError(f"{reader.text_file(cfg.train_split, pair.partition('-')[0]).parent}: no segment of the "
                          f"train split survives the filters ({train.n_segments} segments dropped: {drops or 'none'}; "
                          f"prepare.min_frames, prepare.max_frames_train, or empty lines in the text files)")

    report: dict[str, Any] = {
        "pair": pair,
        "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "workers"},
        "splits": {},
        "vocab": {},
    }
    for p in plans:
        kept = p.kept
        report["splits"][p.split] = {
            "segments": p.n_segments,
            "kept": len(kept),
            "dropped": dict(p.dropped),
            "talks": len(p.talks),
            "kept_frames": sum(it.n_frames for it in kept),
            "kept_audio_seconds": round(sum(it.n_samples for it in kept) / sample_rate, 3),
        }
    report["config"]["splits"] = list(cfg.splits)

    out_dir = Path(out_dir)
    check_free_space(sum(store_nbytes(r["kept_frames"], cfg.n_mels) for r in report["splits"].values()),
                     out_dir.parent)
    with atomic_dir(out_dir) as tmp:
        for key, model, texts, size in (
            ("asr", ASR_MODEL, [it.segment.src_text for it in train_kept], cfg.asr_vocab_size),
            ("st", ST_MODEL, [it.segment.tgt_text for it in train_kept], cfg.st_vocab_size),
        ):
            try:
                actual = train_sentencepiece(texts, tmp / model, size)
            except SentencePieceError as e:
                side = "source transcripts" if key == "asr" else "target translations"
                raise ParamError(f"prepare.{key}_vocab_size: {size} does not work for the {cfg.train_split} "
                                 f"split's {side}: {e.reason}") from None
            report["vocab"][key] = {"model": model, "requested": size, "actual": actual}

        if cfg.workers > 1:
            with worker_pool(cfg.workers, _start_method(), initializer=_init_worker) as pool:
                for p in plans:
                    _write_split(reader, p, tmp, cfg, pool, progress)
        else:
            for p in plans:
                _write_split(reader, p, tmp, cfg, None, progress)
        atomic_write_json(tmp / REPORT, report)
    return report
