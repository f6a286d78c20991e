"""lib/data/dataset.py: SpeechDataset's targets are the task's text (ASR: the English transcript, ST:
the translation) tokenised by the task's own SentencePiece model, and batch_by_frames' order is a
function of (seed, epoch)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from lib.data.dataset import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SpeechDataset, batch_by_frames, collate
from lib.data.prepare import prepare_pair
from lib.params import PrepareParams
from tests.corpus_factory import DE, EN, default_spec, make_corpus


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dataset")
    make_corpus(root / "mustc", default_spec())
    out = root / "prepared" / "en-de"
    prepare_pair(root / "mustc", "en-de", out,
                 PrepareParams(workers=1, max_frames_train=3000, asr_vocab_size=40, st_vocab_size=45), progress=False)
    return out


def _manifest(path: Path) -> list[dict[str, str]]:
    """The manifest's rows, parsed here (not by lib.data.manifest): a header line, then tab-separated fields."""
    header, *lines = path.read_text(encoding="utf-8").splitlines()
    return [dict(zip(header.split("\t"), line.split("\t"))) for line in lines]


@pytest.mark.parametrize("task", ["asr", "st"])
@pytest.mark.parametrize("split", ["train", "dev"])
def test_targets_are_the_tasks_text_in_the_tasks_vocabulary_then_eos(prepared: Path, task: str, split: str) -> None:
    """ASR learns to write the English transcript (spm_asr), ST the German translation (spm_st): item i's
    target is that text of manifest row i, encoded by the task's model, then eos. An ST dataset that
    read the transcript (or the ASR vocabulary) would train a second ASR model and no test else sees it."""
    rows = _manifest(prepared / f"{split}.tsv")
    text = "src_text" if task == "asr" else "tgt_text"
    sp = spm.SentencePieceProcessor(model_file=str(prepared / f"spm_{task}.model"))
    ds = SpeechDataset(prepared, split, task)
    assert len(ds) == len(rows) >= 3
    for i, row in enumerate(rows):
        assert row[text] in (EN if task == "asr" else DE)  # the corpus side the task reads
        assert ds.rows[i]["id"] == row["id"] and ds.reference(i) == row[text]
        assert ds.targets[i] == sp.encode(row[text]) + [EOS_ID], (task, row["id"])
        assert sp.decode(ds.targets[i][:-1]) == row[text]
    other = "tgt_text" if task == "asr" else "src_text"
    assert all(ds.targets[i] != sp.encode(row[other]) + [EOS_ID] for i, row in enumerate(rows))


def test_max_target_tokens_counts_the_tasks_tokens_and_eos(prepared: Path) -> None:
    """The max_target_tokens filter keeps exactly the items whose target (translation tokens + eos for ST)
    fits, and keeps their targets aligned with their rows."""
    rows = _manifest(prepared / "train.tsv")
    sp = spm.SentencePieceProcessor(model_file=str(prepared / "spm_st.model"))
    lengths = [len(sp.encode(r["tgt_text"])) + 1 for r in rows]
    limit = sorted(lengths)[len(lengths) // 2]
    assert min(lengths) <= limit < max(lengths)
    ds = SpeechDataset(prepared, "train", "st", max_target_tokens=limit)
    kept = [r for r, n in zip(rows, lengths) if n <= limit]
    assert [r["id"] for r in ds.rows] == [r["id"] for r in kept]
    assert ds.targets == [sp.encode(r["tgt_text"]) + [EOS_ID] for r in kept]


def test_batch_order_is_a_function_of_seed_and_epoch() -> None:
    """The data order of an epoch comes from (seed, epoch): the same pair gives the same batches (a resumed
    run replays them), another epoch or another seed another order (each epoch reshuffles). Every order
    is a partition of the items into batches within max_frames."""
    n_frames = np.random.default_rng(0).integers(20, 120, size=60).tolist()

    def order(seed: int, epoch: int) -> list[list[int]]:
        return batch_by_frames(n_frames, 400, shuffle=True, seed=seed, epoch=epoch)

    for seed, epoch in ((1, 0), (1, 1), (2, 0)):
        batches = order(seed, epoch)
        assert batches == order(seed, epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(n_frames)))
        assert all(len(b) * max(n_frames[i] for i in b) <= 400 for b in batches)
    epochs = [order(1, e) for e in range(4)]
    assert all(epochs[a] != epochs[b] for a in range(4) for b in range(a + 1, 4))
    assert order(1, 0) != order(2, 0) and order(1, 1) != order(2, 1)
    # unshuffled: sorted by length whatever the seed and epoch (dev batches)
    plain = batch_by_frames(n_frames, 400, shuffle=False)
    assert batch_by_frames(n_frames, 400, shuffle=False, seed=3, epoch=5) == plain
    flat = [i for b in plain for i in b]
    assert [n_frames[i] for i in flat] == sorted(n_frames)


# ----------------------------------------------------------------------------- mutation-audit additions


