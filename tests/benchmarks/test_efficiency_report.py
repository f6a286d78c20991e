"""Fast tests of benchmarks/efficiency_report.py (the FLOP model, metrics, Markdown and plot) and
of the benchmark's ``efficiency`` params (lib.params.EfficiencyParams).

No timing is run or asserted here; the benchmark results are synthetic dicts of the shape that
benchmarks/encoder_efficiency.py returns.
"""
from __future__ import annotations

import json
import math

import pytest

import yaml

from benchmarks import efficiency_report as eff
from lib.model.local_attention import (
    choose_block_size,
)
from lib.params import EfficiencyParams, ParamError, parse_section

D, F = 256, 2048
DIMS = eff.EncoderDims(D, F, 4)


# ----------------------------------------------------------------------------------------------- FLOPs


def test_layer_macs_counts_projections_ffn_and_attention() -> None:
    n = 100
    full = eff.layer_macs({"type": "full"}, n, DIMS)
    assert full["proj"] == 4 * n * D * D
    assert full["ffn"] == 2 * n * D * F
    assert full["attn"] == 2 * n * n * D
    assert full["total"] == full["proj"] + full["ffn"] + full["attn"]
    local = eff.layer_macs({"type": "local", "window": 13}, n, DIMS)
    assert local["attn"] == 2 * n * 13 * D and local["proj"] == full["proj"] and local["ffn"] == full["ffn"]


def test_attention_keys_ideal_and_implementation() -> None:
    assert eff.attention_keys({"type": "full"}, 50) == 50
    assert eff.attention_keys({"type": "local", "window": 13}, 1052) == 13
    assert eff.attention_keys({"type": "local", "window": 99}, 50) == 50  # capped at N
    # implementation: the blocked kernel scores blk + w - 1 keys per query
    for n, w in [(166, 5), (1052, 13), (512, 25)]:
        blk = choose_block_size(n, w)
        assert eff.attention_keys({"type": "local", "window": w}, n, implementation=True) == blk + w - 1
    # w >= 2N - 1 dispatches to SDPA: full cost
    assert eff.attention_keys({"type": "local", "window": 99}, 50, implementation=True) == 50
    with pytest.raises(ValueError, match="no FLOP model"):
        eff.attention_keys({"type": "smoothed"}, 10)


def test_all_full_bound_is_one_and_bound_grows_with_n() -> None:
    assert eff.encoder_speedup_bound(eff.full_spec(), 1052) == pytest.approx(1.0)
    bounds = [eff.encoder_speedup_bound(eff.paper_spec(), n) for n in (166, 512, 1052, 4000)]
    assert bounds == sorted(bounds) and bounds[0] > 1.0


def test_paper_bound_matches_closed_form_and_rough_estimates() -> None:
    n = 1052
    per_layer_dense = 4 * n * D * D + 2 * n * D * F
    full = 12 * (per_layer_dense + 2 * n * n * D)
    local = 12 * per_layer_dense + 3 * 2 * n * n * D + sum(2 * n * w * D for w in eff.PAPER_EN_DE_WINDOWS)
    assert eff.encoder_speedup_bound(eff.paper_spec(), n, DIMS) == pytest.approx(full / local)
    # by hand: ~1.3x at N = 1052 and ~1.0x at N = 166 for the paper's windows (attention is a small share)
    assert 1.25 < eff.encoder_speedup_bound(eff.paper_spec(), 1052) < 1.32
    assert 1.0 < eff.encoder_speedup_bound(eff.paper_spec(), 166) < 1.06


def test_implementation_bound_is_below_ideal() -> None:
    for n in (166, 512, 1052):
        ideal = eff.encoder_speedup_bound(eff.paper_spec(), n)
        impl = eff.encoder_speedup_bound(eff.paper_spec(), n, implementation=True)
        assert 1.0 < impl < ideal


def test_elementwise_ops_are_negligible_against_macs() -> None:
    for n in (166, 1052):
        macs = eff.encoder_macs(eff.full_spec(), n, DIMS)["total"]
        assert eff.elementwise_ops(eff.full_spec(), n, DIMS) / macs < 0.02


