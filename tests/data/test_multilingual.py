"""lib/data/multilingual.py (docs/variants.md): the joint vocabulary has the
language tags as single pieces with ids 4.., the multilingual dataset carries task ids and tags,
collate makes the tag the first decoder input and fills Batch.task, and bad inputs name the file."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lib.data.dataset import EOS_ID, SpeechDataset, batch_by_frames, collate
from lib.data.multilingual import (JOINT_SPM, TASKS_JSON, MultiSpeechDataset, language_tag, load_tasks,
                                   prepare_joint_vocab)
from lib.data.prepare import prepare_pair
from lib.data.vocab import load_sentencepiece
from lib.params import PrepareParams
from tests.corpus_factory import default_spec, make_corpus

PAIRS = ["en-de", "en-es"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("multi")
    for pair in PAIRS:
        make_corpus(root / "mustc", default_spec(), pair=pair)
        prepare_pair(root / "mustc", pair, root / "prepared" / pair,
                     PrepareParams(workers=1, max_frames_train=3000, asr_vocab_size=40, st_vocab_size=45),
                     progress=False)
    prepare_joint_vocab(root / "prepared", PAIRS, root / "prepared_multi", 60)
    return root


def test_joint_vocab_has_the_tags_as_single_pieces(prepared: Path) -> None:
    tasks = load_tasks(prepared / "prepared_multi")
    assert tasks["pairs"] == PAIRS and tasks["tags"] == ["<lang:de>", "<lang:es>"] and tasks["tag_ids"] == [4, 5]
    sp = load_sentencepiece(prepared / "prepared_multi" / JOINT_SPM)
    assert sp.encode("<lang:es>", out_type=str) == ["▁", "<lang:es>"]  # one piece, never split
    assert [sp.id_to_piece(i) for i in (4, 5)] == ["<lang:de>", "<lang:es>"]
    assert tasks["train_sentences"] == 2 * len(SpeechDataset(prepared / "prepared" / "en-de", "train", "st"))
    assert language_tag("en-it") == "<lang:it>"


def test_dataset_concatenates_pairs_with_task_ids_and_tags(prepared: Path) -> None:
    ds = MultiSpeechDataset(prepared / "prepared", PAIRS, "dev", prepared / "prepared_multi")
    per_pair = {p: SpeechDataset(prepared / "prepared" / p, "dev", "st") for p in PAIRS}
    assert len(ds) == sum(len(d) for d in per_pair.values())
    n_de = len(per_pair["en-de"])
    assert ds.task_ids == [0] * n_de + [1] * len(per_pair["en-es"])
    assert ds.start_ids == [4] * n_de + [5] * len(per_pair["en-es"])
    assert ds.indices_of("en-es") == list(range(n_de, len(ds)))
    # features come from each pair's own prepared folder
    assert torch.equal(ds.features(n_de), per_pair["en-es"].features(0))
    assert ds.reference(n_de) == per_pair["en-es"].reference(0)
    # a subset keeps the task ids of the joint vocabulary
    only_es = MultiSpeechDataset(prepared / "prepared", ["en-es"], "dev", prepared / "prepared_multi")
    assert set(only_es.task_ids) == {1} and set(only_es.start_ids) == {5}


def test_collate_starts_with_the_tag_and_fills_the_task(prepared: Path) -> None:
    ds = MultiSpeechDataset(prepared / "prepared", PAIRS, "train", prepared / "prepared_multi")
    batches = batch_by_frames(ds.n_frames, 10 ** 6, shuffle=True, seed=1)
    (indices,) = batches  # everything in one batch: both languages mixed
    b = collate(ds, indices)
    assert b.task.tolist() == [ds.task_ids[i] for i in indices] and set(b.task.tolist()) == {0, 1}
    for row, i in enumerate(indices):
        n = len(ds.targets[i])
        assert b.prev_tokens[row, 0] == ds.start_ids[i]  # the tag, not eos
        assert b.prev_tokens[row, 1:n].tolist() == ds.targets[i][:-1]
        assert b.target[row, :n].tolist() == ds.targets[i] and ds.targets[i][-1] == EOS_ID  # no loss on the tag
    assert b.to("cpu").task.tolist() == b.task.tolist()
    # a bilingual dataset is collated as before: eos first, no task
    bi = SpeechDataset(prepared / "prepared" / "en-de", "train", "st")
    plain = collate(bi, [0, 1])
    assert plain.task is None and plain.prev_tokens[:, 0].tolist() == [EOS_ID, EOS_ID]


def test_decode_drops_tags(prepared: Path) -> None:
    ds = MultiSpeechDataset(prepared / "prepared", PAIRS, "dev", prepared / "prepared_multi")
    ids = ds.spm.encode(ds.reference(0))
    assert ds.decode([4] + ids + [5, EOS_ID]) == ds.decode(ids) == ds.reference(0)


def test_errors_name_the_file(prepared: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tasks.json: no task for pair\(s\) \['en-it'\]"):
        MultiSpeechDataset(prepared / "prepared", ["en-it"], "dev", prepared / "prepared_multi")
    with pytest.raises(FileNotFoundError, match=f"{TASKS_JSON}: missing; it is written by the prepare_multi"):
        MultiSpeechDataset(prepared / "prepared", PAIRS, "dev", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"en-it/train.tsv: missing; it is written by the prepare@en-it"):
        prepare_joint_vocab(prepared / "prepared", ["en-de", "en-it"], tmp_path / "out", 60)
    assert json.loads((prepared / "prepared_multi" / TASKS_JSON).read_text())["vocab_size"] <= 60


@pytest.mark.parametrize("text, says", [('{"pairs": ["en-de"], "tag', "not valid JSON"), ("[]", "no 'pairs', 'tag_ids'")])
def test_a_damaged_tasks_file_is_named(tmp_path: Path, text: str, says: str) -> None:
    """tasks.json truncated or of another shape: an InputError naming it and prepare_multi (train_multi's one
    line), not json's bare 'Expecting value' or a TypeError from indexing a list."""
    from lib.io import InputError

    (tmp_path / TASKS_JSON).write_text(text)
    with pytest.raises(InputError, match=rf"tasks\.json: {says}.*prepare_multi"):
        load_tasks(tmp_path)