def test_batch_by_frames_limits_are_inclusive_by_hand() -> None:
    """``len(batch) * longest <= max_frames``: a batch that fills max_frames exactly is allowed; one more
    frame is not. ``max_sentences`` caps the batch at exactly that many items."""
    assert batch_by_frames([5, 5, 5], 10, shuffle=False) == [[0, 1], [2]]
    assert batch_by_frames([5, 5, 5], 9, shuffle=False) == [[0], [1], [2]]
    assert batch_by_frames([5, 5, 5], 15, shuffle=False) == [[0, 1, 2]]
    # padded size counts the longest item: 3 + 4 -> 2 * 4 = 8 <= 8, adding 6 -> 3 * 6 = 18 > 8
    assert batch_by_frames([4, 6, 3], 8, shuffle=False) == [[2, 0], [1]]
    assert batch_by_frames([1, 1, 1], 100, shuffle=False, max_sentences=2) == [[0, 1], [2]]
    assert batch_by_frames([1, 1, 1], 100, shuffle=False, max_sentences=3) == [[0, 1, 2]]
    assert batch_by_frames([1, 1, 1], 100, shuffle=False, max_sentences=1) == [[0], [1], [2]]
    # an item longer than max_frames gets a batch of its own
    assert batch_by_frames([3, 20, 3], 10, shuffle=False) == [[0, 2], [1]]


def test_max_frames_filter_keeps_an_item_of_exactly_max_frames(prepared: Path) -> None:
    rows = _manifest(prepared / "train.tsv")
    frames = sorted(int(r["n_frames"]) for r in rows)
    limit = frames[len(frames) // 2]
    assert frames[0] <= limit < frames[-1]
    ds = SpeechDataset(prepared, "train", "st", max_frames=limit)
    assert [r["id"] for r in ds.rows] == [r["id"] for r in rows if int(r["n_frames"]) <= limit]
    assert limit in ds.n_frames.tolist()


def test_collate_pads_to_the_longest_item_or_the_next_multiple(prepared: Path) -> None:
    """Default padding is the longest item (fairseq); ``pad_frames_to`` / ``pad_tokens_to`` round it up to
    the next multiple and never add a whole multiple to a length that already is one."""
    ds = SpeechDataset(prepared, "train", "st")
    idx = [0, 1, 2]
    longest = max(int(ds.n_frames[i]) for i in idx)
    tmax = max(len(ds.targets[i]) for i in idx)
    b = collate(ds, idx)
    assert b.feats.shape[:2] == (3, longest) and b.target.shape == (3, tmax) == b.prev_tokens.shape
    assert b.feat_lengths.tolist() == [int(ds.n_frames[i]) for i in idx]
    for k, i in enumerate(idx):
        n = int(ds.n_frames[i])
        assert float(b.feats[k, n:].abs().sum()) == 0.0  # zero padded frames
        assert b.target[k, len(ds.targets[i]):].eq(PAD_ID).all()
    b4 = collate(ds, idx, pad_frames_to=4, pad_tokens_to=5)
    assert b4.feats.shape[1] == -(-longest // 4) * 4 and b4.target.shape[1] == -(-tmax // 5) * 5
    exact = collate(ds, idx, pad_frames_to=longest, pad_tokens_to=tmax)
    assert exact.feats.shape[1] == longest and exact.target.shape[1] == tmax


def test_decode_drops_bos_pad_eos_and_unk(prepared: Path) -> None:
    """Special ids and <unk> never reach the detokenised text (so BLEU never sees ' ⁇ ')."""
    ds = SpeechDataset(prepared, "train", "st")
    body = ds.targets[0][:-1]
    assert ds.decode(body) == ds.reference(0)
    noisy = [BOS_ID, UNK_ID] + body[:1] + [UNK_ID, PAD_ID] + body[1:] + [EOS_ID, UNK_ID]
    assert ds.decode(noisy) == ds.reference(0)


def test_a_damaged_prepared_folder_stops_when_the_dataset_is_built(prepared: Path, tmp_path: Path) -> None:
    """A store cut short, a SentencePiece model that does not load, a missing one: each an error naming the
    file when the dataset is built (before a run trains or decodes anything), not a RuntimeError from
    SentencePiece or numpy's error at the first batch that reaches the damage."""
    import shutil

    from lib.io import InputError

    copy = tmp_path / "en-de"
    shutil.copytree(prepared, copy)
    store = copy / "train.fbank.npy"
    store.write_bytes(store.read_bytes()[: store.stat().st_size - 4000])
    with pytest.raises(InputError, match=r"train\.fbank\.npy: not a readable feature store"):
        SpeechDataset(copy, "train", "st")
    arr = np.load(prepared / "train.fbank.npy")
    np.save(store, arr[: len(arr) // 2])  # a whole .npy, but shorter than the manifest says
    with pytest.raises(InputError, match=r"train\.fbank\.npy: .*train\.tsv references .*, past the store's"):
        SpeechDataset(copy, "train", "st")
    SpeechDataset(copy, "dev", "asr")  # the other splits are intact
    model = copy / "spm_st.model"
    model.write_bytes(model.read_bytes()[:100])
    with pytest.raises(InputError, match=r"spm_st\.model: cannot load SentencePiece model .*prepare stage"):
        SpeechDataset(copy, "dev", "st")
    model.unlink()
    with pytest.raises(FileNotFoundError, match=r"spm_st\.model: missing; it is written by the prepare stage"):
        SpeechDataset(copy, "dev", "st")