def test_op_score_fractions() -> None:
    assert eff.op_score_fraction(1052, 13) == pytest.approx(13 / 1052)
    assert eff.op_score_fraction(10, 25) == 1.0
    blk = choose_block_size(1052, 13)
    assert eff.op_score_fraction_impl(1052, 13) == pytest.approx((blk + 12) / 1052)


# ----------------------------------------------------------------------------------------------- specs


def test_paper_windows_match_table1_and_spec() -> None:
    from lib.paper import WINDOW_TABLES as PAPER_TABLES

    assert eff.PAPER_EN_DE_WINDOWS == tuple(r[3] for r in PAPER_TABLES["en-de"][3:])
    spec = eff.paper_spec()
    assert len(spec) == 12 and all(s == {"type": "full"} for s in spec[:3])
    assert [s["window"] for s in spec[3:]] == list(eff.PAPER_EN_DE_WINDOWS)
    assert eff.spec_summary(spec) == "F F F 5 5 9 13 11 15 19 17 21"


def test_load_windows_json(tmp_path) -> None:
    assert eff.load_windows_json(tmp_path / "absent.json") is None
    good = tmp_path / "windows.json"
    specs = [{"type": "full"}] * 3 + [{"type": "local", "window": 3}] * 9
    good.write_text(json.dumps({"encoder_attention": specs, "pair": "en-de"}))
    assert eff.load_windows_json(good) == specs
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"encoder_attention": specs[:5]}))
    with pytest.raises(ValueError, match="5 layer specs"):
        eff.load_windows_json(bad)
    (tmp_path / "none.json").write_text("{}")
    with pytest.raises(ValueError, match="encoder_attention"):
        eff.load_windows_json(tmp_path / "none.json")


# ----------------------------------------------------------------------------------------------- params


def _efficiency(data: dict) -> EfficiencyParams:
    return parse_section(EfficiencyParams, data, "efficiency")


def test_params_defaults_and_validation() -> None:
    p = _efficiency({})
    assert p == EfficiencyParams()
    assert p.lengths == [166, 512, 1052] and p.op_windows == [5, 13, 25] and not p.quick
    p = _efficiency({"quick": True, "lengths": [64]})
    assert p.quick and p.lengths == [64] and p.pair == "en-de"
    with pytest.raises(ParamError, match="efficiency.op_windows"):
        _efficiency({"op_windows": [4]})
    with pytest.raises(ParamError, match="efficiency.reps"):
        _efficiency({"reps": 3})
    with pytest.raises(ParamError, match="efficiency.lengths"):
        _efficiency({"lengths": "166"})
    with pytest.raises(ParamError, match="efficiency.pair"):
        _efficiency({"pair": "de-en"})


def test_benchmark_settings_from_params_and_cli(tmp_path) -> None:
    """encoder_efficiency.py reads ``load_params(...).efficiency``; options given override it."""
    import argparse

    from benchmarks import encoder_efficiency as bench
    from lib.params import load_params

    root_params = bench.ROOT / "params.yaml"
    raw = yaml.safe_load(root_params.read_text(encoding="utf-8"))
    raw.pop("efficiency", None)
    absent = tmp_path / "absent.yaml"
    absent.write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert load_params(absent).efficiency == EfficiencyParams()

    raw["efficiency"] = {"quick": True, "lengths": [64, 128], "op_reps": 2}
    given = tmp_path / "params.yaml"
    given.write_text(yaml.safe_dump(raw), encoding="utf-8")
    none = argparse.Namespace(pair=None, ns=None, op_windows=None, op_reps=None, encoder_reps=None, quick=None)
    s = bench.settings(none, given)
    assert s == EfficiencyParams(quick=True, lengths=[64, 128], op_reps=2)
    cli = argparse.Namespace(**{**vars(none), "ns": [32], "quick": False, "pair": "en-es"})
    s = bench.settings(cli, given)
    assert s.lengths == [32] and s.quick is False and s.pair == "en-es" and s.op_reps == 2

    raw["efficiency"] = {"op_windows": [4]}
    given.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ParamError, match="efficiency.op_windows"):
        bench.settings(none, given)


# ----------------------------------------------------------------------------------------------- metrics


def _t(ms: float) -> dict:
    return {"median_ms": ms, "min_ms": ms, "samples_ms": [ms]}


