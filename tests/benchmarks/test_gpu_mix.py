"""benchmarks/gpu.py's MuST-C-like length mix (the ``update_mix`` figure): the updates are built as the
training loop builds them, and grouping by length pads a folded update less than fairseq's shuffle."""
from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks/gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lengths_have_mustc_s_shape(gpu_bench) -> None:
    lengths = gpu_bench.mustc_like_lengths(5000, seed=3)
    assert min(lengths) >= 50 and max(lengths) <= 3000
    assert 500 <= statistics.median(lengths) <= 600
    assert sum(x > 1500 for x in lengths) > 50  # a long tail


def test_updates_are_the_loops_groups_and_length_grouping_pads_less(gpu_bench) -> None:
    k, max_frames = 8, 40000
    by_length, pad_length = gpu_bench.mustc_like_updates(k, max_frames, vocab=50, grouping="length", n_utts=3000)
    shuffled, pad_shuffled = gpu_bench.mustc_like_updates(k, max_frames, vocab=50, grouping="shuffled", n_utts=3000)
    for updates in (by_length, shuffled):
        assert len(updates) == 2 and all(len(u) == k for u in updates)
        for batch in (b for u in updates for b in u):
            lens = batch.feat_lengths.tolist()
            assert len(lens) * max(lens) <= max_frames or len(lens) == 1
            assert batch.feats.shape[1] == max(lens) and batch.target.shape[0] == len(lens)
    assert 1.0 <= pad_length < 1.3 and pad_shuffled > 2.0  # 1.07-1.22 against 2.5-3.2 on 6000 utterances, seeds 3-5
