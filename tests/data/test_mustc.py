"""MuST-C reader: a good corpus reads correctly; every kind of bad input gives a CorpusError that
names the offending file (and the line or yaml entry)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from lib.data.mustc import CorpusError, Segment, cut_segment, load_talk, probe_talk, read_split, segment_bounds

SR = 16000


def txt(root: Path, split: str = "train", pair: str = "en-de") -> Path:
    return root / pair / "data" / split / "txt"


def wavdir(root: Path, split: str = "train", pair: str = "en-de") -> Path:
    return root / pair / "data" / split / "wav"


# ---------------------------------------------------------------------------------------- good


def test_reads_good_corpus(tiny_corpus: Path, spec_factory) -> None:
    spec = spec_factory()
    segs = read_split(tiny_corpus, "en-de", "train")
    flat = [s for t in spec["train"] for s in t]
    assert len(segs) == len(flat) == 11
    assert [s.id for s in segs] == [f"ted_1_{i}" for i in range(4)] + [f"ted_2_{i}" for i in range(3)] + \
        [f"ted_3_{i}" for i in range(4)]
    for seg, ref in zip(segs, flat):
        assert isinstance(seg, Segment)
        assert seg.offset == pytest.approx(ref["offset"]) and seg.duration == pytest.approx(ref["duration"])
        assert seg.src_text == ref["src"] and seg.tgt_text == ref["tgt"] and seg.speaker == ref["speaker"]
        assert seg.wav.is_file() and seg.wav.parent == wavdir(tiny_corpus)
    dev = read_split(tiny_corpus, "en-de", "dev")
    assert [s.id for s in dev] == ["ted_4_0", "ted_4_1", "ted_4_2"]
    assert len(read_split(tiny_corpus, "en-de", "tst-COMMON")) == 3


def test_text_keeps_spaces_and_only_strips_newline(tmp_path: Path, corpus_builder, talk_factory) -> None:
    t = talk_factory(3, 0)
    t[0]["src"] = "  two  inner  spaces "
    t[1]["tgt"] = "unicode: grüße \u2028 line-separator inside"  # must not split the line
    t[2]["src"] = ""  # empty line stays an (empty) segment
    root = corpus_builder(tmp_path / "m", {"train": [t]})
    segs = read_split(root, "en-de", "train")
    assert segs[0].src_text == "  two  inner  spaces "
    assert segs[1].tgt_text == "unicode: grüße \u2028 line-separator inside"
    assert segs[2].src_text == ""


def test_ids_count_per_talk_even_when_interleaved(tmp_path: Path, corpus_builder, talk_factory) -> None:
    root = corpus_builder(tmp_path / "m", {"train": [talk_factory(2, 0), talk_factory(2, 1)]})
    y = txt(root) / "train.yaml"
    lines = y.read_text().splitlines()
    # interleave talk 1 and talk 2 (and the texts alike)
    order = [0, 2, 1, 3]
    y.write_text("\n".join(lines[i] for i in order) + "\n")
    for lang in ("en", "de"):
        p = txt(root) / f"train.{lang}"
        ls = p.read_text().splitlines()
        p.write_text("\n".join(ls[i] for i in order) + "\n")
    assert [s.id for s in read_split(root, "en-de", "train")] == ["ted_1_0", "ted_2_0", "ted_1_1", "ted_2_1"]


def test_load_talk_and_cut(tiny_corpus: Path) -> None:
    segs = read_split(tiny_corpus, "en-de", "train")
    talk = load_talk(segs[0].wav)
    ref, sr = sf.read(segs[0].wav, dtype="float32")
    assert sr == SR and talk.dtype == np.float32 and talk.ndim == 1
    np.testing.assert_array_equal(talk, ref)
    assert np.abs(talk).max() <= 1.0
    assert probe_talk(segs[0].wav) == len(talk)
    cut = cut_segment(talk, segs[1], 1)
    start = round(segs[1].offset * SR)
    end = round((segs[1].offset + segs[1].duration) * SR)
    np.testing.assert_array_equal(cut, talk[start:end])


def test_cut_clips_small_overrun_only() -> None:
    talk = np.zeros(SR, dtype=np.float32)  # 1 s
    wav = Path("/c/en-de/data/train/wav/ted_9.wav")
    ok = Segment("ted_9_0", wav, 0.5, 0.505, "s", "a", "b")  # 5 ms past the end: clipped
    assert len(cut_segment(talk, ok, 0)) == SR - 8000
    edge = Segment("ted_9_1", wav, 0.5, 0.51, "s", "a", "b")  # exactly 10 ms: still clipped
    assert segment_bounds(edge, SR, 1) == (8000, SR)
    bad = Segment("ted_9_2", wav, 0.5, 0.52, "s", "a", "b")  # 20 ms past the end
    with pytest.raises(CorpusError) as e:
        cut_segment(talk, bad, 7)
    msg = str(e.value)
    assert "ted_9.wav" in msg and "train.yaml" in msg and "entry 7" in msg


# ---------------------------------------------------------------------------------------- bad


def _err(fn, *args) -> str:
    with pytest.raises(CorpusError) as e:
        fn(*args)
    return str(e.value)


def test_missing_wav(tiny_corpus: Path) -> None:
    (wavdir(tiny_corpus) / "ted_2.wav").unlink()
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert "train.yaml" in msg and "entry 4" in msg and "ted_2.wav" in msg


def test_unreadable_wav(tiny_corpus: Path) -> None:
    p = wavdir(tiny_corpus) / "ted_1.wav"
    p.write_bytes(b"this is not a RIFF file at all" * 10)
    read_split(tiny_corpus, "en-de", "train")  # existence only: still reads
    assert "ted_1.wav" in _err(load_talk, p)
    assert "ted_1.wav" in _err(probe_talk, p)


def test_8khz_wav_is_refused(tmp_path: Path, audio_factory) -> None:
    p = tmp_path / "ted_8k.wav"
    sf.write(p, audio_factory(1.0, 0, sample_rate=8000), 8000, subtype="PCM_16")
    for fn in (load_talk, probe_talk):
        msg = _err(fn, p)
        assert "ted_8k.wav" in msg and "8000" in msg


def test_stereo_wav_is_refused(tmp_path: Path, audio_factory) -> None:
    p = tmp_path / "ted_st.wav"
    sf.write(p, audio_factory(0.5, 0, channels=2), SR, subtype="PCM_16")
    msg = _err(load_talk, p)
    assert "ted_st.wav" in msg and "2 channels" in msg


def test_segment_past_end_of_wav(tmp_path: Path, corpus_builder, talk_factory) -> None:
    t = talk_factory(2, 0)
    root = corpus_builder(tmp_path / "m", {"train": [t]}, tail=0.0)
    segs = read_split(root, "en-de", "train")
    y = txt(root) / "train.yaml"
    y.write_text(y.read_text().replace(f"duration: {t[1]['duration']:.6f}", "duration: 9.000000"))
    segs = read_split(root, "en-de", "train")
    talk = load_talk(segs[1].wav)
    msg = _err(cut_segment, talk, segs[1], 1)
    assert "ted_1.wav" in msg and "train.yaml" in msg and "entry 1" in msg


def test_a_truncated_wav_is_named_as_truncated(tiny_corpus: Path) -> None:
    """A copy cut short reads as a shorter talk (soundfile counts the samples present): the error says that
    the header declares more, so the wav is checked instead of the yaml."""
    p = wavdir(tiny_corpus) / "ted_1.wav"
    full = sf.info(str(p)).duration
    p.write_bytes(p.read_bytes()[: 44 + 2 * int(0.3 * SR)])  # header + 0.3 s of PCM16
    segs = read_split(tiny_corpus, "en-de", "train")
    n = probe_talk(p)
    msg = _err(segment_bounds, segs[1], n, 1)
    assert msg.count("\n") == 0 and "train.yaml: entry 1" in msg and "ted_1.wav" in msg
    assert f"its header declares {full:.3f} s: a truncated copy?" in msg


def test_a_segment_past_the_end_of_a_whole_wav_is_not_called_truncated(tmp_path: Path, corpus_builder,
                                                                         talk_factory) -> None:
    t = talk_factory(2, 0)
    root = corpus_builder(tmp_path / "m", {"train": [t]}, tail=0.0)
    y = txt(root) / "train.yaml"
    y.write_text(y.read_text().replace(f"duration: {t[1]['duration']:.6f}", "duration: 9.000000"))
    segs = read_split(root, "en-de", "train")
    msg = _err(segment_bounds, segs[1], probe_talk(segs[1].wav), 1)
    assert "runs past the end" in msg and "truncated" not in msg


def test_an_unreadable_wav_is_named_once(tiny_corpus: Path) -> None:
    p = wavdir(tiny_corpus) / "ted_1.wav"
    p.write_text("this is not audio\n" * 10)
    for fn in (load_talk, probe_talk):
        msg = _err(fn, p)
        assert msg.count(str(p)) == 1 and msg.startswith(f"{p}: cannot read audio file: "), msg


@pytest.mark.parametrize("lang", ["en", "de"])
def test_line_count_mismatch(tiny_corpus: Path, lang: str) -> None:
    p = txt(tiny_corpus) / f"train.{lang}"
    p.write_text(p.read_text() + "one line too many\n")
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert f"train.{lang}" in msg and "train.yaml" in msg and "12" in msg and "11" in msg


def test_missing_final_newline_is_fine(tiny_corpus: Path) -> None:
    p = txt(tiny_corpus) / "train.de"
    p.write_text(p.read_text().rstrip("\n"))
    assert len(read_split(tiny_corpus, "en-de", "train")) == 11


def test_non_utf8_text(tiny_corpus: Path) -> None:
    p = txt(tiny_corpus) / "train.de"
    lines = p.read_bytes().split(b"\n")
    lines[2] = b"gr\xfc\xdfe in latin-1"
    p.write_bytes(b"\n".join(lines))
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert "train.de" in msg and re.search(r"\bline 3\b", msg)


def test_missing_language_folder_lists_pairs(tiny_corpus: Path) -> None:
    msg = _err(read_split, tiny_corpus, "en-es", "train")
    assert "en-es" in msg and "en-de" in msg


def test_missing_split_folder(tiny_corpus: Path) -> None:
    msg = _err(read_split, tiny_corpus, "en-de", "tst-HE")
    assert "tst-HE" in msg and "train" in msg


def test_missing_yaml(tiny_corpus: Path) -> None:
    (txt(tiny_corpus) / "train.yaml").unlink()
    assert "train.yaml" in _err(read_split, tiny_corpus, "en-de", "train")


def test_missing_root(tmp_path: Path) -> None:
    assert "nowhere" in _err(read_split, tmp_path / "nowhere", "en-de", "train")


def _edit_yaml(root: Path, entry: int, old: str, new: str) -> None:
    y = txt(root) / "train.yaml"
    lines = y.read_text().split("\n")
    assert old in lines[entry]
    lines[entry] = lines[entry].replace(old, new)
    y.write_text("\n".join(lines))


@pytest.mark.parametrize("old,new,expect", [
    ("speaker_id:", "speaker:", "speaker_id"),
    ("offset:", "start:", "offset"),
    (", wav: ted_1.wav", "", "wav"),
    ("duration: ", "duration: abc", "duration"),
])
def test_bad_yaml_entry(tiny_corpus: Path, old: str, new: str, expect: str) -> None:
    _edit_yaml(tiny_corpus, 2, old, new)
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert "train.yaml" in msg and "entry 2" in msg and expect in msg


def test_negative_offset_and_zero_duration(tiny_corpus: Path, spec_factory) -> None:
    seg = spec_factory()["train"][0][1]
    _edit_yaml(tiny_corpus, 1, f"offset: {seg['offset']:.6f}", "offset: -0.500000")
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert "train.yaml" in msg and "entry 1" in msg and "offset" in msg
    _edit_yaml(tiny_corpus, 1, "offset: -0.500000", "offset: 1.0")
    _edit_yaml(tiny_corpus, 1, f"duration: {seg['duration']:.6f}", "duration: 0.0")
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert "train.yaml" in msg and "entry 1" in msg and "duration" in msg


def test_yaml_not_a_list(tiny_corpus: Path) -> None:
    (txt(tiny_corpus) / "train.yaml").write_text("wav: ted_1.wav\n")
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert "train.yaml" in msg and "list" in msg


def test_invalid_yaml_syntax(tiny_corpus: Path) -> None:
    (txt(tiny_corpus) / "train.yaml").write_text("- {duration: 1.0, offset: [\n")
    assert "train.yaml" in _err(read_split, tiny_corpus, "en-de", "train")


def test_invalid_yaml_is_one_line_naming_the_line(tiny_corpus: Path) -> None:
    y = txt(tiny_corpus) / "train.yaml"
    lines = y.read_text().split("\n")
    lines[3] = lines[3].replace("{", "{{", 1)  # a broken flow mapping in entry 3 (line 4)
    y.write_text("\n".join(lines))
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert "\n" not in msg and re.search(r"train\.yaml:\d+: invalid YAML: line \d+, column \d+: ", msg), msg
    assert "line 4, column" in msg and "<byte string>" not in msg, msg


def test_non_utf8_yaml_is_one_line_naming_the_line(tiny_corpus: Path) -> None:
    y = txt(tiny_corpus) / "train.yaml"
    lines = y.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"speaker_id: ", b"speaker_id: J\xfcrgen", 1)  # Latin-1, line 3
    y.write_bytes(b"\n".join(lines))
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert "\n" not in msg and "train.yaml:3: invalid YAML: line 3: " in msg and "#xfc" in msg, msg


def test_a_byte_order_mark_is_not_part_of_the_first_segment(tiny_corpus: Path, spec_factory) -> None:
    first = spec_factory()["train"][0][0]
    for lang in ("en", "de"):
        p = txt(tiny_corpus) / f"train.{lang}"
        p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    seg = read_split(tiny_corpus, "en-de", "train")[0]
    assert (seg.src_text, seg.tgt_text) == (first["src"], first["tgt"])


@pytest.mark.parametrize("old_key, new, expect", [
    ("offset", "offset: .inf", "entry 1: offset must be a finite number >= 0, got inf"),
    ("offset", "offset: .nan", "entry 1: offset must be a finite number >= 0, got nan"),
    ("duration", "duration: .inf", "entry 1: duration must be a finite number > 0, got inf"),
    ("duration", "duration: true", "entry 1: duration must be int or float, got bool True"),
    ("offset", "offset: false", "entry 1: offset must be int or float, got bool False"),
])
def test_non_finite_or_boolean_times_are_refused(tiny_corpus: Path, spec_factory, old_key: str, new: str,
                                                 expect: str) -> None:
    seg = spec_factory()["train"][0][1]
    _edit_yaml(tiny_corpus, 1, f"{old_key}: {seg[old_key]:.6f}", new)
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert "train.yaml" in msg and expect in msg, msg


@pytest.mark.parametrize("wav", ["../wav/ted_1.wav", "wav/ted_1.wav"])
def test_a_wav_with_a_folder_part_is_refused(tiny_corpus: Path, wav: str) -> None:
    (wavdir(tiny_corpus) / "wav").mkdir()
    (wavdir(tiny_corpus) / "wav" / "ted_1.wav").write_bytes((wavdir(tiny_corpus) / "ted_1.wav").read_bytes())
    _edit_yaml(tiny_corpus, 2, "wav: ted_1.wav", f"wav: {wav}")
    msg = _err(read_split, tiny_corpus, "en-de", "train")
    assert f"entry 2: wav must be a plain file name, got '{wav}'" in msg


def test_check_layout_names_a_missing_wav_folder_or_text_file(tiny_corpus: Path) -> None:
    import shutil

    from lib.data.mustc import MustcV1Reader

    reader = MustcV1Reader(tiny_corpus, "en-de")
    reader.check_layout(["train", "dev", "tst-COMMON"])  # the whole tiny corpus: nothing missing
    shutil.rmtree(wavdir(tiny_corpus, "dev"))
    msg = _err(reader.check_layout, ["train", "dev"])
    assert msg == f"{wavdir(tiny_corpus, 'dev')}: the talks' folder of split 'dev' is missing"
    (txt(tiny_corpus) / "train.de").unlink()
    msg = _err(reader.check_layout, ["train"])
    assert msg == f"{txt(tiny_corpus) / 'train.de'}: missing; {txt(tiny_corpus)} holds train.en, train.yaml"
