"""Datasets over prepared manifests, length-bucketed batching by frames, and collation.

A prepared pair folder (``stages/prepare.py``) holds ``<split>.tsv`` manifests whose ``audio``
column refers into ``<split>.fbank.npy``; :class:`SpeechDataset` pairs each utterance's features
with its target token ids (English transcript for ASR, translation for ST).

Batching follows fairseq's ``--max-tokens`` for speech: utterances are sorted by length and
packed so that ``batch_size * longest_utterance <= max_frames`` (padded size, which is what costs
memory); the batch order is shuffled with a seed and the epoch number, so the whole data order is
a function of ``(seed, epoch)`` and a resumed run replays it exactly.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import sentencepiece as spm
import torch
from torch import Tensor

from lib.data.features import spec_augment, utterance_cmvn
from lib.data.manifest import read_manifest
from lib.data.store import check_refs, read_features
from lib.io import InputError

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 1, 2, 0, 3  # fairseq's dictionary convention (lib/data/vocab.py)
TASKS = ("asr", "st")


@dataclass
class SpecAugmentConfig:
    """SpecAugment LB policy as in fairseq's MuST-C recipe (F=27, 1 freq mask, T=100, 1 time mask)."""

    freq_mask_F: int = 27
    freq_mask_N: int = 1
    time_mask_T: int = 100
    time_mask_N: int = 1
    time_mask_p: float = 1.0


@dataclass
class Batch:
    ids: list[str]
    feats: Tensor  # (B, T, n_mels), zero padded
    feat_lengths: Tensor  # (B,)
    prev_tokens: Tensor  # (B, L) decoder input: [eos] + target[:-1], padded with PAD_ID
    target: Tensor  # (B, L) target ids ending with eos, padded with PAD_ID
    target_lengths: Tensor  # (B,)
    src_texts: list[str]
    tgt_texts: list[str]
    # (B,) long task ids (the target-language index of a multilingual model, docs/variants.md)
    # when the dataset has them, else None
    task: Tensor | None = None
    # (B,) float: a folded batch's per-utterance CTC factor, that of the batch it came from
    # (lib.train.loop.merge_batches); None for a collated batch
    ctc_scale: Tensor | None = None

    def to(self, device: torch.device | str) -> "Batch":
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return Batch(self.ids, move(self.feats), move(self.feat_lengths), move(self.prev_tokens),
                     move(self.target), move(self.target_lengths), self.src_texts, self.tgt_texts,
                     None if self.task is None else move(self.task),
                     None if self.ctc_scale is None else move(self.ctc_scale))

    def pin_memory(self) -> "Batch":
        """The batch in page-locked host memory: its copy to a GPU (``to``) then runs asynchronously."""
        pin = lambda t: t.pin_memory()  # noqa: E731
        return Batch(self.ids, pin(self.feats), pin(self.feat_lengths), pin(self.prev_tokens), pin(self.target),
                     pin(self.target_lengths), self.src_texts, self.tgt_texts,
                     None if self.task is None else pin(self.task),
                     None if self.ctc_scale is None else pin(self.ctc_scale))

    @property
    def n_frames(self) -> int:
        return int(self.feat_lengths.sum())

    @property
    def n_target_tokens(self) -> int:
        return int(self.target_lengths.sum())


def _sentencepiece(model: Path) -> spm.SentencePieceProcessor:
    """The SentencePiece model ``model`` of a prepared folder; FileNotFoundError / :class:`lib.io.InputError`
    naming it (SentencePiece's own errors are RuntimeErrors or OSErrors that say nothing of what to do)."""
    if not model.is_file():
        raise FileNotFoundError(f"{model}: missing; it is written by the prepare stage")
    try:
        return spm.SentencePieceProcessor(model_file=str(model))
    except (OSError, RuntimeError) as e:
        raise InputError(f"{model}: cannot load SentencePiece model ({e}); it is written by the prepare stage: "
                         f"`dvc repro` writes it again") from None


