"""local.asr_pretraining: the shared ASR copy for train_local and the local-attention spec helper."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lib.train.run import local_encoder_attention, share_asr_run, spec_from_params


def _asr_run(root: Path) -> tuple[Path, Path]:
    src = root / "runs/asr/en-de"
    (src / "live/plots/metrics/train").mkdir(parents=True)
    (src / "live/plots/metrics/train/loss.tsv").write_text("step\tloss\n1\t2.0\n")
    (src / "model.pt").write_bytes(b"\x00model-bytes\xff")
    (src / "hyps.tst-COMMON.txt").write_text("a b\nc\n")
    metrics = root / "metrics/asr/en-de.json"
    metrics.parent.mkdir(parents=True)
    metrics.write_text(json.dumps({"wer": 12.5, "updates": 3}))
    return src, metrics


def test_shared_copy_is_faithful_and_marked(tmp_path: Path) -> None:
    src, metrics = _asr_run(tmp_path)
    dst, dst_metrics = tmp_path / "runs/asr_local/en-de", tmp_path / "metrics/asr_local/en-de.json"
    (dst / "checkpoints").mkdir(parents=True)
    (dst / "checkpoints/last.pt").write_bytes(b"stale local-ASR checkpoint")
    out = share_asr_run(src, metrics, dst, dst_metrics)
    assert (dst / "model.pt").read_bytes() == (src / "model.pt").read_bytes()
    assert (dst / "hyps.tst-COMMON.txt").read_text() == "a b\nc\n"
    assert (dst / "live/plots/metrics/train/loss.tsv").read_text() == "step\tloss\n1\t2.0\n"
    assert list((dst / "checkpoints").iterdir()) == []  # a local run's checkpoints are not this model's
    assert out == json.loads(dst_metrics.read_text()) == {"wer": 12.5, "updates": 3, "asr_pretraining": "shared"}
    share_asr_run(src, metrics, dst, dst_metrics)  # idempotent (a re-run of the stage)
    assert not (dst / "live.tmp").exists()


def test_shared_copy_needs_the_asr_run(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="runs/asr/en-de/model.pt"):
        share_asr_run(tmp_path / "runs/asr/en-de", tmp_path / "m.json", tmp_path / "dst", tmp_path / "d.json")
    assert not (tmp_path / "dst").exists()  # nothing half-written


def _params(windows: list[int], full_layers: int = 2):
    return SimpleNamespace(
        model=SimpleNamespace(size="tiny", overrides={"encoder_layers": 4}),
        local=SimpleNamespace(windows=windows, asr_pretraining="local"),
        extra={"analysis": {"full_layers": full_layers}},
        decode=SimpleNamespace(beam=2, len_penalty=1.0, max_len_a=0.0, max_len_b=10, batch_frames=1000,
                               final_checkpoint="last", dev_sentences=2),
        train_asr=SimpleNamespace(seed=1), train_st=None,
        data=SimpleNamespace(prepared_dir="data/prepared"),
    )


def test_local_spec_from_param_list_or_windows_json(tmp_path: Path, monkeypatch) -> None:
    from lib.analysis import pipeline

    monkeypatch.setattr(pipeline, "analysis_params", lambda p: SimpleNamespace(full_layers=2))
    spec = local_encoder_attention(_params([3, 5]), tmp_path, "en-de")
    assert spec == [{"type": "full"}, {"type": "full"}, {"type": "local", "window": 3},
                    {"type": "local", "window": 5}]
    with pytest.raises(ValueError, match="local.windows"):
        local_encoder_attention(_params([3]), tmp_path, "en-de")  # 2 local layers need 2 windows
    with pytest.raises(ValueError, match="select_windows"):
        local_encoder_attention(_params([]), tmp_path, "en-de")
    path = tmp_path / "data/windows/en-de/windows.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"encoder_attention": spec}))
    assert local_encoder_attention(_params([]), tmp_path, "en-de") == spec


def test_local_system_starts_from_the_asr_local_model(tmp_path: Path) -> None:
    p = _params([3, 5])
    asr_local = spec_from_params(p, tmp_path, "asr_local", "en-de", encoder_attention=[{"type": "full"}] * 4)
    assert asr_local.task == "asr" and asr_local.out_dir == tmp_path / "runs/asr_local/en-de"
    assert asr_local.metrics_path == tmp_path / "metrics/asr_local/en-de.json" and asr_local.init_encoder is None
    with pytest.raises(ValueError, match="unknown system"):
        spec_from_params(p, tmp_path, "asr-local", "en-de")
