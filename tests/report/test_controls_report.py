"""The report's controls for Algorithm 1 (lib/report/controls.py): the whole report is byte-identical to
the committed one when no control ran; with controls, Table 2 gains their rows (paired bootstrap against
the baseline and against local), the Δ BLEU and their 95 % t-intervals come from the files, the verdict
follows the interval; the band-test tables average the seeds' files; a missing run names its stage."""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import yaml

from lib.decode.metrics import paired_bootstrap
from lib.layout import RunPaths, band_test_metrics
from lib.params import load_params
from lib.report.controls import band_section
from lib.report.document import build_report

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report_fixture as rf  # noqa: E402

T_975_DF2 = 4.302652729  # Student's t, 97.5 % quantile, 2 degrees of freedom (tables)


def test_report_without_controls_is_byte_identical(tmp_path: Path) -> None:
    """Empty controls lists: the report and summary.json are the committed ones, byte for byte (built
    from the same hand-made inputs by the report code before the controls existed)."""
    md, flat = rf.build(rf.make_root(tmp_path))
    assert md == (rf.FIXTURES / "report_no_controls.md").read_text(encoding="utf-8")
    assert json.dumps(flat, indent=1) + "\n" == (rf.FIXTURES / "summary_no_controls.json").read_text(encoding="utf-8")


def _control_root(tmp_path: Path, band_seeds: list[int] | None = None) -> tuple[Path, dict]:
    root = rf.make_root(tmp_path)
    bleu = {}
    for pi, pair in enumerate(rf.PAIRS):
        for seed in rf.SEEDS:
            base = 20.0 + seed + pi
            # each seed's baseline with other sentences wrong (make_root's are the references), so a
            # p-value against the same seed's baseline differs from one against the refs or another seed's
            rf.write_run(root, "baseline", pair, seed, base, {1: 2, 2: 9, 3: 5}[seed])
            local = 19.5 + seed + pi + 0.25 * (seed % 2)
            for name, value, wrong in (("local_uniform", base + seed, 4), ("local_shuffled", local + 3 + 0.1 * (seed - 1), 3)):
                windows = [0, 0, 0] + ([7] * 9 if name == "local_uniform" else [13, 3, 1, 15, 5, 1, 3, 17, 3])
                rf.write_run(root, f"variants/controls/{name}", pair, seed, value, wrong, windows=windows,
                             algorithm1_windows=[0, 0, 0] + rf.ALG1)
                bleu[(pair, name, seed)] = value
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["controls"].update(systems=["local_uniform", "local_shuffled"], band_seeds=band_seeds or [])
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root, bleu


