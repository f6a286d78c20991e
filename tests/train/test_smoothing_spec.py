"""lib/train/experiments.py::smoothing_spec_from_params: what a smoothing run trains (docs/variants.md):
the definition overlays full or local attention, the decoder gets its specs, the run lives where
lib/layout.py says, and the encoder starts from the baseline's ASR model or the smoothed one."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lib.layout import RunPaths
from lib.params import load_params
import lib.params.smoothing  # noqa: F401 (parses the smoothing section)
from lib.train.experiments import smoothing_spec_from_params

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def params():
    return load_params(REPO / "params.yaml")


def test_st_run_of_a_definition(params, tmp_path: Path) -> None:
    spec = smoothing_spec_from_params(params, tmp_path, "rec_pred_all", "en-de", 3)
    assert spec.paths.model == RunPaths(tmp_path, "smoothing", "en-de", 3, variant="rec_pred_all").model
    assert spec.init_encoder == RunPaths(tmp_path, "asr", "en-de").model  # the baseline's ASR model
    # the baseline's settings and seed, plus the priors' own optimizer group at smoothing.variant_lr
    assert spec.train == dataclasses.replace(params.train_st, seed=3, variant_lr=params.smoothing.variant_lr)
    enc = spec.encoder_attention
    assert enc[0] == {"type": "full"} and all(s["type"] == "smooth" and s["gamma"] == "predicted" for s in enc[1:])
    assert spec.model_overrides["cross_attention"]["type"] == "smooth"
    assert spec.model_overrides["decoder_self_attention"]["recursive"] is True
    for key, value in params.model.overrides.items():  # the model's own overrides are kept
        assert spec.model_overrides[key] == value


def test_asr_systems_start_from_their_smoothed_asr(params, tmp_path: Path) -> None:
    p = params.with_variant("smoothing", dataclasses.replace(params.smoothing, systems=["rec"],
                                                                  asr_systems=["rec"]))
    asr = smoothing_spec_from_params(p, tmp_path, "rec", "en-es")
    assert asr.task == "asr" and asr.train == dataclasses.replace(params.train_asr, variant_lr=params.smoothing.variant_lr)
    assert asr.paths.model == RunPaths(tmp_path, "smoothing_asr", "en-es", variant="rec").model
    st = smoothing_spec_from_params(p, tmp_path, "rec", "en-es", 1)
    assert st.init_encoder == asr.paths.model


def test_local_base_keeps_the_windows(params, tmp_path: Path) -> None:
    defs = {**params.smoothing.defs, "band_local": {"prior": "band", "k": 5, "base": "local"}}
    p = params.with_variant("smoothing", dataclasses.replace(params.smoothing, defs=defs))
    with pytest.raises(ValueError, match="windows.json: missing; it is written by the select_windows"):
        smoothing_spec_from_params(p, tmp_path, "band_local", "en-de", 1)
    windows = [{"type": "full"}] * 3 + [{"type": "local", "window": w} for w in (3, 5, 7, 9, 11, 13, 15, 17, 19)]
    path = tmp_path / "data/windows/en-de/windows.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"encoder_attention": windows}))
    enc = smoothing_spec_from_params(p, tmp_path, "band_local", "en-de", 1).encoder_attention
    assert [s["type"] for s in enc] == ["smooth"] * 12
    assert [s.get("window") for s in enc] == [None] * 3 + [3, 5, 7, 9, 11, 13, 15, 17, 19]


def test_unknown_system_names_the_key(params, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="smoothing.defs: no system 'gauss'"):
        smoothing_spec_from_params(params, tmp_path, "gauss", "en-de", 1)
