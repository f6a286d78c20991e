"""SentencePiece unigram vocabularies, as in fairseq's S2T recipes (``data_utils.gen_vocab``).

Special ids follow fairseq's dictionary: ``<s>``=0 (bos), ``<pad>``=1, ``</s>``=2 (eos),
``<unk>``=3. Training runs in memory, single-threaded and with a fixed random seed, so identical
input texts give a byte-identical model file; the file is written atomically.
"""
from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from lib.io import InputError, atomic_write_bytes

BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SEED = 1234
"""Seed of SentencePiece's global random generator, set before every training run."""


class SentencePieceError(ValueError):
    """SentencePiece could not train a model; ``reason`` is its own message, without the C++
    source location, for callers that name the param at fault instead of the (temporary) path."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _reason(e: RuntimeError) -> str:
    """``INTERNAL: src/x.cc(638) [cond] Vocabulary size is ...`` -> ``Vocabulary size is ...``."""
    return re.sub(r"^\w+: \S+\(\d+\) \[[^\]]*\] ", "", str(e)).strip()


def train_sentencepiece(texts: Iterable[str], model_path: Path, vocab_size: int, *,
                        character_coverage: float = 1.0, user_defined_symbols: Sequence[str] = ()) -> int:
    """Train a unigram model on ``texts`` (one sentence each) and write it to ``model_path``.

    Returns the model's actual vocabulary size (special tokens included). Training uses
    ``hard_vocab_limit=False``: on a small corpus (such as the demo corpus) whose vocabulary
    cannot fill ``vocab_size`` pieces, the model is smaller than requested instead of failing,
    so callers must use the returned size (or the loaded model's ``get_piece_size()``).
    ``vocab_size`` must still cover every character (at ``character_coverage``) plus the 4
    special tokens: :class:`SentencePieceError` (a ValueError) otherwise. Empty or whitespace-only texts are skipped.
    ``user_defined_symbols`` (e.g. target-language tags ``<lang:de>``) become single pieces with the
    ids right after the specials (4, 5, ...), never split and never produced by splitting other text.
    """
    model_path = Path(model_path)
    sentences = [t for t in texts if t.strip()]
    if not sentences:
        raise ValueError(f"{model_path}: no non-empty text to train a SentencePiece model on")
    for i, t in enumerate(sentences):
        if "\n" in t:
            raise ValueError(f"{model_path}: training text {i} contains a newline: {t!r}")
    buf = io.BytesIO()
    spm.set_random_generator_seed(SEED)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=buf,
            model_type="unigram",
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            hard_vocab_limit=False,
            bos_id=BOS_ID,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            num_threads=1,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            minloglevel=2,
            **({"user_defined_symbols": list(user_defined_symbols)} if user_defined_symbols else {}),
        )
    except RuntimeError as e:
        raise SentencePieceError(f"{model_path}: SentencePiece training failed (vocab_size={vocab_size}): {e}",
                                 _reason(e)) from None
    data = buf.getvalue()
    actual = spm.SentencePieceProcessor(model_proto=data).get_piece_size()
    atomic_write_bytes(model_path, data)
    return actual


def load_sentencepiece(model_path: Path) -> spm.SentencePieceProcessor:
    """Load a model written by :func:`train_sentencepiece`; checks the fairseq special ids."""
    model_path = Path(model_path)
    try:
        sp = spm.SentencePieceProcessor(model_file=str(model_path))
    except (OSError, RuntimeError) as e:
        raise InputError(f"{model_path}: cannot load SentencePiece model: {e}; the stage that trained it "
                         f"(prepare or prepare_multi) writes it again") from None
    ids = (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id())
    if ids != (BOS_ID, PAD_ID, EOS_ID, UNK_ID):
        raise ValueError(f"{model_path}: special ids (bos, pad, eos, unk) = {ids}, expected (0, 1, 2, 3)")
    return sp
