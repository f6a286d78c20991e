"""lib/model/checkpoint.py: the model file's one owner (save, rebuild from its own config, errors)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lib.model import checkpoint as model_file
from lib.model.s2t_transformer import model_config


def _tiny():
    torch.manual_seed(0)
    cfg = model_config("tiny", vocab_size=20, encoder_layers=2, decoder_layers=1,
                       encoder_attention=[{"type": "full"}, {"type": "local", "window": 3}])
    return model_file.build_model(cfg), cfg


def test_save_then_load_rebuilds_the_same_model_with_its_meta(tmp_path: Path) -> None:
    model, cfg = _tiny()
    path = tmp_path / "run" / "model.pt"
    model_file.save_model(path, model, cfg, task="st", pair="en-de", checkpoint="avg_last_k")
    state = model_file.read_model_state(path)
    assert list(state) == ["model", "model_config", "task", "pair", "checkpoint"]  # the file's layout
    back, meta = model_file.load_model(path)
    assert not back.training and back.cfg == cfg
    assert meta == {"task": "st", "pair": "en-de", "checkpoint": "avg_last_k", "model_config": cfg.to_dict()}
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    assert [type(layer.self_attn).__name__ for layer in back.encoder.layers] == ["FullAttention", "LocalAttention"]


def test_a_missing_or_foreign_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"seed2/model.pt: model checkpoint not found .*dvc repro train_baseline"):
        model_file.load_model(tmp_path / "seed2" / "model.pt", producer="train_baseline")
    model_file.save(tmp_path / "state.pt", {"update": 3})
    with pytest.raises(ValueError, match=r"state.pt: not a model checkpoint \(no 'model' entry"):
        model_file.read_model_state(tmp_path / "state.pt")
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(RuntimeError, match="cut.pt: cannot load checkpoint"):
        model_file.load_model(tmp_path / "cut.pt")


def test_a_file_that_does_not_build_its_model_is_an_input_error(tmp_path: Path) -> None:
    """A placeholder (the unused shared ASR model), a list, weights of another shape, a config of the wrong
    type: each an InputError naming the file and the stage to rerun (one line from a stage), not a KeyError,
    TypeError or load_state_dict's RuntimeError from deep inside the model."""
    from lib.io import InputError

    model, cfg = _tiny()
    model_file.save(tmp_path / "placeholder.pt", {"unused": "asr.mode is per_pair"})
    with pytest.raises(InputError, match=r"placeholder\.pt: not a model checkpoint \(asr\.mode is per_pair\); "
                                         r"it is written by the train_asr stage"):
        model_file.load_model(tmp_path / "placeholder.pt", producer="train_asr")
    model_file.save(tmp_path / "list.pt", [1, 2])
    with pytest.raises(InputError, match=r"list\.pt: not a model checkpoint \(a list, not a mapping\)"):
        model_file.read_model_state(tmp_path / "list.pt")
    weights = model.state_dict()
    key = next(k for k in weights if k.endswith("fc1.weight"))
    model_file.save_model(tmp_path / "shape.pt", {**weights, key: weights[key][:, :5].clone()}, cfg)
    with pytest.raises(InputError, match=rf"shape\.pt: its weights and config do not build a model \(RuntimeError: .*"
                                         rf"size mismatch for {key}.*train_baseline stage"):
        model_file.load_model(tmp_path / "shape.pt", producer="train_baseline")
    model_file.save(tmp_path / "config.pt", {"model": weights, "model_config": {**cfg.to_dict(), "n_heads": "four"}})
    with pytest.raises(InputError, match=r"config\.pt: its weights and config do not build a model \(TypeError"):
        model_file.load_model(tmp_path / "config.pt")