def _op_row(n: int, w: int, sdpa: float, local: float, mem_sdpa: int, mem_local: int, mem_mat: int) -> dict:
    def m(t, mem):
        return {"fwd": _t(t / 3), "fwdbwd": _t(t), "mem": {"fwd_bytes": mem // 3, "fwdbwd_bytes": mem}}

    return {"N": n, "w": w, "blk": choose_block_size(n, w), "score_bound": w / n, "score_actual": 0.0,
            "sdpa": m(sdpa, mem_sdpa), "sdpa_band": m(sdpa * 1.1, mem_sdpa), "material": m(sdpa * 2, mem_mat),
            "local": m(local, mem_local)}


def _enc_row(n: int, cfg: str, fb: float, mem: int | None = 100 * eff.MIB) -> dict:
    return {"N": n, "config": cfg, "fwd": _t(fb / 3), "fwdbwd": _t(fb),
            "mem": None if mem is None else {"fwd_bytes": mem // 10, "fwdbwd_bytes": mem}}


def _result(*, op_fast: bool = True, enc_frac: float = 1.0) -> dict:
    mib = eff.MIB
    b1052 = eff.encoder_speedup_bound(eff.paper_spec(), 1052)
    b166 = eff.encoder_speedup_bound(eff.paper_spec(), 166)
    return {
        "meta": {"threads": 2, "batch": 8, "d_model": D, "ffn_dim": F, "heads": 4, "op_reps": 3,
                 "encoder_reps": 2, "loadavg_start": [0.5, 0.4, 0.3], "loadavg_end": [1.0, 0.5, 0.3],
                 "seconds": 12.0, "method_notes": ["time: median"], "torch": "x", "cpu": "y", "cpu_count": 2},
        "op": [_op_row(166, 13, 10.0, 8.0 if op_fast else 12.0, 10 * mib, 12 * mib, 40 * mib),
               _op_row(1052, 13, 800.0, 100.0 if op_fast else 200.0, 100 * mib, 150 * mib, 900 * mib)],
        "encoder": {
            "configs": {"full": eff.full_spec(), "paper": eff.paper_spec()},
            "notes": ["own windows: absent, skipped"],
            "rows": [_enc_row(166, "full", 1000.0, None), _enc_row(166, "paper", 1000.0 / (b166 * enc_frac), None),
                     _enc_row(1052, "full", 8000.0, 2000 * mib),
                     _enc_row(1052, "paper", 8000.0 / (b1052 * enc_frac), 1800 * mib)],
        },
    }


def test_flat_metrics_names_ratios_by_n_and_w() -> None:
    m = eff.flat_metrics(_result())
    assert m["op_fwdbwd_speedup_N1052_w13"] == pytest.approx(8.0)
    assert m["op_fwd_speedup_N1052_w13"] == pytest.approx(8.0)
    assert m["op_fwdbwd_speedup_N166_w13"] == pytest.approx(1.25)
    assert m["op_bound_N1052_w13"] == pytest.approx(1052 / 13, rel=1e-3)
    assert m["op_mem_fwdbwd_local_over_sdpa_N1052_w13"] == pytest.approx(1.5)
    assert m["op_mem_fwdbwd_material_over_local_N1052_w13"] == pytest.approx(6.0)
    b = eff.encoder_speedup_bound(eff.paper_spec(), 1052)
    assert m["encoder_fwdbwd_speedup_paper_N1052"] == pytest.approx(b, rel=1e-3)
    assert m["encoder_fwdbwd_bound_paper_N1052"] == pytest.approx(b, rel=1e-3)
    assert m["encoder_fwd_bound_paper_N1052"] == m["encoder_fwdbwd_bound_paper_N1052"]
    assert m["encoder_fraction_of_bound_paper_N1052"] == pytest.approx(1.0, abs=1e-3)
    assert m["encoder_mem_fwdbwd_mib_paper_N1052"] == pytest.approx(1800)
    assert "encoder_mem_fwdbwd_mib_paper_N166" not in m  # memory not measured there
    assert "encoder_fwdbwd_speedup_full_N1052" not in m
    assert m["target_op_fwdbwd_speedup_N1052_w13"] is True
    assert m["meta_threads"] == 2 and m["meta_loadavg_start_1min"] == 0.5
    # flat: every value a scalar
    assert all(isinstance(v, (int, float, bool)) for v in m.values())


def test_targets_met_and_missed() -> None:
    met = {t["key"]: t["met"] for t in eff.evaluate_targets(_result())}
    assert met == {"op_fwdbwd_speedup_N1052_w13": True, "op_not_slower_N166": True,
                   "op_mem_vs_sdpa_N1052_w13": True, "op_mem_vs_material_N1052_w13": True,
                   "encoder_fraction_of_bound_paper_N1052": True, "encoder_fraction_of_bound_paper_N166": True}
    missed = {t["key"]: t["met"] for t in eff.evaluate_targets(_result(op_fast=False, enc_frac=0.9))}
    assert missed["op_fwdbwd_speedup_N1052_w13"] is False  # 4x < 6x
    assert missed["op_not_slower_N166"] is False
    assert missed["encoder_fraction_of_bound_paper_N1052"] is False
    assert missed["op_mem_vs_sdpa_N1052_w13"] is True  # memory unchanged


def test_targets_not_measured_are_none() -> None:
    r = _result()
    r["op"] = [row for row in r["op"] if row["N"] == 166]
    r["encoder"]["rows"] = [row for row in r["encoder"]["rows"] if row["N"] == 166]
    t = {x["key"]: x for x in eff.evaluate_targets(r)}
    assert t["op_fwdbwd_speedup_N1052_w13"]["met"] is None
    assert t["op_mem_vs_sdpa_N1052_w13"]["met"] is None
    assert t["encoder_fraction_of_bound_paper_N1052"]["met"] is None
    assert t["encoder_fraction_of_bound_paper_N166"]["met"] is True


def test_markdown_report_tables() -> None:
    md = eff.markdown_report(_result(op_fast=False))
    assert md.startswith("# Efficiency of local attention")
    assert "| 1052 | 13 |" in md and "| 1052 | paper |" in md and "| 166 | full |" in md
    assert "F F F 5 5 9 13 11 15 19 17 21" in md
    assert "own windows: absent, skipped" in md
    assert "start 0.50/0.40/0.30" in md
    assert "**no**" in md and "**yes**" in md
    # every table row has as many cells as its header
    for block in md.split("\n\n"):
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        if rows:
            assert len({ln.count("|") for ln in rows}) == 1, block


def test_plot_and_write_outputs(tmp_path) -> None:
    res = _result()
    paths = eff.write_outputs(res, metrics=tmp_path / "m.json", md=tmp_path / "m.md",
                              plot=tmp_path / "plots" / "time_vs_N.png", raw=tmp_path / "raw.json")
    assert [p.name for p in paths] == ["m.json", "m.md", "time_vs_N.png", "raw.json"]
    assert (tmp_path / "plots" / "time_vs_N.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["op_fwdbwd_speedup_N1052_w13"] == pytest.approx(8.0)
    assert json.loads((tmp_path / "raw.json").read_text())["meta"]["threads"] == 2
    leftovers = [p.name for p in tmp_path.rglob("*") if ".tmp" in p.name]
    assert leftovers == []


def test_plot_without_data_returns_none(tmp_path) -> None:
    assert eff.plot_time_vs_n({"meta": {}, "op": [], "encoder": {"configs": {}, "rows": []}},
                               tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()


def test_ratio_guard() -> None:
    assert eff._ratio(1.0, 0.0) == math.inf


def test_load_warnings() -> None:
    quiet = _result()
    for row in quiet["encoder"]["rows"]:
        row["cpu_share"] = 0.97
    assert eff.load_warnings(quiet) == []
    md = eff.markdown_report(quiet)
    assert "busy machine" not in md and "N=1052: 97%" in md
    assert eff.flat_metrics(quiet)["meta_encoder_cpu_share_N1052"] == 0.97

    busy = _result()
    busy["meta"]["loadavg_start"] = [3.2, 2.0, 1.0]
    for row in busy["encoder"]["rows"]:
        row["cpu_share"] = 0.6 if row["N"] == 1052 else 0.95
    warn = eff.load_warnings(busy)
    assert len(warn) == 2 and "3.20" in warn[0] and "60% at N=1052" in warn[1]
    assert "**Warning: timings taken on a busy machine**" in eff.markdown_report(busy)
