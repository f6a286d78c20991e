"""scripts/compare_repro_runs.py: two runs' timings and per-pair quality side by side."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import compare_repro_runs  # noqa: E402


def _run(root: Path, total: float, groups: dict, summary: dict) -> Path:
    (root / "reports").mkdir(parents=True)
    (root / "metrics").mkdir()
    (root / "reports/repro_timing.json").write_text(json.dumps(
        {"command": "dvc repro -f", "total_seconds": total, "by_stage_group": groups}))
    (root / "metrics/summary.json").write_text(json.dumps(summary))
    return root


def _summary(base: float, half: float, local: float) -> dict:
    return {"en-de/baseline/bleu": base, "en-de/baseline/bleu_ci95": half, "en-de/asr_wer": 1.5,
            "en-de/local/bleu": local, "en-de/local/bleu_ci95": half, "en-de/local_minus_baseline/bleu": local - base}


def test_ratios_and_the_interval_criterion(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ref = _run(tmp_path / "a", 3600.0, {"train_asr_shared": 1200.0, "report": 0.0}, _summary(50.0, 3.0, 49.0))
    cand = _run(tmp_path / "b", 2400.0, {"train_asr_shared": 600.0, "report": 1.0}, _summary(52.0, 2.0, 45.0))
    assert compare_repro_runs.main([str(ref), str(cand), "--md", str(tmp_path / "out.md")]) == 0
    out = capsys.readouterr().out
    assert "| train_asr_shared | 20.0 | 10.0 | 0.50 |" in out
    assert "| report | 0.0 | 0.0 | – |" in out
    assert "| **total** | **60.0** | **40.0** | **0.67** |" in out
    assert "| en-de | baseline BLEU | 50.00 ± 3.00 | 52.00 ± 2.00 | +2.00 | yes |" in out
    assert "| en-de | local BLEU | 49.00 ± 3.00 | 45.00 ± 2.00 | -4.00 | **no** |" in out  # 4 > max(3, 2)
    assert "| en-de | ASR WER | 1.50 | 1.50 | +0.00 |" in out
    assert out.rstrip().endswith("every BLEU mean within the interval: no")
    assert (tmp_path / "out.md").read_text().strip() == out.strip()


def test_a_run_without_its_files_is_named(tmp_path: Path) -> None:
    ref = _run(tmp_path / "a", 1.0, {}, _summary(1, 1, 1))
    with pytest.raises(SystemExit, match=r"b/reports/repro_timing.json: missing"):
        compare_repro_runs.main([str(ref), str(tmp_path / "b")])


def test_a_kept_run_folder_with_the_two_files_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ref = _run(tmp_path / "a", 60.0, {"x": 60.0}, _summary(50.0, 3.0, 49.0))
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "repro_timing.json").write_text((ref / "reports/repro_timing.json").read_text())
    (kept / "summary.json").write_text((ref / "metrics/summary.json").read_text())
    assert compare_repro_runs.main([str(kept), str(ref)]) == 0
    assert "| **total** | **1.0** | **1.0** | **1.00** |" in capsys.readouterr().out
    rerun = tmp_path / "repro_timing_rerun.json"
    rerun.write_text(json.dumps({"command": "dvc repro -f", "total_seconds": 30.0, "by_stage_group": {"x": 30.0}}))
    assert compare_repro_runs.main([str(kept), str(ref), "--candidate-timing", str(rerun)]) == 0
    assert "| **total** | **1.0** | **0.5** | **0.50** |" in capsys.readouterr().out
    assert compare_repro_runs.main([str(kept), str(ref), "--reference-timing", str(rerun)]) == 0
    assert "| **total** | **0.5** | **1.0** | **2.00** |" in capsys.readouterr().out


def _seed_metrics(root: Path, system: str, pair: str, bleus: list[float]) -> None:
    folder = root / "metrics" / system / pair
    folder.mkdir(parents=True)
    for seed, bleu in enumerate(bleus, start=1):
        (folder / f"seed{seed}.json").write_text(json.dumps({"bleu": bleu, "chrf": 2 * bleu}))


def test_seed_metrics_compare_only_the_systems_both_trained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--seed-metrics: mean ± the half-width of its 95 % interval over seeds from
    metrics/<system>/<pair>/seed<k>.json, no timing needed; a system one workspace lacks (here the
    candidate's local runs) is left out."""
    ref, cand = tmp_path / "a", tmp_path / "b"
    _seed_metrics(ref, "baseline", "en-es", [70.0, 72.0, 74.0])  # 72 ± 4.97 (t(0.975, 2) · 2 / √3)
    _seed_metrics(ref, "local", "en-es", [1.0, 2.0, 3.0])
    _seed_metrics(cand, "baseline", "en-es", [60.0, 61.0, 62.0])  # 61 ± 2.48: 11 > max(4.97, 2.48)
    assert compare_repro_runs.main([str(ref), str(cand), "--seed-metrics", "--names", "fp32", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "| en-es | baseline BLEU | 72.00 ± 4.97 | 61.00 ± 2.48 | -11.00 | **no** |" in out
    assert "local BLEU" not in out and "stage group" not in out
    assert out.rstrip().endswith("every BLEU mean within the interval: no")
    _seed_metrics(cand, "local", "en-es", [5.0, 6.0, 7.0])  # stale copies: --systems leaves them out
    assert compare_repro_runs.main([str(ref), str(cand), "--seed-metrics", "--systems", "baseline"]) == 0
    assert "local BLEU" not in capsys.readouterr().out
    _seed_metrics(tmp_path / "c", "baseline", "en-es", [70.0, 71.0])
    with pytest.raises(SystemExit, match=r"en-es/baseline: seeds \[1, 2, 3\] against \[1, 2\]"):
        compare_repro_runs.main([str(ref), str(tmp_path / "c"), "--seed-metrics"])
    with pytest.raises(SystemExit, match="^error: .*no per-seed ST metrics"):
        compare_repro_runs.main([str(ref), str(tmp_path / "empty"), "--seed-metrics"])
