"""local.asr_pretraining: the shared ASR copy for train_local and the local-attention spec helper."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lib.layout import RunPaths
from lib.model.checkpoint import save_model
from lib.train import checkpoint as ckpt
from lib.model.s2t_transformer import model_config
from lib.train.experiments import local_encoder_attention, share_asr_run, spec_from_params


def _asr_run(root: Path) -> RunPaths:
    src = RunPaths(root, "asr", "en-de")
    (src.curves / "train").mkdir(parents=True)
    (src.curves / "train/loss.tsv").write_text("step\tloss\n1\t2.0\n")
    src.run_dir.mkdir(parents=True)
    save_model(src.model, {"w": torch.zeros(2)}, model_config("demo"))  # a model file: the copy reads it first
    src.decoded.mkdir(parents=True)
    src.hyps().write_text("a b\nc\n")
    src.refs().write_text("a b\nc d\n")
    src.metrics.parent.mkdir(parents=True)
    src.metrics.write_text(json.dumps({"wer": 12.5, "updates": 3}))
    return src


def test_shared_copy_is_faithful_and_marked(tmp_path: Path) -> None:
    src = _asr_run(tmp_path)
    dst = RunPaths(tmp_path, "asr_local", "en-de")
    dst.checkpoints.mkdir(parents=True)
    (dst.checkpoints / "last.pt").write_bytes(b"stale local-ASR checkpoint")
    out = share_asr_run(src, dst)
    assert dst.model.read_bytes() == src.model.read_bytes()
    assert dst.hyps().read_text() == "a b\nc\n" and dst.refs().read_text() == "a b\nc d\n"
    assert (dst.curves / "train/loss.tsv").read_text() == "step\tloss\n1\t2.0\n"
    assert not dst.checkpoints.exists()  # a local run's resume state is not this model's
    assert json.loads(dst.timing.read_text()) == {"train_seconds": 0.0, "decode_seconds": 0.0}
    assert out == json.loads(dst.metrics.read_text()) == {"wer": 12.5, "updates": 3, "asr_pretraining": "shared"}
    share_asr_run(src, dst)  # idempotent (a re-run of the stage)
    assert not dst.curves.with_name(dst.curves.name + ".tmp").exists()


@pytest.mark.parametrize("damage, match", [
    (lambda src: src.model.write_bytes(src.model.read_bytes()[:500]),
     r"model\.pt: cannot load checkpoint .*train_asr@en-de"),
    (lambda src: ckpt.save(src.model, {"unused": "x"}), r"model\.pt: not a model checkpoint \(x\)"),
    (lambda src: src.metrics.write_text('{"wer": 1'), r"en-de\.json: not valid JSON"),
    (lambda src: src.metrics.write_text("[]"), r"en-de\.json: not a mapping of metrics"),
])
def test_a_damaged_asr_run_is_not_copied(tmp_path: Path, damage, match: str) -> None:
    """A truncated or placeholder model.pt was copied as it was (the stage succeeded and DVC cached the damaged
    file as train_asr_local's output), and damaged metrics stopped the copy half-way (model and test set
    already replaced, metrics not): now both stop before the copy changes a file."""
    from lib.io import InputError

    src = _asr_run(tmp_path)
    dst = RunPaths(tmp_path, "asr_local", "en-de")
    share_asr_run(src, dst)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "asr_local" in str(p)}
    src.hyps().write_text("a newer run\nof train_asr\n")  # what a copy would carry over
    damage(src)
    with pytest.raises(InputError, match=match):
        share_asr_run(src, dst)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "asr_local" in str(p)} == before


def test_adopting_the_shared_asr_model_reads_its_metrics_before_decoding(tmp_path: Path) -> None:
    """metrics/asr_shared.json not a mapping: an InputError naming it before the pair's test set is decoded
    and written (it used to fail after, in a traceback, with the decoded test set already replaced)."""
    from lib.io import InputError
    from lib.train.experiments import adopt_shared_asr

    src = RunPaths(tmp_path, "asr_shared")
    save_model(src.model, {"w": torch.zeros(2)}, model_config("demo"))
    src.metrics.parent.mkdir(parents=True, exist_ok=True)
    src.metrics.write_text("[]")
    p = SimpleNamespace(asr=SimpleNamespace(shared_pair="en-de"), data=SimpleNamespace(prepared_dir="data/prepared"))
    with pytest.raises(InputError, match=r"asr_shared\.json: not a mapping of metrics .*train_asr_shared"):
        adopt_shared_asr(p, tmp_path, "en-es")
    assert not (tmp_path / "runs/asr/en-es").exists() and not (tmp_path / "data").exists()
    ckpt.save(src.model, [1])
    with pytest.raises(InputError, match=r"asr_shared/model\.pt: not a model \(a list\)"):
        adopt_shared_asr(p, tmp_path, "en-es")


def test_shared_copy_needs_the_asr_run(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="runs/asr/en-de/model.pt"):
        share_asr_run(RunPaths(tmp_path, "asr", "en-de"), RunPaths(tmp_path, "asr_local", "en-de"))
    assert not (tmp_path / "runs/asr_local").exists()  # nothing half-written


@dataclasses.dataclass(frozen=True)
class _TrainST:
    """Stands in for the ``train_st`` section: spec_from_params replaces its seed per run."""

    seed: int = 0
    max_updates: int = 10


def _params(windows: list[int], full_layers: int = 2):
    return SimpleNamespace(
        model=SimpleNamespace(size="tiny", overrides={"encoder_layers": 4}),
        local=SimpleNamespace(windows=windows, asr_pretraining="local"),
        analysis=SimpleNamespace(full_layers=full_layers),
        decode=SimpleNamespace(beam=2, len_penalty=1.0, max_len_a=0.0, max_len_b=10, batch_frames=1000,
                               final_checkpoint="last", dev_sentences=2),
        train_asr=SimpleNamespace(seed=1), train_st=_TrainST(),
        data=SimpleNamespace(prepared_dir="data/prepared"), parallel=SimpleNamespace(jobs="auto"),
    )


def test_local_spec_from_param_list_or_windows_json(tmp_path: Path) -> None:
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
    """``local`` runs start from runs/asr_local/<pair>/model.pt, ``baseline`` runs from runs/asr/<pair>/model.pt
    (the two ST systems differ in attention only); the ASR systems start from nothing."""
    p = _params([3, 5])
    local = spec_from_params(p, tmp_path, "local", "en-de", 2, encoder_attention=[{"type": "full"}] * 4)
    baseline = spec_from_params(p, tmp_path, "baseline", "en-de", 2)
    assert local.init_encoder == tmp_path / "runs/asr_local/en-de/model.pt" == RunPaths(tmp_path, "asr_local", "en-de").model
    assert baseline.init_encoder == tmp_path / "runs/asr/en-de/model.pt" == RunPaths(tmp_path, "asr", "en-de").model
    assert local.task == baseline.task == "st" and local.train.seed == baseline.train.seed == 2
    assert local.paths.run_dir == tmp_path / "runs/local/en-de/seed2"
    assert baseline.paths.run_dir == tmp_path / "runs/baseline/en-de/seed2"
    asr_local = spec_from_params(p, tmp_path, "asr_local", "en-de", encoder_attention=[{"type": "full"}] * 4)
    assert asr_local.task == "asr" and asr_local.paths.run_dir == tmp_path / "runs/asr_local/en-de"
    assert asr_local.paths.metrics == tmp_path / "metrics/asr_local/en-de.json" and asr_local.init_encoder is None
    with pytest.raises(ValueError, match="unknown system"):
        spec_from_params(p, tmp_path, "asr-local", "en-de")
