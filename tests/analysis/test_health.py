"""Attention health (lib/analysis/health.py): hand-computable cases, and the stage end to end."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lib.model.checkpoint import load_model
from lib.analysis.health import (HealthAccumulator, HealthParams, band_mass, band_test, input_health, summarize,
                                 teacher_forced, uniform_band_expectation, with_local_layers)
from lib.analysis.pipeline import choose_samples
from lib.stats import spearman
from lib.data.dataset import Batch
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.params import ParamError, parse_section
from tests.analysis.test_stages import ANALYSIS, analysis_params, N_LAYERS, PAIR, _is_png, _run_stage, layout, one_thread  # noqa: F401


def test_uniform_band_expectation_closed_form():
    for n in (1, 2, 5, 17):
        for k in (0, 1, 2, 4, 30):
            count = sum(1 for i in range(n) for j in range(n) if abs(i - j) <= k)
            assert uniform_band_expectation(n, k) == pytest.approx(count / n)
    with pytest.raises(ValueError):
        uniform_band_expectation(0, 1)


def test_uniform_attention_has_band_ratio_one():
    n, h = 13, 3
    attn = torch.full((h, n, n), 1.0 / n)
    for k in (1, 2, 4):
        torch.testing.assert_close(band_mass(attn, k), torch.full((h,), uniform_band_expectation(n, k), dtype=torch.float64))


def test_hand_built_banded_attention():
    """Head 0 attends only to the query itself; head 1 splits evenly over |i - j| <= 2 (clipped at
    the edges): masses within ±1 and ±2 follow by counting."""
    n = 10
    eye = torch.eye(n)
    idx = torch.arange(n)
    band2 = ((idx[None] - idx[:, None]).abs() <= 2).float()
    band2 = band2 / band2.sum(-1, keepdim=True)
    attn = torch.stack([eye, band2])
    assert band_mass(attn, 0).tolist() == pytest.approx([n, n * 0 + float(sum(band2[i, i] for i in range(n)))])
    m2 = band_mass(attn, 2)
    assert m2.tolist() == pytest.approx([n, n])  # all mass within ±2 for both heads
    m1 = band_mass(attn, 1)
    expected = float(sum(band2[i, j] for i in range(n) for j in range(n) if abs(i - j) <= 1))
    assert m1.tolist() == pytest.approx([n, expected])
    ratio2 = m2 / uniform_band_expectation(n, 2)
    assert ratio2.tolist() == pytest.approx([n / ((n * 5 - 6) / n)] * 2)


def _tiny(seed: int = 0, **over) -> S2TTransformer:
    torch.manual_seed(seed)
    return S2TTransformer(model_config("tiny", vocab_size=20, encoder_layers=3, **over)).eval()


def _batch(n_frames=(60, 37), seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    B, T = len(n_frames), max(n_frames)
    feats = torch.zeros(B, T, 80)
    for b, t in enumerate(n_frames):
        feats[b, :t] = torch.randn(t, 80, generator=g)
    tgt = torch.randint(4, 20, (B, 6), generator=g)
    tgt[:, -1] = 2
    tgt[1, 4:] = 1  # padding of the second target
    prev = torch.cat([torch.full((B, 1), 2), tgt[:, :-1]], 1).masked_fill(tgt.eq(1), 1)
    return Batch([str(i) for i in range(B)], feats, torch.tensor(n_frames), prev, tgt,
                 tgt.ne(1).sum(1), [""] * B, [""] * B)


def test_band_test_with_the_widest_window_equals_full_attention():
    """w >= 2N - 1 covers every key: identical logits, so identical NLL and accuracy."""
    model = _tiny()
    batch = _batch()
    n = int(model.encode(batch.feats, batch.feat_lengths).lengths.max())
    wide = 2 * n + 1
    res = band_test(model, [batch], full_layers=1, windows=[1, wide])
    assert res["full"] == res[f"w{wide}"]
    assert res["w1"] != res["full"]
    with torch.no_grad():
        full = model(batch.feats, batch.feat_lengths, batch.prev_tokens)
        local = with_local_layers(model, [wide, wide], 1)(batch.feats, batch.feat_lengths, batch.prev_tokens)
    torch.testing.assert_close(local, full, rtol=1e-5, atol=1e-5)
    # teacher_forced counts: accuracy in %, NLL per non-pad target token
    lp = torch.log_softmax(full, -1)
    mask = batch.target.ne(1)
    assert res["full"]["nll"] == pytest.approx(float(-lp.gather(-1, batch.target[..., None])[..., 0][mask].mean()), rel=1e-5)
    assert res["full"]["acc"] == pytest.approx(100 * float((lp.argmax(-1).eq(batch.target) & mask).sum() / mask.sum()), abs=1e-3)
    assert teacher_forced(model, [batch], 1) == res["full"]


def test_position_share_of_the_input():
    """Σ pos² / Σ content² is what the scale and the subsampler LayerNorm change."""
    feats = torch.randn(50, 80)
    scaled = _tiny(1)
    c_sq, p_sq = input_health(scaled, feats)
    plain = _tiny(1, scale_embedding=False)
    c2, p2 = input_health(plain, feats)
    assert p2 == pytest.approx(p_sq) and c_sq == pytest.approx(c2 * 16, rel=1e-5)  # sqrt(d)^2 = 16 (d = 16)
    normed = _tiny(1, scale_embedding=False, subsampler_norm="layernorm")
    c3, _ = input_health(normed, feats)
    assert c3 == pytest.approx(16 * 13, rel=1e-2)  # LN output: rms 1 per coordinate, N = 13 tokens


def _assert_health_by_hand(res: dict, model: S2TTransformer, sentences: list) -> None:
    """``HealthAccumulator.result()`` of ``sentences`` against the module docstring's definitions,
    computed here from the layer tensors (ratios of totals over the sentences):
    position_share = sqrt(Σ pos² / Σ content²); attn_ratio = sqrt(Σ ‖MHA(LN(x))‖² / Σ ‖x‖²);
    c_ii = Σ trace(C) / Σ N; band k = Σ_sentences mass within ±k / Σ_sentences Σ_i |{j: |i-j| <= k}| / N,
    per head (band k: the head mean); profile[d-1] = mean over sentences of the mean of C's ±d-th
    diagonals; falloff = mean(profile at offsets 1-2) / mean(profile at offsets 6-8)."""
    from lib.analysis.extract import layer_contributions, layer_tensors

    close = dict(rel=1e-5, abs=2e-6)  # result() rounds to 6 decimals
    content_sq = pos_sq = 0.0
    x_sq, a_sq, trace = np.zeros(N_LAYERS), np.zeros(N_LAYERS), np.zeros(N_LAYERS)
    mass = {k: np.zeros((N_LAYERS, model.cfg.n_heads)) for k in (1, 2, 4)}
    uniform = {k: 0.0 for k in (1, 2, 4)}
    prof_sum, prof_cnt = np.zeros((N_LAYERS, 8)), np.zeros((N_LAYERS, 8))
    tokens = 0
    for feats in sentences:
        with torch.no_grad():
            content, pos, _, _ = model.encoder.embed(feats[None].float(), torch.tensor([feats.shape[0]]))
        content_sq += float(content.double().pow(2).sum())
        pos_sq += float(pos.double().pow(2).sum())
        ut = layer_tensors(model, feats)
        n = ut.n_tokens
        assert n > 8  # every offset 1..8 of the profile exists
        tokens += n
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        for k in uniform:
            uniform[k] += float((np.abs(i - j) <= k).sum()) / n
        for li, t in enumerate(ut.layers):
            x_sq[li] += float((t.x.double() ** 2).sum())
            a_sq[li] += float((t.attn_out.double() ** 2).sum())
            attn = t.attn.double().numpy()  # (H, N, N)
            for k in mass:
                mass[k][li] += (attn * (np.abs(i - j) <= k)).sum(axis=(1, 2))
            c = layer_contributions(t).numpy()
            trace[li] += np.trace(c)
            for d in range(1, 9):
                prof_sum[li, d - 1] += (np.diagonal(c, d).mean() + np.diagonal(c, -d).mean()) / 2
                prof_cnt[li, d - 1] += 1
    assert res["sentences"] == len(sentences) and res["tokens_mean"] == pytest.approx(tokens / len(sentences))
    assert res["position_share"] == pytest.approx(np.sqrt(pos_sq / content_sq), **close)
    for li in range(N_LAYERS):
        row = res["layers"][f"l{li + 1:02d}"]
        assert row["attn_ratio"] == pytest.approx(np.sqrt(a_sq[li] / x_sq[li]), **close)
        assert row["c_ii"] == pytest.approx(trace[li] / tokens, **close)
        for k in mass:
            heads = mass[k][li] / uniform[k]
            assert row[f"band{k}"] == pytest.approx(heads.mean(), **close)
        heads2 = mass[2][li] / uniform[2]
        assert res["heads_band2"][f"l{li + 1:02d}"] == pytest.approx(list(heads2), **close)
        assert row["heads_band2_ge2x"] == int((heads2 >= 2.0).sum())
        prof = prof_sum[li] / prof_cnt[li]
        assert row["profile"] == pytest.approx(list(prof), **close)
        assert row["falloff"] == pytest.approx(prof[0:2].mean() / prof[5:8].mean(), **close)


def test_accumulator_result_and_algorithm1_windows(layout):
    ap = analysis_params({"analysis": ANALYSIS})
    from lib.data.dataset import SpeechDataset

    ds = SpeechDataset(layout / "data" / "prepared" / PAIR, "train", "asr")
    model, _ = load_model(layout / "runs" / "baseline" / PAIR / "seed1" / "model.pt")
    idx = choose_samples(len(ds), ap.window_samples, ap.seed)
    acc = HealthAccumulator(N_LAYERS, model.cfg.n_heads, select_kwargs=ap.select_kwargs(), threshold=ap.threshold)
    for i in idx:
        acc.add(model, ds.features(i))
    res = acc.result()
    assert sorted(res["layers"]) == [f"l{i:02d}" for i in range(1, N_LAYERS + 1)]
    for row in res["layers"].values():
        assert 0 < row["c_ii"] <= 1 and row["attn_ratio"] > 0 and row["band2"] > 0
        assert len(row["profile"]) == 8
    assert all(len(v) == model.cfg.n_heads for v in res["heads_band2"].values())
    assert res["position_share"] > 0
    # the figures of two sentences, recomputed here from the module docstring's definitions
    two = HealthAccumulator(N_LAYERS, model.cfg.n_heads)
    for i in idx[:2]:
        two.add(model, ds.features(i))
    _assert_health_by_hand(two.result(), model, [ds.features(i) for i in idx[:2]])
    # Algorithm 1's windows equal the select_windows stage's for the same model and sentences.
    _run_stage("select_windows", layout, [PAIR, "--no-progress"], pytest.MonkeyPatch())
    table = json.loads((layout / "data" / "windows" / PAIR / "windows.json").read_text())["table"]
    assert acc.algorithm1_windows(ap.full_layers) == [r["window"] for r in table[ap.full_layers:]]


def test_summary_counts_the_windows_and_their_growth_with_depth():
    """alg1_windows_ge3 and Spearman's ρ of the windows against depth, by hand: growing windows give
    +1, shrinking -1, constant 0; layers <= full_layers stay out of the layer means."""
    row = {"c_ii": 0.7, "band2": 3.0, "attn_ratio": 0.1, "falloff": 1.5, "heads_band2_ge2x": 1}
    result = {"layers": {"l01": {**row, "c_ii": 0.1}, "l02": row, "l03": row, "l04": row},
              "heads_band2": {"l02": [3.0, 1.0]}, "position_share": 0.6}
    for windows, ge3, rho in (([1, 3, 9], 2, 1.0), ([9, 5, 1], 2, -1.0), ([3, 3, 3], 3, 0.0)):
        s = summarize({**result, "algorithm1_windows": windows}, full_layers=1)
        assert (s["alg1_windows_ge3"], s["alg1_windows_rho"], s["c_ii_mean"]) == (ge3, rho, 0.7)
    assert "alg1_windows_rho" not in summarize({**result, "algorithm1_windows": [5]}, full_layers=3)


def test_health_stage_end_to_end(layout, monkeypatch):
    params = yaml.safe_load((layout / "params.yaml").read_text())
    params["health"] = {"samples": 5, "band_split": "dev", "band_windows": [1, 3], "head_threshold": 2.0}
    (layout / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _run_stage("select_windows", layout, [PAIR, "--no-progress"], monkeypatch)
    table = json.loads((layout / "data" / "windows" / PAIR / "windows.json").read_text())["table"]
    monkeypatch.chdir(layout)  # as DVC runs a stage: in the repository
    for role in ("asr", "st"):
        _run_stage("health", layout, [PAIR, role, "--no-progress"], monkeypatch)
        flat = json.loads((layout / "metrics" / "health" / PAIR / f"{role}.json").read_text())
        assert set(flat["band_test"]) == {"full", "w1", "w3", "alg1"}
        s = flat["summary"]
        assert s["heads"] == (N_LAYERS - ANALYSIS["full_layers"]) * 2 and 0 <= s["local_heads"] <= s["heads"]
        assert not any(isinstance(v, list) for row in flat["layers"].values() for v in row.values())
        details = json.loads((layout / "data" / "health" / PAIR / f"{role}.json").read_text())
        assert details["task"] == role and len(details["algorithm1_windows"]) == N_LAYERS - ANALYSIS["full_layers"]
        assert details["sentences"] == 5
        windows = details["algorithm1_windows"]
        assert s["alg1_windows_ge3"] == sum(w >= 3 for w in windows)
        assert s["alg1_windows_rho"] == pytest.approx(spearman(range(len(windows)), windows), abs=1e-6)
        # the model named relative to the repository: the same bytes in every clone
        assert not Path(details["model"]).is_absolute() and (layout / details["model"]).is_file()
        if role == "st":  # the band test uses select_windows' windows
            assert details["algorithm1_windows"] == [r["window"] for r in table[ANALYSIS["full_layers"]:]]
            assert details["windows_from"] == "select_windows"
        assert _is_png(layout / "plots" / "health" / PAIR / f"{role}.png")


def health_params(data: dict) -> HealthParams:
    return parse_section(HealthParams, data["health"], "health")


def test_health_params_name_the_key():
    with pytest.raises(ParamError, match="health.samples: missing"):
        health_params({"health": {}})
    good = {"samples": 5, "band_split": "dev", "band_windows": [1, 3], "head_threshold": 2.0}
    assert health_params({"health": good}) == HealthParams(5, "dev", [1, 3], 2.0)
    with pytest.raises(ParamError, match=r"health\.band_windows\[1\]"):
        health_params({"health": {**good, "band_windows": [1, 4]}})
    with pytest.raises(ParamError, match=r"health\.bogus"):
        health_params({"health": {**good, "bogus": 1}})


@pytest.mark.parametrize("table", [{}, [{"attention": "local"}] * 4, "1 3 5"])
def test_health_st_names_a_windows_table_of_another_shape(tmp_path, table):
    """select_windows' table, parsed but not a list of rows with a 'window' each: an InputError naming the file
    and select_windows (the health_st stage's one line), before the model is loaded, not a TypeError or KeyError."""
    from lib.analysis.health import health_stage
    from lib.io import InputError

    prepared = tmp_path / "prepared/en-de"
    prepared.mkdir(parents=True)
    for split in ("train", "dev"):
        (prepared / f"{split}.tsv").write_text("")
    windows = tmp_path / "windows.json"
    windows.write_text(json.dumps({"table": table}))
    hp = parse_section(HealthParams, {"samples": 2, "band_split": "dev", "band_windows": [1, 3], "head_threshold": 2.0},
                       "health")
    ap = analysis_params({"analysis": {**ANALYSIS, "window_split": "train", "full_layers": 2}})
    with pytest.raises(InputError, match=r"windows\.json: 'table' is not a list of per-layer rows .*select_windows"):
        health_stage(tmp_path / "missing-model.pt", prepared, "st", "en-de", ap=ap, hp=hp,
                     details_path=tmp_path / "d.json", metrics_path=tmp_path / "m.json", plot_path=tmp_path / "p.png",
                     producer="train_baseline", progress=False, windows_path=windows)
