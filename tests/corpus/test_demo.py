"""Demo corpus writer: MuST-C layout, exact offsets, unique sentences, determinism."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

from lib.corpus.demo import SAMPLE_RATE, plan_pair, write_pair

SPLITS = {"train": 10, "dev": 3, "tst-COMMON": 4}
KW = dict(splits=SPLITS, seed=3, segments_per_talk=4, n_speakers=4, pause_seconds=[0.2, 0.5])


def test_plan_is_unique_deterministic_and_talks_do_not_span_splits() -> None:
    a = plan_pair("en-it", **KW)
    assert a == plan_pair("en-it", **KW)
    assert a != plan_pair("en-it", **{**KW, "seed": 4})
    english = [s["en"] for p in a for s in p.sentences]
    assert len(english) == sum(SPLITS.values()) == len(set(english))
    assert [p.talk_number for p in a] == list(range(1, len(a) + 1))
    for split, n in SPLITS.items():
        assert sum(len(p.sentences) for p in a if p.split == split) == n
    assert all(len(p.pauses) == len(p.sentences) + 1 for p in a)


def test_write_pair_layout_offsets_and_workers_identical(tmp_path: Path) -> None:
    write_pair(tmp_path / "w1", "en-de", noise_level=0.001, workers=1, progress=False, **KW)
    write_pair(tmp_path / "w2", "en-de", noise_level=0.001, workers=2, progress=False, **KW)
    root = tmp_path / "w1" / "en-de" / "data"
    for split, n in SPLITS.items():
        txt = root / split / "txt"
        entries = yaml.safe_load((txt / f"{split}.yaml").read_text())
        en = (txt / f"{split}.en").read_text(encoding="utf-8").splitlines()
        de = (txt / f"{split}.de").read_text(encoding="utf-8").splitlines()
        assert len(entries) == len(en) == len(de) == n
        first = entries[0]
        wave, sr = sf.read(root / split / "wav" / first["wav"], dtype="int16")
        assert sr == SAMPLE_RATE and wave.ndim == 1
        start = round(first["offset"] * sr)
        end = round((first["offset"] + first["duration"]) * sr)
        assert end <= len(wave)
        segment = wave[start:end].astype(np.float32)
        # the cut holds speech (well above the noise floor), the pause before it does not
        assert np.abs(segment).max() > 3000
        assert np.abs(wave[:int(0.15 * sr)]).max() < 300
        assert first["rW"] == len(en[0].split()) and first["speaker_id"].startswith("spk.")
    files = sorted(p.relative_to(tmp_path / "w1") for p in (tmp_path / "w1").rglob("*") if p.is_file())
    for rel in files:
        assert (tmp_path / "w1" / rel).read_bytes() == (tmp_path / "w2" / rel).read_bytes(), rel


def test_unknown_target_language(tmp_path: Path) -> None:
    import pytest
    with pytest.raises(ValueError, match="en-fr"):
        write_pair(tmp_path, "en-fr", noise_level=0.0, progress=False, **KW)
    assert not (tmp_path / "en-fr").exists()