class SpeechDataset:
    """One split of one prepared pair for one task ("asr": English targets, "st": translations).

    Hooks read by :func:`collate` (any dataset may have them; None = absent): ``task_ids``, one task
    id per item (-> ``Batch.task``, the target-language index of a multilingual model), and
    ``start_ids``, one decoder start token per item (the target-language tag that replaces ``eos``
    as the first decoder input, docs/variants.md)."""

    task_ids: Sequence[int] | None = None
    start_ids: Sequence[int] | None = None

    def __init__(self, prepared_dir: Path, split: str, task: str, max_frames: int | None = None,
                 max_target_tokens: int | None = None, vocab_dir: Path | None = None, *,
                 task_id: int | None = None, start_id: int | None = None) -> None:
        """``vocab_dir``: the prepared folder whose SentencePiece model tokenises the targets (default
        ``prepared_dir``; another pair's for a model trained with that pair's vocabulary).
        ``task_id`` / ``start_id``: the same task id / decoder start token for every item (None:
        no task ids / ``eos``)."""
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        self.prepared_dir = Path(prepared_dir)
        manifest = self.prepared_dir / f"{split}.tsv"
        if not manifest.is_file():
            raise FileNotFoundError(f"{manifest}: no such manifest (run the prepare stage first)")
        self.split, self.task = split, task
        self.spm = _sentencepiece(
            Path(vocab_dir or self.prepared_dir) / ("spm_asr.model" if task == "asr" else "spm_st.model"))
        rows = read_manifest(manifest)
        texts = [r["src_text"] if task == "asr" else r["tgt_text"] for r in rows]
        token_ids = self.spm.encode(texts)
        keep = [i for i, r in enumerate(rows)
                if (max_frames is None or int(r["n_frames"]) <= max_frames)
                and (max_target_tokens is None or len(token_ids[i]) + 1 <= max_target_tokens)]
        self.rows = [rows[i] for i in keep]
        check_refs(self.prepared_dir, (r["audio"] for r in self.rows), str(manifest))  # before any batch
        self.targets = [token_ids[i] + [EOS_ID] for i in keep]
        self.n_frames = np.array([int(r["n_frames"]) for r in self.rows], dtype=np.int64)
        if task_id is not None:
            self.task_ids = [int(task_id)] * len(self.rows)
        if start_id is not None:
            self.start_ids = [int(start_id)] * len(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def vocab_size(self) -> int:
        return self.spm.get_piece_size()

    def features(self, i: int) -> Tensor:
        """Utterance-CMVN-normalised features ``(T, n_mels)`` of item ``i``."""
        feats = torch.from_numpy(np.array(read_features(self.prepared_dir, self.rows[i]["audio"])))
        return utterance_cmvn(feats)

    def reference(self, i: int) -> str:
        return self.rows[i]["src_text"] if self.task == "asr" else self.rows[i]["tgt_text"]

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenised text of ``ids`` (special ids dropped; unknown pieces dropped too, so ``<unk>``
        never reaches the BLEU computation)."""
        return self.spm.decode([i for i in ids if i > UNK_ID])


def batch_by_frames(n_frames: Sequence[int], max_frames: int, *, shuffle: bool, seed: int = 0,
                    epoch: int = 0, max_sentences: int | None = None) -> list[list[int]]:
    """Length-bucketed batches with ``len(batch) * max(n_frames in batch) <= max_frames``.

    Sorted by length (ties broken randomly when shuffling), packed greedily, then the batch order is
    shuffled with ``Random(seed * 100003 + epoch)``. An utterance longer than ``max_frames`` gets a
    batch of its own (the dataset's ``max_frames`` filter is the place to drop it).
    """
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    rng = random.Random(seed * 100003 + epoch)
    order = list(range(len(n_frames)))
    if shuffle:
        rng.shuffle(order)
    order.sort(key=lambda i: n_frames[i])  # stable: shuffled ties
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        longest_if_added = max(longest, n_frames[i])
        too_many = max_sentences is not None and len(current) + 1 > max_sentences
        if current and (longest_if_added * (len(current) + 1) > max_frames or too_many):
            batches.append(current)
            current, longest_if_added = [], n_frames[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


def first_batches(dataset: "SpeechDataset", max_frames: int, n: int, *, seed: int = 0, pad_frames_to: int = 1,
                  pad_tokens_to: int = 1) -> list["Batch"]:
    """The first ``n`` batches of a shuffled :func:`batch_by_frames` epoch, collated without
    SpecAugment: the real training batches that a precision probe or a benchmark times."""
    return [collate(dataset, idx, pad_frames_to=pad_frames_to, pad_tokens_to=pad_tokens_to)
            for idx in batch_by_frames(dataset.n_frames, max_frames, shuffle=True, seed=seed)[:n]]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def collate(dataset: SpeechDataset, indices: Sequence[int], *, specaugment: SpecAugmentConfig | None = None,
            generator: torch.Generator | None = None, pad_frames_to: int = 1, pad_tokens_to: int = 1) -> Batch:
    """Pad a list of items into a :class:`Batch`; SpecAugment (train only) draws from ``generator``.
    The dataset's optional ``task_ids`` fill ``Batch.task`` and its optional ``start_ids`` replace
    ``eos`` as the first decoder input (see :class:`SpeechDataset`).

    ``pad_frames_to`` / ``pad_tokens_to`` round the padded frame / target length up to a multiple
    (1: to the longest item, as fairseq does). Fewer distinct batch shapes let oneDNN reuse the
    kernels it compiles per matrix shape (bf16 autocast on CPU: benchmarks/train_real_batches.py).
    The extra positions are padding like any other (masked by ``feat_lengths`` / PAD_ID), so the
    model computes the same function; in training, dropout draws its masks for the larger shape."""
    if pad_frames_to < 1 or pad_tokens_to < 1:
        raise ValueError(f"pad_frames_to and pad_tokens_to must be >= 1, got {pad_frames_to}, {pad_tokens_to}")
    feats = []
    for i in indices:
        f = dataset.features(i)
        if specaugment is not None:
            f = spec_augment(f, generator, freq_mask_F=specaugment.freq_mask_F, freq_mask_N=specaugment.freq_mask_N,
                             time_mask_T=specaugment.time_mask_T, time_mask_N=specaugment.time_mask_N,
                             time_mask_p=specaugment.time_mask_p)
        feats.append(f)
    lengths = torch.tensor([f.shape[0] for f in feats], dtype=torch.long)
    padded = torch.zeros(len(feats), _round_up(int(lengths.max()), pad_frames_to), feats[0].shape[1])
    for b, f in enumerate(feats):
        padded[b, : f.shape[0]] = f
    targets = [dataset.targets[i] for i in indices]
    tlen = torch.tensor([len(t) for t in targets], dtype=torch.long)
    target = torch.full((len(targets), _round_up(int(tlen.max()), pad_tokens_to)), PAD_ID, dtype=torch.long)
    prev = torch.full_like(target, PAD_ID)
    start_ids = getattr(dataset, "start_ids", None)
    for b, (i, t) in enumerate(zip(indices, targets)):
        target[b, : len(t)] = torch.tensor(t)
        # fairseq feeds eos as the first decoder input; a multilingual dataset its target-language tag
        prev[b, 0] = EOS_ID if start_ids is None else start_ids[i]
        prev[b, 1: len(t)] = torch.tensor(t[:-1])
    rows = [dataset.rows[i] for i in indices]
    task_ids = getattr(dataset, "task_ids", None)
    task = None if task_ids is None else torch.tensor([task_ids[i] for i in indices], dtype=torch.long)
    return Batch([r["id"] for r in rows], padded, lengths, prev, target, tlen,
                 [r["src_text"] for r in rows], [r["tgt_text"] for r in rows], task)
