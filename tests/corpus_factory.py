"""Tiny corpora in MuST-C v1 layout with synthetic audio (tones + noise, via soundfile).

Shared by tests/data, tests/train and tests/analysis. Self-contained on purpose (no eSpeak, no lib.corpus): ``make_corpus(root, spec)`` writes
``<root>/<pair>/data/<split>/{wav,txt}`` exactly as MuST-C does, from a spec::

    {split: [talk, ...]}, talk = [segment, ...],
    segment = {"offset": s, "duration": s, "src": str, "tgt": str, "speaker": str}

Each talk's wav is long enough for its segments plus ``tail`` seconds (``length`` overrides).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

SR = 16000


def synth_audio(seconds: float, seed: int, sample_rate: int = SR, channels: int = 1) -> np.ndarray:
    """Tones plus noise, peak ~0.5, float32 (n,) or (n, channels)."""
    n = int(round(seconds * sample_rate))
    rng = np.random.default_rng(seed)
    t = np.arange(n) / sample_rate
    f0 = 150 + 50 * (seed % 7)
    x = 0.25 * np.sin(2 * np.pi * f0 * t) + 0.1 * np.sin(2 * np.pi * 3.1 * f0 * t + seed)
    x *= 0.5 + 0.5 * np.sin(2 * np.pi * 1.7 * t) ** 2  # syllable-like amplitude modulation
    x += 0.03 * rng.standard_normal(n)
    x = x.astype(np.float32)
    if channels > 1:
        x = np.stack([x] * channels, axis=1)
    return x


def _fmt_entry(seg: dict[str, Any], wav: str) -> str:
    return (f"- {{duration: {seg['duration']:.6f}, offset: {seg['offset']:.6f}, rW: {len(seg['src'].split())}, "
            f"uW: 0, speaker_id: {seg['speaker']}, wav: {wav}}}")


def make_corpus(root: Path, spec: dict[str, list[list[dict[str, Any]]]], pair: str = "en-de",
                tail: float = 0.3, first_talk: int = 1) -> Path:
    """Write a MuST-C-layout corpus for ``pair`` under ``root``; returns ``root``."""
    src_lang, _, tgt_lang = pair.partition("-")
    talk_no = first_talk
    for split, talks in spec.items():
        d = root / pair / "data" / split
        (d / "wav").mkdir(parents=True, exist_ok=True)
        (d / "txt").mkdir(parents=True, exist_ok=True)
        yaml_lines, src_lines, tgt_lines = [], [], []
        for talk in talks:
            wav = f"ted_{talk_no}.wav"
            length = max(s["offset"] + s["duration"] for s in talk) + tail
            sf.write(d / "wav" / wav, synth_audio(length, seed=talk_no), SR, subtype="PCM_16")
            for seg in talk:
                yaml_lines.append(_fmt_entry(seg, wav))
                src_lines.append(seg["src"])
                tgt_lines.append(seg["tgt"])
            talk_no += 1
        (d / "txt" / f"{split}.yaml").write_text("\n".join(yaml_lines) + "\n", encoding="utf-8")
        (d / "txt" / f"{split}.{src_lang}").write_text("\n".join(src_lines) + "\n", encoding="utf-8")
        (d / "txt" / f"{split}.{tgt_lang}").write_text("\n".join(tgt_lines) + "\n", encoding="utf-8")
    return root


EN = ["the cat sat on the mat", "a dog runs in the park", "we like green tea", "she reads a long book",
      "they walk to school", "it is a sunny day", "the bird sings loud", "you play the piano"]
DE = ["die katze sass auf der matte", "ein hund rennt im park", "wir moegen gruenen tee", "sie liest ein langes buch",
      "sie gehen zur schule", "es ist ein sonniger tag", "der vogel singt laut", "du spielst klavier"]


def talk(n_segments: int, seed: int, start: float = 0.2, speaker: str = "spk.1",
         durations: tuple[float, float] = (0.4, 1.0)) -> list[dict[str, Any]]:
    """``n_segments`` consecutive segments of ``durations`` (default 0.4-1.0 s) with 0.1 s gaps."""
    rng = np.random.default_rng(seed)
    segs, t = [], start
    for i in range(n_segments):
        dur = round(float(rng.uniform(*durations)), 2)
        k = (seed + i) % len(EN)
        segs.append({"offset": round(t, 2), "duration": dur, "src": EN[k], "tgt": DE[k], "speaker": speaker})
        t += dur + 0.1
    return segs


def default_spec() -> dict[str, list[list[dict[str, Any]]]]:
    return {
        "train": [talk(4, 1, speaker="spk.1"), talk(3, 2, speaker="spk.2"), talk(4, 3, speaker="spk.1")],
        "dev": [talk(3, 4, speaker="spk.3")],
        "tst-COMMON": [talk(3, 5, speaker="spk.4")],
    }
