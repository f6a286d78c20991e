"""lib/train/multi.py's figures: the head-sharing heatmaps, and the figure of a system without head selection
(its plots folder is a DVC plots output, which must exist and hold images only)."""
from __future__ import annotations

from pathlib import Path

from lib.train.multi import head_sharing, plot_head_sharing, plot_no_selection

PNG = b"\x89PNG\r\n\x1a\n"


def test_head_sharing_counts_the_heads_two_tasks_share_per_layer() -> None:
    # two tasks, two layers: task 0 selects heads {0, 1} then {2, 3}; task 1 {1, 2} then {2, 3}
    selected = [[[0, 1], [2, 3]], [[1, 2], [2, 3]]]
    assert head_sharing(selected) == [[4, 3], [3, 4]]


def test_a_system_without_selection_gets_one_image_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "baseline" / "seed1"
    path = plot_no_selection(out, "baseline, seed 1: selects no heads")
    assert path == out / "head_sharing_none.png"
    assert [f.name for f in out.iterdir()] == ["head_sharing_none.png"]  # no temporary file left
    assert path.read_bytes().startswith(PNG)


def test_the_heatmaps_are_one_image_per_side(tmp_path: Path) -> None:
    selections = {side: {"selected": [[[0, 1]], [[1, 2]]], "layers": [0]} for side in ("encoder", "decoder")}
    written = plot_head_sharing(selections, ["en-de", "en-es"], n_heads=2, candidates=4, out_dir=tmp_path,
                                title="group, seed 1")
    assert sorted(p.name for p in written) == ["head_sharing_decoder.png", "head_sharing_encoder.png"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["head_sharing_decoder.png", "head_sharing_encoder.png"]
    assert all(p.read_bytes().startswith(PNG) for p in written)
