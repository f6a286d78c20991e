"""The corpus reader interface: the layout picks the reader, layouts without one are refused by name,
and a new reader prepares a corpus with no edit to preparation."""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from lib.data import corpora
from lib.data.corpora import open_corpus
from lib.data.mustc import MustcV1Reader
from lib.data.prepare import prepare_pair
from lib.data.reader import CorpusError, CorpusReader, Segment
from lib.params import PrepareParams

CFG = dict(asr_vocab_size=40, st_vocab_size=45)


def test_mustc_layout_gets_the_mustc_reader(tiny_corpus: Path) -> None:
    reader = open_corpus(tiny_corpus, "en-de")
    assert isinstance(reader, MustcV1Reader) and reader.name == "mustc_v1"
    segments = reader.read_split("dev")
    assert segments and reader.listing_of(segments[0]) == tiny_corpus / "en-de/data/dev/txt/dev.yaml"
    assert reader.text_file("dev", "de") == tiny_corpus / "en-de/data/dev/txt/dev.de"


def test_the_pair_folder_given_as_root_names_its_parent(tiny_corpus: Path) -> None:
    with pytest.raises(CorpusError, match=rf"language pair's folder.*data.mustc_root to the folder above it, {tiny_corpus}"):
        open_corpus(tiny_corpus / "en-de", "en-de")


def test_a_packed_release_says_unpack(tmp_path: Path) -> None:
    (tmp_path / "MUSTC_v1.0_en-de.tar.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(CorpusError, match=r"MUSTC_v1.0_en-de.tar.gz but no en-de/ folder; unpack it first \(tar -xzf"):
        open_corpus(tmp_path, "en-de")


def test_a_release_one_level_down_names_the_right_root(tiny_corpus: Path, tmp_path: Path) -> None:
    root = tmp_path / "releases"
    root.mkdir()
    shutil.move(str(tiny_corpus), root / "MUSTC_v1.0")
    with pytest.raises(CorpusError, match=r"en-de/ is one level down, in MUSTC_v1.0/; set data.mustc_root to .*MUSTC_v1.0"):
        open_corpus(root, "en-de")


def test_covost_layout_is_refused_naming_the_readers(tmp_path: Path) -> None:
    (tmp_path / "clips").mkdir()
    (tmp_path / "covost_v2.en_de.tsv").write_text("path\tsentence\ttranslation\n")
    with pytest.raises(CorpusError, match=r"CoVoST 2 layout .*no reader reads it \(readers: mustc_v1"):
        open_corpus(tmp_path, "en-de")


def test_missing_root_and_bad_pair(tmp_path: Path) -> None:
    (tmp_path / "MUSTC_v1.0.tar.gz").write_bytes(b"")
    with pytest.raises(CorpusError, match=r"MUSTC_v1\.0\.tar\.gz: a file, not the corpus root folder"):
        open_corpus(tmp_path / "MUSTC_v1.0.tar.gz", "en-de")
    with pytest.raises(CorpusError, match=r"nowhere: corpus root folder does not exist \(data.mustc_root\)"):
        open_corpus(tmp_path / "nowhere", "en-de")
    with pytest.raises(CorpusError, match="must look like 'en-de'"):
        open_corpus(tmp_path, "ende")


def test_an_unknown_layout_gets_the_mustc_readers_own_error(tiny_corpus: Path) -> None:
    (tiny_corpus / "lib" / "data").mkdir(parents=True)  # a folder with data/ that is no pair: not listed
    with pytest.raises(CorpusError, match=r"language pair folder 'en-fr' not found .*pairs present: en-de$"):
        prepare_pair(tiny_corpus, "en-fr", tiny_corpus.parent / "out", PrepareParams(**CFG), progress=False)


# A toy format: one JSON file per split listing the segments, over the same talks. Defined here,
# registered by the test only: preparation is not edited for it.
@dataclass(frozen=True)
class JsonListReader(CorpusReader):
    name = "json_list"

    @classmethod
    def recognises(cls, root: Path, pair: str) -> bool:
        return (Path(root) / f"{pair}.json").is_file()

    def _listing(self) -> Path:
        return Path(self.root) / f"{self.pair}.json"

    def read_split(self, split: str) -> list[Segment]:
        rows = json.loads(self._listing().read_text(encoding="utf-8"))
        if split not in rows:
            raise CorpusError(f"{self._listing()}: no split {split!r}")
        return [Segment(**{**r, "wav": Path(self.root) / r["wav"]}) for r in rows[split]]

    def listing_of(self, segment: Segment) -> Path:
        return self._listing()

    def text_file(self, split: str, lang: str) -> Path:
        return self._listing()


def test_a_new_reader_prepares_the_same_features_with_no_edit_to_preparation(tiny_corpus: Path, tmp_path: Path,
                                                                             monkeypatch) -> None:
    cfg = PrepareParams(workers=1, **CFG)
    mustc = MustcV1Reader(tiny_corpus, "en-de")
    toy = tmp_path / "toy"
    toy.mkdir()
    rows = {}
    for split in cfg.splits:
        rows[split] = []
        for seg in mustc.read_split(split):
            wav = toy / "audio" / split / seg.wav.name
            wav.parent.mkdir(parents=True, exist_ok=True)
            if not wav.exists():
                shutil.copy(seg.wav, wav)
            rows[split].append({**asdict(seg), "wav": str(wav.relative_to(toy))})
    (toy / "en-de.json").write_text(json.dumps(rows), encoding="utf-8")
    monkeypatch.setattr(corpora, "READERS", (MustcV1Reader, JsonListReader))
    assert isinstance(open_corpus(toy, "en-de"), JsonListReader)

    a = prepare_pair(tiny_corpus, "en-de", tmp_path / "a", cfg, progress=False)
    b = prepare_pair(toy, "en-de", tmp_path / "b", cfg, progress=False)
    assert a == b
    for name in ("train.fbank.npy", "dev.fbank.npy", "tst-COMMON.tsv", "spm_st.model"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
