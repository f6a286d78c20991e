"""The report's smoothing section (lib/report/smoothing.py) on hand-made run outputs: the numbers in
the table and in metrics/summary.json come from the files, Δ is against the baseline of the same
seeds, the paper's claims are checked against them, and a missing run names its file and stage."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lib.decode.metrics import paired_bootstrap
from lib.layout import RunPaths, variant_figure
from lib.params.smoothing import SmoothingParams
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


def _system(bleu: list[float], definition: dict, diag: list[float], ent: list[float], base_diag: list[float],
            base_ent: list[float]) -> dict:
    """One system of :func:`lib.report.smoothing.collect`'s data, without files: per seed its metrics."""
    stats = attn(diag, ent, base_diag, base_ent)
    runs = [{"seed": seed, "p_value": 0.5, "metrics": {"bleu": b, "chrf": b + 10, **stats}}
            for seed, b in enumerate(bleu, start=1)]
    return {"runs": runs, "definition": definition}


ENC = {"prior": "prev", "recursive": True, "gamma": 0.1, "where": ["encoder"]}


def test_summary_chrf_is_the_systems_and_q6_needs_both_effects() -> None:
    """The flat chrF key is the system's mean (not the baseline's); Q6 ('less peaky') agrees only when the
    smoothed layers' diagonal weight falls *and* their row entropy rises."""
    from lib.report.smoothing import claims_markdown, table_markdown

    data = {"pair": "en-de", "baseline_bleu": [20.0, 22.0], "baseline_chrf": [40.0, 41.0], "systems": {
        # layers 2..3 (prev prior): diag 0.25 vs 0.40 falls, entropy 1.50 vs 1.55 falls too
        "rec": _system([21.0, 25.0], ENC, [0.5, 0.3, 0.2], [1.0, 1.4, 1.6], [0.5, 0.4, 0.4], [1.0, 1.5, 1.6])}}
    md, flat = table_markdown(data)
    assert flat["en-de/smooth_rec/chrf"] == 33.0 and flat["en-de/smooth_rec/bleu"] == 23.0
    assert (flat["en-de/smooth_rec/attn_entropy"], flat["en-de/smooth_rec/baseline_attn_entropy"]) == (1.5, 1.55)
    q6 = claims_markdown(data, flat).split("| Q6 |")[1].split("\n")[0]
    assert "`rec` diag 0.2500 vs 0.4000, entropy 1.500 vs 1.550 (disagrees)" in q6


def test_q3_compares_rec_pred_all_with_the_best_other_system() -> None:
    from lib.report.smoothing import claims_markdown, table_markdown

    stats = ([0.5, 0.3, 0.2], [1.0, 2.0, 2.5], [0.5, 0.4, 0.4], [1.0, 1.5, 1.6])
    every = {**ENC, "where": ["encoder", "decoder_self", "cross"]}
    data = {"pair": "en-de", "baseline_bleu": [20.0, 22.0], "baseline_chrf": [30.0, 32.0], "systems": {
        "rec": _system([24.0, 26.0], ENC, *stats), "prev": _system([18.0, 19.0], {**ENC, "recursive": False}, *stats),
        "rec_pred_all": _system([25.0, 26.0], {**every, "gamma": "predicted"}, *stats)}}
    _, flat = table_markdown(data)
    q3 = claims_markdown(data, flat).split("| Q3 |")[1].split("\n")[0]
    # rec_pred_all - rec = +1, 0 per seed: +0.50 with a t-interval (df 1) of 12.706 * 0.7071 / sqrt(2) = 6.35
    assert "best other system here: `rec` (25.00); `rec_pred_all` − `rec` = +0.50 [-5.85, +6.85] BLEU" in q3


def test_smoothed_layers_of_a_definition_without_the_encoder_are_every_encoder_layer() -> None:
    from lib.report.smoothing import smoothed_layers

    assert smoothed_layers({"prior": "prev", "recursive": True, "gamma": 0.1, "where": ["cross"]}, 3) == [1, 2, 3]
    assert smoothed_layers({"prior": "uniform", "gamma": 0.1, "where": ["decoder_self"]}, 4) == [1, 2, 3, 4]
    assert smoothed_layers(ENC, 3) == [2, 3]  # the prev prior smooths layers 2..L


def test_learned_band_cell_reads_the_centre_and_edge_logits() -> None:
    import math

    from lib.report.smoothing import learned_movement

    band = [-1.0] + [0.0] * 5 + [4.0] + [0.0] * 5 + [-3.0]  # k = 13: centre index 6
    rows = [{"metrics": {"band_logits": [band, None], "uniform_entropy": math.log(113)}},
            {"metrics": {"band_logits": [[x + 1.0 for x in band], None], "uniform_entropy": math.log(113)}}]
    cell, _ = learned_movement({"prior": "band", "k": 13}, rows)
    # centre (4 + 5) / 2; edges ((-1 - 3) / 2 + (0 - 2) / 2) / 2
    assert "logit centre +4.50, edges -1.50" in cell and "(k = 13, N = 113)" in cell
