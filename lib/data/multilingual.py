"""Multilingual ST data over the prepared pairs (Gong et al.'s setting; docs/variants.md): one joint
target vocabulary with target-language tags, and a dataset that concatenates the pairs' splits.

* :func:`prepare_joint_vocab` trains one SentencePiece model on the train targets of every pair, with
  the tags ``<lang:de>``, ``<lang:es>``, ... as user-defined symbols (single pieces, ids 4, 5, ...
  right after fairseq's specials, in the order of ``pairs``), and writes ``tasks.json``: task id =
  index of the pair in ``pairs``, its tag and tag id. Cheap (a few thousand sentences).
* :class:`MultiSpeechDataset` concatenates one split of several prepared pairs (features are read
  from each pair's own ``data/prepared/<pair>/``, nothing is copied) and tokenises the translations
  with the joint model. Per item it exposes ``task_ids`` and ``start_ids`` (the tag), which
  :func:`lib.data.dataset.collate` turns into ``Batch.task`` and the first decoder input: the tag
  replaces eos as the start token, so the target is ``[y1, ..., eos]`` with no loss on the tag
  (fairseq's ``--prefix-size 1 --ignore-prefix-size 1``, without prefix forcing at inference).
  Length bucketing runs over the union, so batches mix languages.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from lib.data.dataset import EOS_ID, UNK_ID
from lib.data.features import utterance_cmvn
from lib.data.manifest import read_manifest
from lib.data.store import check_refs, read_features
from lib.data.vocab import load_sentencepiece, train_sentencepiece
from lib.io import atomic_write_json, read_json

__all__ = ["JOINT_SPM", "TASKS_JSON", "MultiSpeechDataset", "language_tag", "load_tasks", "prepare_joint_vocab"]

JOINT_SPM = "spm_multi.model"
TASKS_JSON = "tasks.json"


def language_tag(pair: str) -> str:
    """``en-de`` -> ``<lang:de>`` (the target language's tag)."""
    return f"<lang:{pair.split('-', 1)[1]}>"


def prepare_joint_vocab(prepared_root: Path, pairs: Sequence[str], out_dir: Path, vocab_size: int) -> dict:
    """Train the joint target vocabulary on the train translations of ``pairs`` (read from
    ``prepared_root/<pair>/train.tsv``) and write ``out_dir/spm_multi.model`` and ``tasks.json``.
    Returns the tasks description. FileNotFoundError names a missing manifest."""
    texts: list[str] = []
    for pair in pairs:
        manifest = Path(prepared_root) / pair / "train.tsv"
        if not manifest.is_file():
            raise FileNotFoundError(f"{manifest}: missing; it is written by the prepare@{pair} stage")
        texts += [r["tgt_text"] for r in read_manifest(manifest)]
    tags = [language_tag(p) for p in pairs]
    out_dir = Path(out_dir)
    size = train_sentencepiece(texts, out_dir / JOINT_SPM, vocab_size, user_defined_symbols=tags)
    sp = load_sentencepiece(out_dir / JOINT_SPM)
    tasks = {"pairs": list(pairs), "tags": tags, "tag_ids": [sp.piece_to_id(t) for t in tags],
             "vocab_size": size, "train_sentences": len(texts)}
    atomic_write_json(out_dir / TASKS_JSON, tasks)
    return tasks


def load_tasks(vocab_dir: Path) -> dict:
    path = Path(vocab_dir) / TASKS_JSON
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; it is written by the prepare_multi stage")
    return read_json(path, "prepare_multi", keys=("pairs", "tag_ids"))


class MultiSpeechDataset:
    """One split of several prepared pairs as one ST dataset with a joint vocabulary.

    ``pairs`` must be among the pairs the joint vocabulary was built for (``tasks.json``); the task id
    of an item is its pair's index there, so one model's task ids stay fixed whatever subset is
    loaded. Items keep each pair's manifest order, pairs in the order given."""

    task = "st"

    def __init__(self, prepared_root: Path, pairs: Sequence[str], split: str, vocab_dir: Path, *,
                 max_frames: int | None = None, max_target_tokens: int | None = None) -> None:
        self.prepared_root, self.split = Path(prepared_root), split
        tasks = load_tasks(vocab_dir)
        unknown = [p for p in pairs if p not in tasks["pairs"]]
        if unknown:
            raise ValueError(f"{Path(vocab_dir) / TASKS_JSON}: no task for pair(s) {unknown}; it covers "
                             f"{tasks['pairs']} (rerun prepare_multi)")
        self.spm = load_sentencepiece(Path(vocab_dir) / JOINT_SPM)
        self.tag_ids = set(tasks["tag_ids"])  # dropped from detokenised output
        self.pairs = list(pairs)
        self.task_of_pair = {p: tasks["pairs"].index(p) for p in pairs}
        self.tag_id_of_pair = {p: tasks["tag_ids"][tasks["pairs"].index(p)] for p in pairs}
        self.rows: list[dict] = []
        self.targets: list[list[int]] = []
        self.task_ids: list[int] = []
        self.start_ids: list[int] = []
        self.item_pair: list[str] = []
        for pair in pairs:
            manifest = self.prepared_root / pair / f"{split}.tsv"
            if not manifest.is_file():
                raise FileNotFoundError(f"{manifest}: no such manifest (run the prepare stage first)")
            rows = read_manifest(manifest)
            check_refs(self.prepared_root / pair, (r["audio"] for r in rows), str(manifest))  # before any batch
            ids = self.spm.encode([r["tgt_text"] for r in rows])
            for r, t in zip(rows, ids):
                if max_frames is not None and int(r["n_frames"]) > max_frames:
                    continue
                if max_target_tokens is not None and len(t) + 1 > max_target_tokens:
                    continue
                self.rows.append(r)
                self.targets.append(t + [EOS_ID])
                self.task_ids.append(self.task_of_pair[pair])
                self.start_ids.append(self.tag_id_of_pair[pair])
                self.item_pair.append(pair)
        self.n_frames = np.array([int(r["n_frames"]) for r in self.rows], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def vocab_size(self) -> int:
        return self.spm.get_piece_size()

    def features(self, i: int) -> Tensor:
        feats = torch.from_numpy(np.array(read_features(self.prepared_root / self.item_pair[i], self.rows[i]["audio"])))
        return utterance_cmvn(feats)

    def reference(self, i: int) -> str:
        return self.rows[i]["tgt_text"]

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenised text; specials, unknown pieces and language tags dropped."""
        return self.spm.decode([i for i in ids if i > UNK_ID and i not in self.tag_ids])

    def indices_of(self, pair: str) -> list[int]:
        """The items of one pair, in manifest order."""
        return [i for i, p in enumerate(self.item_pair) if p == pair]
