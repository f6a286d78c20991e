"""lib/report/corpus_stats.py: the encoder length N after the 4x subsampling, by fairseq's formula, and a
prepared split's statistics recomputed by hand from a small manifest."""
from __future__ import annotations

from pathlib import Path

import pytest

from lib.data.manifest import MANIFEST_COLUMNS
from lib.data.vocab import load_sentencepiece, train_sentencepiece
from lib.report.corpus_stats import corpus_stats, subsampled_length


def test_subsampled_length_is_the_conv_stacks_output_length() -> None:
    import torch

    from lib.model.s2t_transformer import subsampled_lengths

    # (n - 1) // 2 + 1 twice: 8 -> 4 -> 2, 9 -> 5 -> 3, 3000 -> 1500 -> 750
    assert [subsampled_length(n) for n in (1, 2, 3, 4, 5, 8, 9, 3000)] == [1, 1, 1, 1, 2, 2, 3, 750]
    assert subsampled_length(8, n_layers=1) == 4
    lengths = list(range(1, 300))
    assert [subsampled_length(n) for n in lengths] == subsampled_lengths(torch.tensor(lengths)).tolist()


def test_corpus_stats_of_a_hand_made_split(tmp_path: Path) -> None:
    texts = ["ein kleiner hund", "der hund schläft", "eine katze", "die katze schläft nicht", "ein hund"]
    train_sentencepiece(texts * 4, tmp_path / "spm_st.model", 40)
    frames = [100, 400, 801, 1600, 3000]
    rows = ["\t".join(MANIFEST_COLUMNS)] + [
        "\t".join([f"u{i}", f"train.fbank.npy:0:{n}", str(n), "a dog", text, "spk.1" if i % 2 else "spk.2"])
        for i, (n, text) in enumerate(zip(frames, texts))]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("\t".join(MANIFEST_COLUMNS) + "\n", encoding="utf-8")  # empty: left out
    stats, arrays = corpus_stats(tmp_path, ["train", "dev"])
    assert list(stats) == ["train"] and list(arrays) == ["train"]
    s = stats["train"]
    # 5901 frames of 10 ms = 59.01 s = 0.0164 h
    assert (s["segments"], s["hours"], s["speakers"]) == (5, 0.0164, 2)
    # N = 25, 100, 201, 400, 750; p95 (linear) = 400 + 0.8 * 350
    assert s["encoder_length"] == {"mean": 295.2, "max": 750, "min": 25, "p95": 680.0}
    assert arrays["train"]["seconds"].tolist() == pytest.approx([1.0, 4.0, 8.01, 16.0, 30.0])
    tokens = [len(ids) for ids in load_sentencepiece(tmp_path / "spm_st.model").encode(texts)]  # the targets' own
    assert arrays["train"]["target_tokens"].tolist() == tokens
    assert (s["target_tokens"]["max"], s["target_tokens"]["min"]) == (max(tokens), min(tokens))
    assert s["target_tokens"]["mean"] == round(sum(tokens) / 5, 2)


def test_a_damaged_vocabulary_is_named(tmp_path: Path) -> None:
    """spm_st.model cut short: an InputError naming it and prepare@<pair>, not SentencePiece's RuntimeError."""
    from lib.io import InputError

    folder = tmp_path / "en-de"
    train_sentencepiece(["ein kleiner hund", "der hund schläft", "eine katze"] * 4, folder / "spm_st.model", 30)
    model = folder / "spm_st.model"
    model.write_bytes(model.read_bytes()[:50])
    with pytest.raises(InputError, match=r"spm_st\.model: cannot load SentencePiece model .*prepare@en-de stage"):
        corpus_stats(folder, ["train"])
