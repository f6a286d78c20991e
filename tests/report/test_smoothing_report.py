"""The report's smoothing section (lib/report/smoothing.py) on hand-made run outputs: the numbers in
the table and in metrics/summary.json come from the files, Δ is against the baseline of the same
seeds, the paper's claims are checked against them, and a missing run names its file and stage."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lib.decode.metrics import paired_bootstrap
from lib.layout import RunPaths, variant_figure
from lib.params import SmoothingParams
from lib.report.smoothing import smoothing_section

REFS = ["a b c d", "e f g h", "i j k l", "m n o p"]
# each seed's baseline gets other sentences wrong, so a p-value against the baseline of the same seed
# differs from one against the references or against another seed's baseline
BASE_HYPS = {1: ["a b c d", "e f g x", "i j k l", "m n x x"], 2: ["a b x d", "e f g h", "i x k l", "m n o p"]}
REC_HYPS = ["a b c d", "e f g h", "x j k l", "m n o p"]


def write_run(run: RunPaths, bleu: float, hyps: list[str], **extra) -> None:
    run.metrics.parent.mkdir(parents=True, exist_ok=True)
    run.metrics.write_text(json.dumps({"bleu": bleu, "chrf": bleu + 10, **extra}))
    run.decoded.mkdir(parents=True, exist_ok=True)
    run.hyps().write_text("".join(h + "\n" for h in hyps))
    run.refs().write_text("".join(r + "\n" for r in REFS))


def attn(diag: list[float], ent: list[float], base_diag: list[float], base_ent: list[float], **more) -> dict:
    return {"attn_diag": diag, "attn_entropy": ent, "baseline_attn_diag": base_diag,
            "baseline_attn_entropy": base_ent, "uniform_entropy": 3.0, **more}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for seed, bleu in ((1, 20.0), (2, 22.0)):
        write_run(RunPaths(tmp_path, "baseline", "en-de", seed), bleu, BASE_HYPS[seed])
    stats = attn([0.5, 0.3, 0.2], [1.0, 2.0, 2.5], [0.5, 0.4, 0.4], [1.0, 1.5, 1.6])
    for seed, (rec, prev) in ((1, (21.0, 19.0)), (2, (25.0, 20.0))):
        write_run(RunPaths(tmp_path, "smoothing", "en-de", seed, variant="rec"), rec, REC_HYPS,
                  definition={"prior": "prev", "recursive": True, "gamma": 0.1, "where": ["encoder"]}, **stats)
        write_run(RunPaths(tmp_path, "smoothing", "en-de", seed, variant="prev"), prev, ["x"] * 4,
                  definition={"prior": "prev", "gamma": 0.1, "where": ["encoder"]}, **stats)
    return tmp_path


def test_table_summary_and_claims_come_from_the_files(root: Path) -> None:
    sp = SmoothingParams(systems=["rec", "prev"], pairs=["en-de"], seeds=[1, 2])
    md, flat = smoothing_section(root, sp)
    # baseline 21.00 ± 1.41; rec 23.00 ± 2.83 (Δ +2.00); prev 19.50 (Δ -1.50)
    assert "| baseline | full attention | 21.00 ± 1.41 |" in md
    # Δ per seed +1, +3: mean +2, t-interval 12.706 · 1.414 / √2 = 12.71 wide on each side
    assert "| rec |" in md and "| 23.00 ± 2.83 | 33.00 | +2.00 [-10.71, +14.71] |" in md
    assert flat["en-de/smooth_rec/bleu"] == 23.0 and flat["en-de/smooth_rec/delta_bleu"] == 2.0
    assert flat["en-de/smooth_rec/delta_bleu_ci95"] == pytest.approx(12.71)
    assert flat["en-de/smooth_prev/bleu"] == 19.5 and flat["en-de/smooth_prev/bleu_std"] == pytest.approx(0.71)
    # diag/entropy averaged over the smoothed layers only (prev prior: layers 2..3)
    assert flat["en-de/smooth_rec/attn_diag"] == 0.25 and flat["en-de/smooth_rec/baseline_attn_diag"] == 0.4
    assert flat["en-de/smooth_rec/attn_entropy"] == 2.25 and flat["en-de/smooth_rec/baseline_attn_entropy"] == 1.55
    # the paired bootstrap of each seed against the baseline hypotheses of that seed
    for name, hyps in (("rec", REC_HYPS), ("prev", ["x"] * 4)):
        p1, p2 = (paired_bootstrap(BASE_HYPS[k], hyps, REFS, n_samples=1000)["p_value"] for k in (1, 2))
        if name == "rec":  # the fixture tells the pairing apart from one against the refs or the other seed's
            wrong = {paired_bootstrap(REFS, hyps, REFS, n_samples=1000)["p_value"], p2}
            assert f"{p1:.3f}" not in {f"{w:.3f}" for w in wrong}
        assert f"{p1:.3f}, {p2:.3f} |" in md.split(f"| {name} |")[1].split("\n")[0]
    assert not [k for k in flat if "significant" in k]  # the per-sentence test stays in the table only
    # Q1 on the seeds: rec - prev = +2, +5: +3.50 with a t-interval (df 1) that holds 0: no verdict either way
    q1 = md.split("| Q1 |")[1].split("\n")[0]
    assert "`rec` − `prev` = +3.50 [-15.56, +22.56] BLEU" in q1 and "not shown: the interval over seeds holds 0" in q1
    q6 = md.split("| Q6 |")[1].split("\n")[0]
    assert "diag 0.2500 vs 0.4000, entropy 2.250 vs 1.550 (agrees)" in q6
    assert variant_figure(root, "smoothing", "en-de").stat().st_size > 0


def test_nothing_when_no_system_is_listed(root: Path) -> None:
    assert smoothing_section(root, SmoothingParams(systems=[])) == ("", {})


def test_a_missing_run_names_its_file_and_stage(root: Path) -> None:
    sp = SmoothingParams(systems=["rec"], pairs=["en-de"], seeds=[1, 3])
    with pytest.raises(FileNotFoundError, match=r"baseline/en-de/seed3.json: missing \(written by the train_baseline"):
        smoothing_section(root, sp)
    write_run(RunPaths(root, "baseline", "en-de", 3), 20.0, REFS)
    with pytest.raises(FileNotFoundError, match=r"smoothing/rec/en-de/seed3.json: missing .*train_smoothing@rec-en-de-3"):
        smoothing_section(root, sp)


def test_hypotheses_of_another_test_set_are_rejected(root: Path) -> None:
    RunPaths(root, "smoothing", "en-de", 1, variant="rec").refs().write_text("other\n" * 4)
    with pytest.raises(ValueError, match="not the same test set"):
        smoothing_section(root, SmoothingParams(systems=["rec"], pairs=["en-de"], seeds=[1, 2]))


def test_learned_movement_of_the_band_and_the_gate() -> None:
    """In-band mass of the band prior at the end vs its start and uniform, at N = exp(uniform entropy);
    the predicted gate's mean g vs its start."""
    import math

    from lib.report.smoothing import band_in_band_mass, band_start_logits, learned_movement

    assert band_in_band_mass([0.0] * 13, 110) == pytest.approx(13 / 110)
    assert band_in_band_mass([0.0] * 13, 110, "masked") == 1.0
    start = band_start_logits({"prior": "band", "k": 13})
    assert band_in_band_mass(start, 113) == pytest.approx(1300 / (1300 + 100))
    assert band_start_logits({"prior": "band", "k": 13, "base": "local"}) is None
    assert sum(x > 0 for x in band_start_logits({"prior": "band", "k": 13, "band_init_width": 5})) == 5
    rows = [{"metrics": {"band_logits": [[0.0] * 13, None], "uniform_entropy": math.log(113), "gate_mean": [None, None]}}]
    cell, flat = learned_movement({"prior": "band", "k": 13}, rows)
    assert flat["band_in_band_mass"] == pytest.approx(13 / 113, abs=1e-4)
    assert flat["band_in_band_mass_start"] == pytest.approx(0.9286, abs=1e-4) and "start 92.9%" in cell
    rows = [{"metrics": {"gate_mean": [None, 0.2, 0.3]}}]
    cell, flat = learned_movement({"prior": "prev", "gamma": "predicted", "recursive": True}, rows)
    assert flat == {"gate_mean": 0.25, "gate_start": 0.1} and "start 0.100" in cell