def test_control_rows_intervals_and_verdicts(tmp_path: Path) -> None:
    root, bleu = _control_root(tmp_path)
    md, flat = build_report(load_params(root / "params.yaml"), root)
    # Table 2 gains a row per control after `local`, its p column against both references
    pair, name = "en-de", "local_uniform"
    ps_base, ps_local = [], []
    for seed in rf.SEEDS:
        ours = RunPaths(root, "controls", pair, seed, variant=name).hyps().read_text().splitlines()
        for ref_system, ps in (("baseline", ps_base), ("local", ps_local)):
            theirs = RunPaths(root, ref_system, pair, seed).hyps().read_text().splitlines()
            ps.append(paired_bootstrap(theirs, ours, rf.REFS, n_samples=1000)["p_value"])
    refs_p = paired_bootstrap(rf.REFS, RunPaths(root, "controls", pair, 1, variant=name).hyps().read_text().splitlines(),
                              rf.REFS, n_samples=1000)["p_value"]
    assert len({f"{p:.3f}" for p in ps_base + [refs_p]}) == 4  # the fixture tells the pairings apart
    cell = ("vs baseline: " + ", ".join(f"{p:.3f}" for p in ps_base) + "; vs local: "
            + ", ".join(f"{p:.3f}" for p in ps_local))
    row = [line for line in md.splitlines() if line.startswith("| en-de | local_uniform |")]
    assert row[0] == f"| en-de | local_uniform | 24.00 [19.03, 28.97] | 2.00 | 44.00 [39.03, 48.97] | 3 |  | {cell} |"
    assert row[1] == "| en-de | local_uniform | 22.00 / 42.00 | 24.00 / 44.00 | 26.00 / 46.00 |"  # the per-seed table
    table2 = md.split("## Table 2")[1].split("**Reading")[0]
    assert table2.index("| en-de | local |") < table2.index("| en-de | local_uniform |") < table2.index("| en-it | baseline |")
    # Δ vs baseline: +1 +2 +3 -> 2 ± t(2) · 1 / √3; vs local: +1.25 +2.5 +3.25
    half = T_975_DF2 / math.sqrt(3)
    d_local = [bleu[(pair, name, s)] - (19.5 + s + 0.25 * (s % 2)) for s in rf.SEEDS]
    h_local = T_975_DF2 * statistics.stdev(d_local) / math.sqrt(3)
    m_local = statistics.fmean(d_local)
    line = [x for x in md.split("## Controls for Algorithm 1")[1].splitlines() if x.startswith("| local_uniform |")][0]
    assert line.startswith(f"| local_uniform | 7 7 7 7 7 7 7 7 7 (one width: ρ undefined) | 24.00 ± 2.00 | +2.00 [{2 - half:+.2f}, {2 + half:+.2f}] | "
                           f"{sum(p < 0.05 for p in ps_base)} of 3 | {m_local:+.2f} [{m_local - h_local:+.2f}, "
                           f"{m_local + h_local:+.2f}] | {sum(p < 0.05 for p in ps_local)} of 3 |")
    assert flat["en-de/local_uniform/delta_vs_baseline"] == 2.0
    assert flat["en-de/local_uniform/delta_vs_baseline_ci95"] == round(half, 2)
    assert flat["en-de/local_uniform/delta_vs_local_ci95"] == round(h_local, 2)
    assert flat["en-de/local_uniform/bleu"] == 24.0 and flat["en-de/local_uniform/bleu_ci95"] == 4.97
    assert not [k for k in flat if "significant" in k]  # the per-sentence test stays out of the headline
    # verdicts: the uniform interval holds 0; the shuffled one (+3.0 +3.1 +3.2 over local) lies above it
    assert "- en-de: `local_uniform` matches Algorithm 1's windows within the seed spread" in md
    assert "- en-de: `local_shuffled` beats Algorithm 1's windows: +3.10 [+2.85, +3.35] BLEU." in md
    assert "| local (Algorithm 1) | 1 1 3 5 3 15 17 3 13 (ρ +0.71) |" in md  # the draw: ρ +0.71
    assert "| local_shuffled | 13 3 1 15 5 1 3 17 3 (ρ +0.03) |" in md
    # the band-test part is absent without band seeds
    assert "Inference band test on every seed" not in md


