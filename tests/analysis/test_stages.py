"""End-to-end tests of the `analyze` and `select_windows` stages on a tiny layout in a temporary
folder: a prepared en-de pair built from a synthetic MuST-C corpus (tones + noise), random tiny
ASR / ST models saved in the training checkpoint format, and a params.yaml with an `analysis`
section. The stage scripts run in-process with their repository root pointed at that folder."""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lib.analysis.contributions import contributions
from lib.analysis.extract import contribution_matrices, layer_tensors
from lib.model.checkpoint import load_model
from lib.analysis.pipeline import PairPaths, choose_samples, select_windows_pair
from lib.analysis.windows import window_table_from_matrices
from lib.data.dataset import SpeechDataset
from lib.data.prepare import prepare_pair
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.params import AnalysisParams, ParamError, PrepareParams, parse_section
from lib.model import checkpoint as ckpt
from tests.corpus_factory import make_corpus, talk

REPO = Path(__file__).resolve().parents[2]
PAIR = "en-de"
N_LAYERS = 4
ANALYSIS = {
    "st_seed": 1, "split": "tst-COMMON", "samples": 3, "seed": 1, "value_bias": "bias", "residual": True,
    "ccd_method": "trapezoid", "figure_sample": 1, "figure_layer": 11, "transparency_samples": 2,
    "window_split": "train", "window_samples": 8, "threshold": 0.01, "full_layers": 1, "width_rule": "2i",
    "include_main_diagonal": True, "patience_fraction": 0.1, "patience_rounding": "ceil", "min_patience": 1,
    "ddof": 0,
}


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: the suite stays within its CPU budget on shared cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _make_corpus(root: Path) -> None:
    spec = {"train": [talk(4, 1, speaker="spk.1", durations=(0.5, 1.6)), talk(3, 2, speaker="spk.2", durations=(0.5, 1.6)),
                      talk(4, 3, speaker="spk.1", durations=(0.5, 1.6))],
            "dev": [talk(2, 4, speaker="spk.3", durations=(0.5, 1.6))],
            "tst-COMMON": [talk(3, 5, speaker="spk.4", durations=(0.5, 1.6))]}
    make_corpus(root, spec, pair=PAIR)


def _save_model(path: Path, seed: int, task: str) -> None:
    torch.manual_seed(seed)
    cfg = model_config("tiny", vocab_size=40, encoder_layers=N_LAYERS)
    m = S2TTransformer(cfg)
    ckpt.save(path, {"model": m.state_dict(), "model_config": cfg.to_dict(), "task": task, "pair": PAIR})


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("analysis_repo")
    _make_corpus(root / "mustc")
    prepare_pair(root / "mustc", PAIR, root / "data" / "prepared" / PAIR,
                 PrepareParams(workers=1, asr_vocab_size=40, st_vocab_size=40), progress=False)
    _save_model(root / "runs" / "asr" / PAIR / "model.pt", 1, "asr")
    _save_model(root / "runs" / "baseline" / PAIR / "seed1" / "model.pt", 2, "st")
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["data"]["prepared_dir"] = "data/prepared"
    params["analysis"] = dict(ANALYSIS)
    if 1 not in params["seeds"]:
        params["seeds"] = [1, *params["seeds"]]
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return root


