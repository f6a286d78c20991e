"""Fixtures of the training tests: one tiny prepared en-de pair (synthetic MuST-C corpus).

The corpus is tests/corpus_factory.py's default spec (tones + noise via soundfile, MuST-C v1 layout). 11 train utterances of 43-95
frames, 3 dev, 3 tst-COMMON; SentencePiece vocabularies of 40 pieces (ASR and ST).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import _driver` from the tests

PAIR = "en-de"


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared en-de folder (shared by all tests/train modules; treat it as read-only)."""
    # imported here, not at the top: the tests that do not use this fixture (the CUDA twins that
    # scripts/gpu_check.sh runs among them) then need no soundfile
    from lib.data.prepare import prepare_pair
    from lib.params import PrepareParams
    from tests.corpus_factory import default_spec, make_corpus

    root = tmp_path_factory.mktemp("train_data")
    make_corpus(root / "mustc", default_spec(), pair=PAIR)
    out = root / "prepared" / PAIR
    prepare_pair(root / "mustc", PAIR, out, PrepareParams(workers=1, asr_vocab_size=40, st_vocab_size=40),
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
