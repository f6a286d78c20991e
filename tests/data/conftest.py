"""Fixtures over tests/corpus_factory.py: tiny corpora in MuST-C v1 layout with synthetic audio.

Self-contained on purpose (no eSpeak, no lib.corpus): ``make_corpus(root, spec)`` writes
``<root>/<pair>/data/<split>/{wav,txt}`` exactly as MuST-C does, from a spec::

    {split: [talk, ...]}, talk = [segment, ...],
    segment = {"offset": s, "duration": s, "src": str, "tgt": str, "speaker": str}

Each talk's wav is long enough for its segments plus ``tail`` seconds (``length`` overrides).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from tests.corpus_factory import DE, EN, SR, default_spec, make_corpus, synth_audio, talk  # noqa: F401

@pytest.fixture
def corpus_builder() -> Callable[..., Path]:
    """The :func:`make_corpus` function (to build custom corpora inside a test)."""
    return make_corpus


@pytest.fixture
def spec_factory() -> Callable[[], dict]:
    """Returns a fresh copy of the default spec (3 splits, 5 talks, 17 segments)."""
    return default_spec


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """A valid en-de corpus built from :func:`default_spec`; returns its root."""
    return make_corpus(tmp_path / "mustc", default_spec())


@pytest.fixture
def talk_factory() -> Callable[..., list[dict[str, Any]]]:
    return talk


@pytest.fixture
def audio_factory() -> Callable[..., np.ndarray]:
    return synth_audio
