"""scripts/health_draws.py: Algorithm 1's windows and the band per layer over several draws."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import health_draws  # noqa: E402


def _health(windows: list[int], band: list[float], cii: list[float]) -> dict:
    """A health metrics dict of a 5-layer model with full_layers 2 (windows for layers 3-5)."""
    layers = {f"l{i:02d}": {"band2": 1.0, "c_ii": 0.9} for i in (1, 2)}
    for i, (b, c) in enumerate(zip(band, cii), start=3):
        layers[f"l{i:02d}"] = {"band2": b, "c_ii": c, "attn_ratio": 1.0 - c}
    return {"algorithm1_windows": " ".join(map(str, windows)), "layers": layers}


def test_summarize_draws_by_hand() -> None:
    draws = {"a": _health([1, 3, 5], [2.0, 3.0, 4.0], [0.8, 0.7, 0.6]),
             "b": _health([3, 3, 1], [4.0, 3.0, 2.0], [0.6, 0.7, 0.8])}
    s = health_draws.summarize_draws(draws)
    assert s["layers"] == [3, 4, 5]
    assert s["draws"]["a"] == {"windows": [1, 3, 5], "ge3": 2, "rho": pytest.approx(1.0),
                               "c_ii_mean": pytest.approx(0.7), "band2_mean": pytest.approx(3.0),
                               "rho_attn": pytest.approx(1.0)}  # attn_ratio 0.2 0.3 0.4 against 1 3 5
    # b: windows 3 3 1 (ranks 2.5 2.5 1) against attn_ratio 0.4 0.3 0.2 (ranks 3 2 1)
    assert s["draws"]["b"]["rho_attn"] == pytest.approx(0.8660254)
    assert s["draws"]["b"]["rho"] == pytest.approx(-0.8660254)  # ranks 2.5 2.5 1 against 1 2 3
    assert s["mean_window"] == [2.0, 3.0, 3.0]
    assert s["median_window"] == [2.0, 3.0, 3.0]
    assert s["share_ge3"] == [0.5, 1.0, 0.5]
    assert s["mean_band2"] == [3.0, 3.0, 3.0] and s["rho_mean_band2"] == 0.0  # a constant profile
    assert s["mean_c_ii"] == pytest.approx([0.7, 0.7, 0.7]) and s["rho_mean_c_ii"] == 0.0
    assert s["mean_attn_ratio"] == pytest.approx([0.3, 0.3, 0.3])
    assert s["rho_mean_window"] == pytest.approx(0.8660254)
    assert s["rho_per_draw_mean"] == pytest.approx((1.0 - 0.8660254) / 2)


def test_draws_of_different_depth_are_refused() -> None:
    h = _health([1, 3, 5], [2.0, 3.0, 4.0], [0.8, 0.7, 0.6])
    short = {**h, "algorithm1_windows": "1 3"}
    with pytest.raises(ValueError, match="'b' has 2 windows, the first draw 3"):
        health_draws.summarize_draws({"a": h, "b": short})


def test_cli_reads_files_and_writes_the_table(tmp_path: Path, capsys, monkeypatch) -> None:
    paths = []
    for name, w in (("x", [1, 3, 5]), ("y", [1, 5, 9])):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(_health(w, [2.0, 3.0, 4.0], [0.8, 0.7, 0.6])))
        paths.append(f"draw {name}={p}" if name == "x" else str(p))
    md = tmp_path / "out.md"
    monkeypatch.setattr(sys, "argv", ["health_draws.py", *paths, "--md", str(md)])
    health_draws.main()
    out = capsys.readouterr().out
    assert out == md.read_text()
    assert "| draw x | 1 | 3 | 5 |" in out
    assert "| mean window (2 draws) | 1.0 | 4.0 | 7.0 | | +1.00 (of the mean profile) | | |" in out


def test_unknown_experiment_is_named(monkeypatch) -> None:
    monkeypatch.setattr(health_draws.subprocess, "run", lambda *a, **k: type("R", (), {"stdout": "refs/exps/ab/cd/other\n"})())
    with pytest.raises(SystemExit, match="0 DVC experiments named 'nope'.*known: \\['other'\\]"):
        health_draws.experiment_ref("nope")


def test_draws_without_attn_ratio_print_a_dash() -> None:
    h = _health([1, 3, 5], [2.0, 3.0, 4.0], [0.8, 0.7, 0.6])
    for k in h["layers"]:
        h["layers"][k].pop("attn_ratio", None)
    s = health_draws.summarize_draws({"old": h})
    assert s["draws"]["old"]["rho_attn"] != s["draws"]["old"]["rho_attn"]  # NaN
    row = [line for line in health_draws.markdown(s).splitlines() if line.startswith("| old |")][0]
    assert row.endswith("| – |")


def test_per_draw_only_has_no_summary_rows() -> None:
    s = health_draws.summarize_draws({"a": _health([1, 3, 5], [2.0, 3.0, 4.0], [0.8, 0.7, 0.6]),
                                      "b": _health([3, 3, 1], [4.0, 3.0, 2.0], [0.6, 0.7, 0.8])})
    lines = health_draws.markdown(s, per_draw_only=True).splitlines()
    assert [line.split(" |")[0] for line in lines[2:]] == ["| a", "| b"]
    assert "mean window" in health_draws.markdown(s)