def test_missing_control_run_names_its_stage(tmp_path: Path) -> None:
    root, _ = _control_root(tmp_path)
    (root / "metrics/variants/controls/local_shuffled/en-it/seed3.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"local_shuffled/en-it/seed3.json: missing \(written by the "
                                                r"train_control@local_shuffled-en-it-3 stage\)"):
        build_report(load_params(root / "params.yaml"), root)


def _band_result(pair: str, seed: int, acc: dict[str, float]) -> dict:
    windows = {"full": None, "w1": [1] * 9, "w3": [3] * 9, "w21": [21] * 9, "alg1": rf.ALG1, "uniform": [7] * 9,
               "shuffled": [13, 3, 1, 15, 5, 1, 3, 17, 3]}
    gap = acc["full"] - acc["w1"]
    rows = {name: {"windows": ws, "mean_window": None if ws is None else round(sum(ws) / 9, 4), "acc": acc[name],
                   "nll": 2.0 - acc[name] / 100, "gap_recovered": round((acc[name] - acc["w1"]) / gap, 6)}
            for name, ws in windows.items()}
    return {"pair": pair, "seed": seed, "band_split": "dev", "sentences": 10, "rows": dict(sorted(rows.items())),
            "order": list(windows)}  # as band_test_stage writes it: sorted keys, and the order


def test_band_section_averages_the_seeds(tmp_path: Path) -> None:
    for seed, shift in ((1, 0.0), (2, 2.0)):
        acc = {"full": 60 + shift, "w1": 40 + shift, "w3": 50 + shift, "w21": 59 + shift, "alg1": 54 + shift,
               "uniform": 55 + shift + 2 * (seed - 1), "shuffled": 53 + shift}
        path = band_test_metrics(tmp_path, "en-de", seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_band_result("en-de", seed, acc)))
    md, flat = band_section(tmp_path, ["en-de"], [1, 2])
    lines = md.splitlines()
    # Algorithm 1: 54, 56 -> 55.00 ± 1.41; gap (54-40)/20 = 70 % on both seeds
    assert "| Algorithm 1 | 1 1 3 5 3 15 17 3 13 | 6.78 | 55.00 ± 1.41 | 1.450 ± 0.014 | 70% ± 0% | 70%, 70% |" in lines
    # uniform: 55, 59 -> gap 75 %, 85 %
    assert "| uniform (rounded mean) | 7 in every layer | 7.00 | 57.00 ± 2.83 | 1.430 ± 0.028 | 80% ± 7% | 75%, 85% |" in lines
    assert "| full attention | all | – | 61.00 ± 1.41 | 1.390 ± 0.014 | 100% ± 0% | 100%, 100% |" in lines
    order = [line.split(" |")[0] for line in lines if line.startswith("| ") and "|---" not in line][1:]
    assert order == ["| full attention", "| w = 1", "| w = 3", "| w = 21", "| Algorithm 1", "| uniform (rounded mean)",
                     "| shuffled Algorithm 1"]  # the stage's order, not the file's sorted keys
    assert "The uniform (rounded mean) control is more accurate than Algorithm 1's windows on 2 of 2 baselines" in md
    assert "shuffled Algorithm 1 control is more accurate than Algorithm 1's windows on 0 of 2 baselines" in md
    assert "![band test en-de seed 2](../plots/variants/band_test/en-de/seed2.png)" in md
    assert flat["en-de/band_test/alg1/gap_recovered"] == 0.7 and "en-de/band_test/uniform/acc" not in flat
    assert band_section(tmp_path, ["en-de"], []) == ("", {})
    with pytest.raises(FileNotFoundError, match=r"band_test/en-de/seed3.json: missing \(written by the band_test@en-de-3"):
        band_section(tmp_path, ["en-de"], [1, 3])


def test_report_with_band_seeds_has_the_section(tmp_path: Path) -> None:
    root, _ = _control_root(tmp_path, band_seeds=[1, 2, 3])
    acc = {"full": 60.0, "w1": 40.0, "w3": 50.0, "w21": 59.0, "alg1": 54.0, "uniform": 55.0, "shuffled": 53.0}
    for pair in rf.PAIRS:
        for seed in rf.SEEDS:
            path = band_test_metrics(root, pair, seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(_band_result(pair, seed, acc)))
    md, flat = build_report(load_params(root / "params.yaml"), root)
    section = md.split("## Inference band test on every seed's ST baseline")[1]
    assert "### en-de" in section and "### en-it" in section and "en-it/band_test/w3/gap_recovered" not in flat
    assert md.index("## Controls for Algorithm 1") < md.index("## Inference band test") < md.index("## Table 1 (en-de)")


def test_an_archived_report_copies_its_experiments_figures_and_links_them_beside_itself(tmp_path: Path) -> None:
    """`stages/report.py --archive DIR`: the band-test figures (plots/variants/, not committed by the default
    pipeline) are copied into DIR and linked there; the default stages' figures are left out; the main
    report links every figure relative to reports/."""
    from lib.layout import band_test_plot, health_plot
    from lib.report.figures import Figures

    root, _ = _control_root(tmp_path, band_seeds=[1])
    acc = {"full": 60.0, "w1": 40.0, "w3": 50.0, "w21": 59.0, "alg1": 54.0, "uniform": 55.0, "shuffled": 53.0}
    for pair in rf.PAIRS:
        path = band_test_metrics(root, pair, 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_band_result(pair, 1, acc)))
        for png in (band_test_plot(root, pair, 1), health_plot(root, pair, "asr")):
            png.parent.mkdir(parents=True, exist_ok=True)
            png.write_bytes(b"\x89PNG fake " + pair.encode())
    p = load_params(root / "params.yaml")
    main, _ = build_report(p, root)
    assert "![band test en-de seed 1](../plots/variants/band_test/en-de/seed1.png)" in main
    assert "](../plots/health/en-de/asr.png)" in main
    out = root / "reports" / "controls"
    figures = Figures(root, out, archive=True)
    md, _ = build_report(p, root, figures)
    assert "![band test en-it seed 1](band_test_en-it_seed1.png)" in md and "plots/health" not in md
    assert (out / "band_test_en-it_seed1.png").read_bytes() == b"\x89PNG fake en-it"
    assert sorted(f.name for f in figures.copied) == ["band_test_en-de_seed1.png", "band_test_en-it_seed1.png"]


