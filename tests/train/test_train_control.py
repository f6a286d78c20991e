"""Stage train_control end to end on the tiny data: a control of Algorithm 1's windows trains like
train_local (same ASR model runs/asr_local/<pair>, train_st settings) with the control's windows, into
runs/variants/controls/<control>/<pair>/seed<k>."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from lib.layout import RunPaths, windows_json
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.model.spec import local_attention_spec, shuffled_control_windows
from lib.train import checkpoint as ckpt
from tests.analysis.test_stages import REPO, _run_stage
from tests.dvc_repo import merge

ALG1 = [1, 3, 9]  # layers 2-4 of a 4-layer encoder


@pytest.fixture
def root(prepared: Path, tmp_path: Path) -> Path:
    (tmp_path / "data" / "prepared").mkdir(parents=True)
    (tmp_path / "data" / "prepared" / "en-de").symlink_to(prepared)
    cfg = model_config("tiny", vocab_size=40, encoder_layers=4, scale_embedding=False, subsampler_norm="layernorm")
    torch.manual_seed(0)
    ckpt.save(RunPaths(tmp_path, "asr_local", "en-de").model,
              {"model": S2TTransformer(cfg).state_dict(), "model_config": cfg.to_dict(), "task": "asr", "pair": "en-de"})
    path = windows_json(tmp_path, "en-de")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"encoder_attention": local_attention_spec(4, 1, ALG1)}))
    params = merge(yaml.safe_load((REPO / "params.yaml").read_text()), {
        "data": {"prepared_dir": "data/prepared"}, "model": {"size": "tiny", "overrides": {"encoder_layers": 4}},
        "train_st": {"max_updates": 2, "warmup_updates": 1, "max_frames": 200, "eval_every": 2, "save_every": 1,
                     "average_last": 2, "amp": "none"},
        "decode": {"beam": 1, "max_len_b": 6, "dev_sentences": 2}, "analysis": {"full_layers": 1},
        "parallel": {"jobs": 1}, "controls": {"systems": ["local_shuffled"], "shuffle_seed": 3}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return tmp_path


@pytest.mark.slow
def test_control_trains_with_its_windows(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(root)
    _run_stage("train_control", root, ["local_shuffled", "en-de", "1"], monkeypatch)
    run = RunPaths(root, "controls", "en-de", 1, variant="local_shuffled")
    metrics = json.loads(run.metrics.read_text())
    shuffled = shuffled_control_windows(ALG1, 3)
    assert metrics["windows"] == [0, *shuffled] and metrics["algorithm1_windows"] == [0, *ALG1]
    assert metrics["system"] == "local_shuffled" and 0 <= metrics["bleu"] <= 100 and metrics["updates"] == 2
    model = torch.load(run.model, weights_only=True)
    assert model["model_config"]["encoder_attention"] == local_attention_spec(4, 1, shuffled)
    assert run.hyps().is_file() and run.timing.is_file() and run.curves.is_dir()
    assert not RunPaths(root, "local", "en-de", 1).metrics.exists()  # the local system's outputs are untouched
    with pytest.raises(SystemExit):
        _run_stage("train_control", root, ["local_wide", "en-de", "1"], monkeypatch)


@pytest.mark.slow
def test_a_control_with_its_own_fork_starts_from_it(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # controls.asr_systems lists it: the ST run starts from runs/variants/controls_asr/<control>, not
    # from local's ASR model (moved away here, so that reading it would fail)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["controls"]["asr_systems"] = ["local_shuffled"]
    params["local"]["asr_pretraining"] = "fork"  # a control's own fork follows local's fork rule
    params["asr"]["fork_updates"] = max(1, params["asr"]["fork_updates"])
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    local_asr = RunPaths(root, "asr_local", "en-de").model
    fork = RunPaths(root, "controls_asr", variant="local_shuffled").model
    fork.parent.mkdir(parents=True)
    local_asr.rename(fork)
    monkeypatch.chdir(root)
    _run_stage("train_control", root, ["local_shuffled", "en-de", "1"], monkeypatch)
    metrics = json.loads(RunPaths(root, "controls", "en-de", 1, variant="local_shuffled").metrics.read_text())
    assert metrics["asr_model"] == "own fork" and metrics["updates"] == 2