def _run_stage(name: str, root: Path, argv: list[str], monkeypatch) -> None:
    """Run stages/<name>.py's main() in-process with ROOT = ``root``."""
    monkeypatch.syspath_prepend(str(REPO / "stages"))
    import _common

    spec = importlib.util.spec_from_file_location(f"_stage_{name}", REPO / "stages" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(_common, "ROOT", root)
    monkeypatch.setattr(mod, "ROOT", root)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # module-scoped fixtures run outside the autouse one_thread fixture
    try:
        mod.main()
    finally:
        torch.set_num_threads(old)


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


@pytest.fixture(scope="module")
def analyzed(layout, tmp_path_factory) -> Path:
    mp = pytest.MonkeyPatch()
    try:
        _run_stage("analyze", layout, [PAIR, "--no-progress"], mp)
    finally:
        mp.undo()
    return layout


@pytest.fixture(scope="module")
def windowed(layout) -> Path:
    mp = pytest.MonkeyPatch()
    try:
        _run_stage("select_windows", layout, [PAIR, "--no-progress"], mp)
    finally:
        mp.undo()
    return layout


# ------------------------------------------------------------------------------ analyze


def test_analyze_metrics(analyzed):
    metrics = json.loads((analyzed / "metrics" / "analysis" / f"{PAIR}.json").read_text())
    assert metrics["samples"] == 3 and metrics["split"] == "tst-COMMON"
    for role in ("asr", "st"):
        layers = metrics[role]["layers"]
        assert sorted(layers) == [f"l{i:02d}" for i in range(1, N_LAYERS + 1)]
        for v in layers.values():
            assert 0.0 < v["ccd_mean"] <= 1.0 and v["ccd_std"] >= 0.0 and 0.0 < v["diag_share"] <= 1.0
        assert metrics[role]["model"] == ("runs/asr/en-de/model.pt" if role == "asr" else "runs/baseline/en-de/seed1/model.pt")
    assert metrics["asr"]["layers"] != metrics["st"]["layers"]  # two different models


def test_analyze_outputs_and_figures(analyzed):
    out = analyzed / "data" / "analysis" / PAIR
    per = json.loads((out / "ccd.json").read_text())
    assert len(per["ids"]) == 3 and len(per["st"]["ccd"]) == 3 and len(per["st"]["ccd"][0]) == N_LAYERS
    npz = sorted(p.name for p in (out / "transparency").glob("*.npz"))
    assert len(npz) == 4 and {n.split(".")[1] for n in npz} == {"asr", "st"}
    with np.load(out / "figure_sample.npz") as z:
        n = z["C_st"].shape[1]
        assert z["C_st"].shape == z["C_asr"].shape == (N_LAYERS, n, n)
        assert z["curves_st"].shape == (N_LAYERS, 2 * n)
        assert str(z["id"]) == per["ids"][ANALYSIS["figure_sample"]]
        np.testing.assert_allclose(z["curves_st"][:, -1], 1.0)  # D(2N) = 1 for normalised rows
    for name in ("fig2_diagonality.png", "fig3_ccd_layers.png"):
        assert _is_png(analyzed / "plots" / "analysis" / PAIR / name)


def _diagonality_by_hand(c: np.ndarray) -> np.ndarray:
    """D(w) for w = 1 .. 2N straight from Eq. 6: (1/N) times the sum of C_ij over |i - j| <= w // 2."""
    n = c.shape[0]
    offset = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    return np.array([c[offset <= w // 2].sum() / n for w in range(1, 2 * n + 1)])


def test_analyze_ccd_and_diagonal_share_recomputed(analyzed):
    """ccd.json's per-sentence CCD and D(1) of every layer, and the metrics' per-layer mean / std / D(1), are
    those of each layer's own contribution matrices, recomputed here from the models on the same sentences
    (D(1) = the main-diagonal share, not a wider D(w))."""
    per = json.loads((analyzed / "data" / "analysis" / PAIR / "ccd.json").read_text())
    metrics = json.loads((analyzed / "metrics" / "analysis" / f"{PAIR}.json").read_text())
    ds = SpeechDataset(analyzed / "data" / "prepared" / PAIR, ANALYSIS["split"], "asr")
    row_of = {r["id"]: i for i, r in enumerate(ds.rows)}
    models = {"asr": "runs/asr/en-de/model.pt", "st": "runs/baseline/en-de/seed1/model.pt"}
    for role, rel in models.items():
        model, _ = load_model(analyzed / rel)
        ccds, d1s, d3s = [], [], []
        for rid in per["ids"]:
            mats = contribution_matrices(model, ds.features(row_of[rid]), value_bias=ANALYSIS["value_bias"],
                                         residual=ANALYSIS["residual"])
            curves = [_diagonality_by_hand(c.numpy()) for c in mats]
            ccds.append([float(((d[:-1] + d[1:]) / 2).mean()) for d in curves])  # trapezoid rule over w = 1 .. 2N
            d1s.append([float(d[0]) for d in curves])
            d3s.append([float(d[2]) for d in curves])
        np.testing.assert_allclose(per[role]["ccd"], ccds, rtol=0, atol=2e-6)
        np.testing.assert_allclose(per[role]["diag_share"], d1s, rtol=0, atol=2e-6)
        ccd_arr, d1_arr = np.array(ccds), np.array(d1s)
        # the check can tell layers apart and D(1) from D(3)
        assert np.ptp(ccd_arr.mean(0)) > 1e-3 and np.min(np.array(d3s) - d1_arr) > 1e-3
        for li in range(N_LAYERS):
            got = metrics[role]["layers"][f"l{li + 1:02d}"]
            assert got["ccd_mean"] == pytest.approx(ccd_arr[:, li].mean(), abs=2e-6)
            assert got["ccd_std"] == pytest.approx(ccd_arr[:, li].std(ddof=ANALYSIS["ddof"]), abs=2e-6)
            assert got["diag_share"] == pytest.approx(d1_arr[:, li].mean(), abs=2e-6)
        assert metrics[role]["ccd_mean"] == pytest.approx(ccd_arr.mean(), abs=2e-6)
        assert metrics[role]["diag_share"] == pytest.approx(d1_arr.mean(), abs=2e-6)


def test_transparency_npz_matches_the_model(analyzed):
    """The saved tensors are the model's: re-running it gives the same C (and C from the npz)."""
    out = analyzed / "data" / "analysis" / PAIR / "transparency"
    path = sorted(out.glob("*.st.npz"))[0]
    model, _ = load_model(analyzed / "runs" / "baseline" / PAIR / "seed1" / "model.pt")
    with np.load(path) as z:
        mats = contribution_matrices(model, torch.from_numpy(z["feats"]))
        for li in range(N_LAYERS):
            np.testing.assert_allclose(mats[li].numpy(), z["C"][li], rtol=1e-6, atol=1e-9)
            args = [torch.from_numpy(z[k][li]) for k in ("x", "attn", "ln_weight", "ln_bias")]
            c = contributions(*args, float(z["ln_eps"][li]), *[torch.from_numpy(z[k][li]) for k in
                                                               ("v_weight", "v_bias", "out_weight", "out_bias")])
            np.testing.assert_allclose(c.numpy(), z["C"][li], rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------ select_windows


def test_windows_json(windowed):
    res = json.loads((windowed / "data" / "windows" / PAIR / "windows.json").read_text())
    assert res["n_sentences"] == 8 and res["encoder_layers"] == N_LAYERS
    assert len(res["encoder_attention"]) == N_LAYERS
    assert res["encoder_attention"][0] == {"type": "full"}
    table = res["table"]
    assert [r["layer"] for r in table] == list(range(1, N_LAYERS + 1))
    for row, spec in zip(table, res["encoder_attention"]):
        assert set(row) >= {"layer", "mu", "sigma", "window", "cl_mean", "cl_std", "attention", "n_sentences"}
        assert row["window"] % 2 == 1 and row["window"] >= 1
        assert 0.0 <= row["cl_mean"] <= 1.0
        if row["layer"] <= ANALYSIS["full_layers"]:
            assert row["attention"] == "full" and spec == {"type": "full"}
        else:
            assert row["attention"] == "local" and spec == {"type": "local", "window": row["window"]}
    # The specs build a model.
    model_config("tiny", vocab_size=40, encoder_layers=N_LAYERS, encoder_attention=res["encoder_attention"])
    per = json.loads((windowed / "data" / "windows" / PAIR / "per_sentence.json").read_text())
    assert len(per["ids"]) == 8 and all(len(w) == N_LAYERS for w in per["windows"])
    prof = json.loads((windowed / "data" / "windows" / PAIR / "diagonal_profile.json").read_text())
    assert sorted(prof["layers"]) == [f"l{i:02d}" for i in range(1, N_LAYERS + 1)]
    assert all(0.0 < v[0] <= 1.0 for v in prof["layers"].values())  # offset 0 = main diagonal
    for li, row in enumerate(table):
        ws = np.array([w[li] for w in per["windows"]], dtype=float)
        assert row["mu"] == pytest.approx(ws.mean(), abs=1e-6) and row["sigma"] == pytest.approx(ws.std(), abs=1e-6)


def test_windows_table_files_and_figures(windowed):
    out = windowed / "data" / "windows" / PAIR
    rows = list(csv.DictReader(io.StringIO((out / "table1.csv").read_text())))
    assert len(rows) == N_LAYERS and list(rows[0]) == ["layer", "mu", "sigma", "window", "cl_mean", "cl_std",
                                                       "attention", "n_sentences"]
    md = (out / "table1.md").read_text()
    assert "| layer | μ ± σ | w | CL |" in md and "paper μ ± σ" in md and md.count("\n| ") == N_LAYERS + 1
    flat = json.loads((windowed / "metrics" / "windows" / f"{PAIR}.json").read_text())
    assert sorted(flat["layers"]) == [f"l{i:02d}" for i in range(1, N_LAYERS + 1)]
    for name in ("fig1_spectrogram_contributions.png", "fig4_contributions.png"):
        assert _is_png(windowed / "plots" / "analysis" / PAIR / name)


def test_streaming_table_equals_the_table_from_all_matrices(windowed):
    """The stage keeps only windows and D(w) curves; the table equals the one computed from all
    matrices at once (lib.analysis.windows.window_table_from_matrices)."""
    ap = analysis_params({"analysis": ANALYSIS})
    prepared = windowed / "data" / "prepared" / PAIR
    ds = SpeechDataset(prepared, "train", "asr")
    model, _ = load_model(windowed / "runs" / "baseline" / PAIR / "seed1" / "model.pt")
    mats = [contribution_matrices(model, ds.features(i)) for i in choose_samples(len(ds), 8, ap.seed)]
    ref = window_table_from_matrices([[m[li] for m in mats] for li in range(N_LAYERS)], ap.threshold,
                                     full_layers=ap.full_layers, **ap.select_kwargs())
    res = json.loads((windowed / "data" / "windows" / PAIR / "windows.json").read_text())
    for got, want in zip(res["table"], ref):
        assert got["window"] == want["window"] and got["attention"] == want["attention"]
        for k in ("mu", "sigma", "cl_mean", "cl_std"):
            assert got[k] == pytest.approx(want[k], abs=1e-6)


# ------------------------------------------------------------------------------ errors and helpers


def test_missing_st_model_names_the_producing_stage(layout, tmp_path):
    paths = PairPaths.build(layout, PAIR, "data/prepared", 3)
    with pytest.raises(FileNotFoundError, match=r"runs/baseline/en-de/seed3/model.pt.*train_baseline"):
        select_windows_pair(paths, analysis_params({"analysis": ANALYSIS}), progress=False)


def test_analyze_missing_asr_model_fails_before_any_work(layout, tmp_path):
    from lib.analysis.pipeline import analyze_pair

    paths = PairPaths.build(tmp_path, PAIR, "prep", 1, st_model=layout / "runs" / "baseline" / PAIR / "seed1" / "model.pt")
    (tmp_path / "prep").symlink_to(layout / "data" / "prepared")
    with pytest.raises(FileNotFoundError, match=r"runs/asr/en-de/model.pt.*train_asr"):
        analyze_pair(paths, analysis_params({"analysis": ANALYSIS}), progress=False)
    assert not (tmp_path / "data" / "analysis").exists() and not (tmp_path / "metrics").exists()


def test_missing_prepared_split_names_the_prepare_stage(layout):
    ap = analysis_params({"analysis": {**ANALYSIS, "window_split": "nope"}})
    with pytest.raises(FileNotFoundError, match=r"nope.tsv.*prepare"):
        select_windows_pair(PairPaths.build(layout, PAIR, "data/prepared", 1), ap, progress=False)


def analysis_params(data: dict) -> AnalysisParams:
    return parse_section(AnalysisParams, data["analysis"], "analysis")


def test_analysis_params_are_validated():
    with pytest.raises(ParamError, match="analysis.st_seed: missing"):
        analysis_params({"analysis": {k: v for k, v in ANALYSIS.items() if k != "st_seed"}})
    with pytest.raises(ParamError, match=r"analysis\.width_rule"):
        analysis_params({"analysis": {**ANALYSIS, "width_rule": "3i"}})
    with pytest.raises(ParamError, match=r"analysis\.figure_sample"):
        analysis_params({"analysis": {**ANALYSIS, "figure_sample": 3}})
    with pytest.raises(ParamError, match=r"analysis\.bogus"):
        analysis_params({"analysis": {**ANALYSIS, "bogus": 1}})


def test_choose_samples_is_seeded_and_sorted():
    a = choose_samples(1000, 400, 7)
    assert a == choose_samples(1000, 400, 7) and a != choose_samples(1000, 400, 8)
    assert a == sorted(set(a)) and len(a) == 400 and a[-1] < 1000
    assert choose_samples(5, 400, 7) == list(range(5))


def test_figure_sentence_layer_tensors_are_per_utterance(layout):
    """A batch of one, no padding: every layer's attention rows sum to one."""
    ds = SpeechDataset(layout / "data" / "prepared" / PAIR, "tst-COMMON", "asr")
    model, _ = load_model(layout / "runs" / "asr" / PAIR / "model.pt")
    ut = layer_tensors(model, ds.features(0))
    for t in ut.layers:
        torch.testing.assert_close(t.attn.sum(-1), torch.ones(t.attn.shape[:2]))