def test_controls_section_rows_and_summary_by_hand() -> None:
    """controls_section on hand-made scores (no files): the local row's Δ is local − baseline, each control's
    summary keys are its Δ against the baseline and against local, from the same seeds."""
    import dataclasses

    from lib.params import ControlsParams
    from lib.report.controls import ControlRun, controls_section
    from lib.report.tables import SystemScores

    p = load_params(rf.REPO / "params.yaml")
    p = dataclasses.replace(p, pairs=["en-de"], seeds=[1, 2, 3], controls=ControlsParams(systems=["local_uniform"]))
    base = SystemScores("en-de", "baseline", [1, 2, 3], [20.0, 21.0, 22.0], [40.0, 41.0, 42.0])
    local = SystemScores("en-de", "local", [1, 2, 3], [21.0, 21.0, 24.0], [41.0, 41.0, 44.0])
    uniform = SystemScores("en-de", "local_uniform", [1, 2, 3], [19.0, 20.0, 21.0], [39.0, 40.0, 41.0])
    run = ControlRun(uniform, [5, 5, 5], [1, 3, 5], [0.01, 0.2, 0.04], [0.3, 0.03, 0.5])
    sig = {"en-de": [{"p_value": 0.01}, {"p_value": 0.2}, {"p_value": 0.04}]}
    md, flat = controls_section(rf.REPO, p, [base, local], {"en-de": [run]}, sig)
    # local − baseline = +1, 0, +2: mean +1.00, t(2) · 1 / √3 = 2.48
    assert "| local (Algorithm 1) | 1 3 5 (ρ +1.00) | 22.00 ± 1.73 | +1.00 [-1.48, +3.48] | 2 of 3 | | |" in md
    # control − baseline = -1, -1, -1 (no spread); control − local = -2, -1, -3: -2.00 ± 2.48
    assert "| local_uniform | 5 5 5 (one width: ρ undefined) | 20.00 ± 1.00 | -1.00 [-1.00, -1.00] | 2 of 3 | " \
           "-2.00 [-4.48, +0.48] | 1 of 3 |" in md
    assert flat == {"en-de/local_uniform/delta_vs_baseline": -1.0, "en-de/local_uniform/delta_vs_local": -2.0,
                    "en-de/local_uniform/delta_vs_baseline_ci95": 0.0, "en-de/local_uniform/delta_vs_local_ci95": 2.48}
    assert ("- en-de: `local_uniform` matches Algorithm 1's windows within the seed spread: -2.00 [-4.48, +0.48] "
            "BLEU") in md


def test_windows_cell_of_one_layer_and_of_one_width() -> None:
    from lib.report.controls import _windows_cell

    assert _windows_cell([5]) == "5"  # one local layer: no ρ, and not "one width" either
    assert _windows_cell([7, 7, 7]) == "7 7 7 (one width: ρ undefined)"
    assert _windows_cell([3, 1, 5]) == "3 1 5 (ρ +0.50)"


def test_band_section_counts_a_tie_as_not_more_accurate_and_keeps_the_three_headline_gaps(tmp_path: Path) -> None:
    for seed, uniform in ((1, 54.0), (2, 57.0)):  # seed 1: uniform ties Algorithm 1 (54); seed 2: above it
        acc = {"full": 60.0, "w1": 40.0, "w3": 50.0, "w21": 59.0, "alg1": 54.0, "uniform": uniform, "shuffled": 52.0}
        path = band_test_metrics(tmp_path, "en-de", seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_band_result("en-de", seed, acc)))
    md, flat = band_section(tmp_path, ["en-de"], [1, 2])
    assert "The uniform (rounded mean) control is more accurate than Algorithm 1's windows on 1 of 2 baselines" in md
    # gaps: alg1 (54 - 40) / 20 = 70 %; uniform 70 %, 85 %; shuffled 60 %
    assert flat == {"en-de/band_test/alg1/gap_recovered": 0.7, "en-de/band_test/uniform/gap_recovered": 0.775,
                    "en-de/band_test/shuffled/gap_recovered": 0.6}
