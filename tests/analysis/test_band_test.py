"""The band-test table of every window configuration (lib.analysis.health.band_test_table, stage
band_test): its configurations and their windows, the gap recovered by hand, w >= 2N - 1 equal to full
attention exactly, and the stage end to end on a tiny layout."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from lib.analysis.health import band_test, band_test_configs, band_test_table, teacher_forced, with_local_layers
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.model.spec import shuffled_control_windows, uniform_control_window
from tests.analysis.test_health import _batch, _tiny
from tests.analysis.test_stages import ANALYSIS, N_LAYERS, PAIR, _is_png, _run_stage, layout, one_thread  # noqa: F401


def test_configs_in_order_with_the_controls() -> None:
    alg1 = [1, 3, 9]
    configs = band_test_configs(alg1, windows=[21, 3], shuffle_seed=4)
    assert list(configs) == ["full", "w1", "w3", "w21", "alg1", "uniform", "shuffled"]
    assert configs["full"] is None and configs["w21"] == [21] * 3 and configs["alg1"] == alg1
    assert configs["uniform"] == [uniform_control_window(alg1)] * 3 == [5] * 3  # mean 4.33 -> 5
    assert configs["shuffled"] == shuffled_control_windows(alg1, 4) and sorted(configs["shuffled"]) == alg1


def test_table_rows_and_the_widest_window_equals_full_attention() -> None:
    """w >= 2N - 1 covers every key: the same NLL and accuracy as full attention, so all of the gap."""
    model, batch = _tiny(), _batch()
    n = int(model.encode(batch.feats, batch.feat_lengths).lengths.max())
    wide = 2 * n - 1
    rows = band_test_table(model, [batch], full_layers=1, algorithm1=[3, wide], windows=[wide], shuffle_seed=1)
    assert list(rows) == ["full", "w1", f"w{wide}", "alg1", "uniform", "shuffled"]
    assert {k: rows[f"w{wide}"][k] for k in ("acc", "nll")} == {k: rows["full"][k] for k in ("acc", "nll")}
    full, w1 = rows["full"]["acc"], rows["w1"]["acc"]
    assert full != w1
    for name, row in rows.items():
        expected = (row["acc"] - w1) / (full - w1) if full > w1 else None
        assert row["gap_recovered"] == (None if expected is None else pytest.approx(expected, abs=1e-6)), name
    if full > w1:
        assert rows["full"]["gap_recovered"] == 1.0 and rows[f"w{wide}"]["gap_recovered"] == 1.0
        assert rows["w1"]["gap_recovered"] == 0.0
    assert rows["alg1"]["windows"] == [3, wide] and rows["alg1"]["mean_window"] == pytest.approx((3 + wide) / 2)
    assert rows["uniform"]["windows"] == [uniform_control_window([3, wide])] * 2
    # every row is the teacher-forced result of its windows
    for name in ("alg1", "uniform", "shuffled"):
        res = teacher_forced(with_local_layers(model, rows[name]["windows"], 1), [batch], 1)
        assert {k: rows[name][k] for k in ("acc", "nll")} == res
    with pytest.raises(ValueError, match="3 Algorithm 1 windows for 2 local layers"):
        band_test_table(model, [batch], full_layers=1, algorithm1=[1, 3, 5])


def test_band_test_extra_configurations() -> None:
    model, batch = _tiny(), _batch()
    res = band_test(model, [batch], full_layers=1, windows=[1], extra={"mine": [3, 1]})
    assert list(res) == ["full", "w1", "mine"]
    assert res["mine"] == teacher_forced(with_local_layers(model, [3, 1], 1), [batch], 1)
    with pytest.raises(ValueError, match="'w1' given twice"):
        band_test(model, [batch], full_layers=1, windows=[1], extra={"w1": [1, 1]})


def test_local_layers_take_the_windows_in_layer_order() -> None:
    """with_local_layers gives layer full_layers + i the i-th window: the rebuilt encoder's per-layer
    attention (config and modules) is the spec written out by hand, its logits (and band_test's row) are
    those of a model built with that spec directly, and the reversed windows give other logits."""
    model, batch = _tiny(), _batch()
    expected = [{"type": "full"}, {"type": "local", "window": 3}, {"type": "local", "window": 1}]
    local = with_local_layers(model, [3, 1], 1)
    assert local.cfg.encoder_attention == expected
    assert [(type(layer.self_attn).__name__, getattr(layer.self_attn, "window", None)) for layer in local.encoder.layers] \
        == [("FullAttention", None), ("LocalAttention", 3), ("LocalAttention", 1)]
    torch.manual_seed(0)
    ref = S2TTransformer(model_config("tiny", vocab_size=20, encoder_layers=3, encoder_attention=expected)).eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        got = local(batch.feats, batch.feat_lengths, batch.prev_tokens)
        want = ref(batch.feats, batch.feat_lengths, batch.prev_tokens)
        reversed_ = with_local_layers(model, [1, 3], 1)(batch.feats, batch.feat_lengths, batch.prev_tokens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(reversed_, want, rtol=1e-3, atol=1e-3)  # the order matters for this input
    res = band_test(model, [batch], full_layers=1, windows=[], extra={"mine": [3, 1]})
    assert res["mine"] == teacher_forced(ref, [batch], 1)
    # with the relative-position bias: the same windows in the same order, as dense banded attention
    banded = with_local_layers(_tiny(rel_pos_bias=4), [3, 1], 1)
    assert banded.cfg.encoder_attention == [{"type": "full"}, {"type": "banded", "window": 3}, {"type": "banded", "window": 1}]
    assert [getattr(layer.self_attn, "window", None) for layer in banded.encoder.layers] == [None, 3, 1]


def test_band_test_stage_end_to_end(layout, monkeypatch):
    params = yaml.safe_load((layout / "params.yaml").read_text())
    params["health"] = {"samples": 5, "band_split": "dev", "band_windows": [3], "head_threshold": 2.0}
    params["controls"] = {"systems": [], "shuffle_seed": 1, "band_seeds": [1]}
    params["model"] = {"size": "tiny", "overrides": {"encoder_layers": N_LAYERS}}  # the layout's models
    (layout / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _run_stage("select_windows", layout, [PAIR, "--no-progress"], monkeypatch)
    table = json.loads((layout / "data" / "windows" / PAIR / "windows.json").read_text())["table"]
    alg1 = [r["window"] for r in table[ANALYSIS["full_layers"]:]]
    monkeypatch.chdir(layout)
    _run_stage("band_test", layout, [PAIR, "1"], monkeypatch)
    out = json.loads((layout / "metrics" / "variants" / "band_test" / PAIR / "seed1.json").read_text())
    assert out["order"] == ["full", "w1", "w3", "alg1", "uniform", "shuffled"] and set(out["rows"]) == set(out["order"])
    assert out["rows"]["alg1"]["windows"] == alg1 and out["windows_from"] == "select_windows"
    assert out["model"] == "runs/baseline/en-de/seed1/model.pt" and out["sentences"] > 0 and out["seed"] == 1
    assert _is_png(layout / "plots" / "variants" / "band_test" / PAIR / "seed1.png")
    # local.windows overrides select_windows' windows, as for the local system itself
    params["local"]["windows"] = [5] * (N_LAYERS - ANALYSIS["full_layers"])
    (layout / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _run_stage("band_test", layout, [PAIR, "1"], monkeypatch)
    out = json.loads((layout / "metrics" / "variants" / "band_test" / PAIR / "seed1.json").read_text())
    assert out["windows_from"] == "local.windows" and out["rows"]["alg1"]["windows"] == [5, 5, 5]
    assert out["rows"]["uniform"]["windows"] == [5, 5, 5]
    with pytest.raises(SystemExit, match="band_test@en-de-2|train_baseline@en-de-2"):
        _run_stage("band_test", layout, [PAIR, "2"], monkeypatch)
