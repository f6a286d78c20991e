"""Fixtures of the training tests: one tiny prepared en-de pair (synthetic MuST-C corpus).

The corpus writer is a trimmed copy of tests/data/conftest.py (tones + noise via soundfile, MuST-C
v1 layout), kept here so that the two suites stay independent. 11 train utterances of 43-95
frames, 3 dev, 3 tst-COMMON; SentencePiece vocabularies of 40 pieces (ASR and ST).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import _driver` from the tests

from lib.data.prepare import PrepareConfig, prepare_pair  # noqa: E402

SR = 16000
PAIR = "en-de"
EN = ["the cat sat on the mat", "a dog runs in the park", "we like green tea", "she reads a long book",
      "they walk to school", "it is a sunny day", "the bird sings loud", "you play the piano"]
DE = ["die katze sass auf der matte", "ein hund rennt im park", "wir moegen gruenen tee", "sie liest ein langes buch",
      "sie gehen zur schule", "es ist ein sonniger tag", "der vogel singt laut", "du spielst klavier"]


def _synth_audio(seconds: float, seed: int) -> np.ndarray:
    n = int(round(seconds * SR))
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SR
    f0 = 150 + 50 * (seed % 7)
    x = 0.25 * np.sin(2 * np.pi * f0 * t) + 0.1 * np.sin(2 * np.pi * 3.1 * f0 * t + seed)
    x *= 0.5 + 0.5 * np.sin(2 * np.pi * 1.7 * t) ** 2
    x += 0.03 * rng.standard_normal(n)
    return x.astype(np.float32)


def _talk(n_segments: int, seed: int, speaker: str) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    segs, t = [], 0.2
    for i in range(n_segments):
        dur = round(float(rng.uniform(0.4, 1.0)), 2)
        k = (seed + i) % len(EN)
        segs.append({"offset": round(t, 2), "duration": dur, "src": EN[k], "tgt": DE[k], "speaker": speaker})
        t += dur + 0.1
    return segs


def make_corpus(root: Path) -> Path:
    spec = {
        "train": [_talk(4, 1, "spk.1"), _talk(3, 2, "spk.2"), _talk(4, 3, "spk.1")],
        "dev": [_talk(3, 4, "spk.3")],
        "tst-COMMON": [_talk(3, 5, "spk.4")],
    }
    talk_no = 1
    for split, talks in spec.items():
        d = root / PAIR / "data" / split
        (d / "wav").mkdir(parents=True, exist_ok=True)
        (d / "txt").mkdir(parents=True, exist_ok=True)
        yaml_lines, src_lines, tgt_lines = [], [], []
        for talk in talks:
            wav = f"ted_{talk_no}.wav"
            length = max(s["offset"] + s["duration"] for s in talk) + 0.3
            sf.write(d / "wav" / wav, _synth_audio(length, seed=talk_no), SR, subtype="PCM_16")
            for seg in talk:
                yaml_lines.append(f"- {{duration: {seg['duration']:.6f}, offset: {seg['offset']:.6f}, "
                                  f"rW: {len(seg['src'].split())}, uW: 0, speaker_id: {seg['speaker']}, wav: {wav}}}")
                src_lines.append(seg["src"])
                tgt_lines.append(seg["tgt"])
            talk_no += 1
        (d / "txt" / f"{split}.yaml").write_text("\n".join(yaml_lines) + "\n", encoding="utf-8")
        (d / "txt" / f"{split}.en").write_text("\n".join(src_lines) + "\n", encoding="utf-8")
        (d / "txt" / f"{split}.de").write_text("\n".join(tgt_lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared en-de folder (shared by all tests/train modules; treat it as read-only)."""
    root = tmp_path_factory.mktemp("train_data")
    make_corpus(root / "mustc")
    out = root / "prepared" / PAIR
    prepare_pair(root / "mustc", PAIR, out, PrepareConfig(workers=1, asr_vocab_size=40, st_vocab_size=40),
                 progress=False)
    return out


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread, like the subprocess driver: bit-exact comparisons across processes
    need the same thread count, and the suite stays within its CPU budget on 2 cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)
