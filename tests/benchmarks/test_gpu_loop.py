"""benchmarks/gpu_loop.py, the real training loop's benchmark, checked on the CPU at tiny shapes
(``--cpu-smoke``): its synthetic corpus is a prepared folder the loop reads like any other, every mode
trains, and the background collation changes no number."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import gpu_loop  # noqa: E402
from lib.data.dataset import SpeechDataset  # noqa: E402


def test_the_synthetic_corpus_is_a_prepared_folder_with_mustc_like_lengths(tmp_path: Path) -> None:
    sizes = gpu_loop.synthetic_prepared(tmp_path, 400, 10, 300)
    ds = SpeechDataset(tmp_path, "train", "st")
    assert len(ds) == sizes["train"]["utterances"] == 400 and ds.vocab_size == sizes["vocab"] > 100
    frames = ds.n_frames.tolist()
    assert sum(frames) == sizes["train"]["frames"] and 450 <= statistics.median(frames) <= 650
    assert min(frames) >= 50 and max(frames) <= 3000 and max(frames) > 1500
    assert tuple(ds.features(0).shape) == (frames[0], 80)
    # about one word per 20 frames
    words = [len(r["tgt_text"].split()) for r in ds.rows]
    assert all(w == min(200, max(3, n // 20)) for w, n in zip(words, frames))


def test_cpu_smoke_trains_every_mode_and_prefetch_changes_no_number(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    assert gpu_loop.main(["--cpu-smoke", "--updates", "2", "--warmup", "1", "--data", str(tmp_path / "d")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    loops = {d["mode"]: d for d in lines if d["figure"] == "loop"}
    assert list(loops) == list(gpu_loop.MODES)
    assert loops["accumulated_serial"]["ratio"] == 1.0
    assert all(d["updates_timed"] == 2 and d["ms_per_update"] > 0 for d in loops.values())
    # the same batches, masks and order with and without the background collation
    for key in ("train_loss", "dev_loss"):
        assert loops["accumulated"][key] == loops["accumulated_serial"][key] == loops["auto"][key] \
            == loops["auto_thread"][key]
    # folding trains the same update up to the order of sums (it is not bit-identical)
    assert loops["folded"]["train_loss"] == pytest.approx(loops["accumulated"]["train_loss"], rel=0.05)
    assert (tmp_path / "d" / "train.tsv").is_file()  # --data keeps the corpus


def test_sync_figure_counts_the_synchronising_calls_of_each_update(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """``loop_syncs`` (CUDA only) checked on the CPU: with the sync debug mode a no-op and one sync warning
    per update raised where the loop reads the loss parts, it counts one per update and names that line."""
    import warnings
    from argparse import Namespace

    import torch

    import lib.train.loop as loop
    from lib.params import TrainConfig

    read_parts = loop._read_parts

    def reading(*args, **kwargs):
        warnings.warn("called a synchronizing CUDA operation", UserWarning)  # the site named below
        return read_parts(*args, **kwargs)

    modes = []
    monkeypatch.setattr(loop, "_read_parts", reading)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    data = tmp_path / "d"
    gpu_loop.synthetic_prepared(data, 120, 8, 60, scale=0.1)
    cfg = TrainConfig(max_frames=600, update_freq=2, max_frames_train=300, warmup_updates=10, max_updates=6,
                      eval_every=6, save_every=6, average_last=1)
    gpu_loop.sync_figure(Namespace(warmup=1), torch.device("cpu"), "tiny", cfg, "none", data, tmp_path / "runs")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert modes == ["warn", "default"]
    assert [d["figure"] for d in lines] == ["loop_syncs"]
    syncs = lines[0]
    # 6 updates, 5 intervals between their starts, the first 1 dropped as warm-up
    assert syncs["per_update"] == [1, 1, 1, 1] and syncs["most_per_update"] == 1
    assert list(syncs["sites"]) == [f"{Path(__file__).name}:{reading.__code__.co_firstlineno + 1}"]


def test_oom_check_says_it_needs_cuda_on_a_cpu(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--oom-check`` caps the process's CUDA memory, which a CPU has not: the figure is a skip line, and
    the other figures still come."""
    assert gpu_loop.main(["--cpu-smoke", "--oom-check", "--updates", "1", "--warmup", "1",
                          "--data", str(tmp_path / "d")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    oom = [d for d in lines if d["figure"] == "oom_recovery"]
    assert oom == [{"figure": "oom_recovery", "skipped": "needs CUDA (a capped memory fraction)"}]
    assert [d["mode"] for d in lines if d["figure"] == "loop"] == list(gpu_loop.MODES)
