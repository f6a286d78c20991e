"""SentencePiece unigram training/loading with fairseq's special ids."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from lib.data.vocab import load_sentencepiece, train_sentencepiece

SYLLABLES = ["ka", "lo", "mi", "ten", "ru", "sa", "po", "vel", "di", "nor", "be", "gu"]
WORDS = [a + b + c for a, b, c in itertools.product(SYLLABLES[:6], SYLLABLES[3:9], SYLLABLES[6:])]  # 216
SENTENCES = [" ".join(WORDS[(i * 7 + k * 13) % len(WORDS)] for k in range(8)) for i in range(300)]


def test_trains_and_special_ids(tmp_path: Path) -> None:
    path = tmp_path / "spm.model"
    n = train_sentencepiece(SENTENCES, path, 60)
    assert path.is_file() and n == 60
    sp = load_sentencepiece(path)
    assert sp.get_piece_size() == n
    assert (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id()) == (0, 1, 2, 3)
    assert [sp.id_to_piece(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    text = " ".join(WORDS[:5])
    ids = sp.encode(text)
    assert ids and all(3 < i < n for i in ids)
    assert sp.decode(ids) == text


def test_byte_identical_twice(tmp_path: Path) -> None:
    a, b = tmp_path / "a.model", tmp_path / "b.model"
    train_sentencepiece(iter(SENTENCES), a, 50)
    train_sentencepiece(list(SENTENCES), b, 50)
    assert a.read_bytes() == b.read_bytes()


def test_small_corpus_gives_smaller_vocab(tmp_path: Path) -> None:
    path = tmp_path / "small.model"
    n = train_sentencepiece(["a b c", "a b", "c a b", "", "  "], path, 5000)
    assert 4 < n < 5000
    assert load_sentencepiece(path).get_piece_size() == n


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no non-empty text"):
        train_sentencepiece(["", " "], tmp_path / "x.model", 100)
    with pytest.raises(ValueError, match="x.model"):  # fewer pieces than characters + specials
        train_sentencepiece(["".join(chr(0x61 + i) for i in range(26))], tmp_path / "x.model", 10)
    assert not (tmp_path / "x.model").exists()
    (tmp_path / "junk.model").write_bytes(b"not a model")
    from lib.io import InputError

    with pytest.raises(InputError, match="junk.model: cannot load SentencePiece model.*prepare or prepare_multi"):
        load_sentencepiece(tmp_path / "junk.model")


def test_a_model_with_other_special_ids_is_refused(tmp_path: Path) -> None:
    """SentencePiece's own defaults (unk 0, bos 1, eos 2, no pad) are not fairseq's dictionary."""
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES), model_writer=buf, vocab_size=60,
                                   hard_vocab_limit=False, minloglevel=2, num_threads=1)
    (tmp_path / "default.model").write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match=r"default\.model: special ids \(bos, pad, eos, unk\) = \(1, -1, 2, 0\), "
                                         r"expected \(0, 1, 2, 3\)"):
        load_sentencepiece(tmp_path / "default.model")
