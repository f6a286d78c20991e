"""End-to-end: the variants and the ASR modes through `dvc exp run`, on a tiny demo corpus in a temporary
copy of the repository (a copy of the session's tiny `make repro`, its own, so that pytest-xdist runs this
file beside tests/test_pipeline.py).

Each variant trains only its own stages and leaves the baselines' outputs as they were.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.dvc_repo import TINY, TRAIN_TINY, tiny_repo_copy
from tests.dvc_repo import run as _run


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    return tiny_repo_copy(tmp_path_factory)


@pytest.mark.slow
def test_exp_run_with_local_asr_pretraining(tiny_repo: Path) -> None:
    """local.asr_pretraining=local: ASR is pretrained with the local spec; the baseline is untouched."""
    import torch

    baseline_asr = (tiny_repo / "runs/asr/en-de/model.pt").read_bytes()
    out = _run(["dvc", "exp", "run", "-S", "local.asr_pretraining=local"], tiny_repo).stdout
    assert "Running stage 'train_asr_local@en-de'" in out and "Running stage 'train_local@en-de-1'" in out
    assert "Running stage 'train_asr@en-de'" not in out and "Running stage 'train_baseline@en-de-1'" not in out
    assert (tiny_repo / "runs/asr/en-de/model.pt").read_bytes() == baseline_asr
    for pair in TINY["pairs"]:
        m = json.loads((tiny_repo / "metrics/asr_local" / f"{pair}.json").read_text())
        assert m["asr_pretraining"] == "local" and m["updates"] == TRAIN_TINY["max_updates"]
        model = torch.load(tiny_repo / "runs/asr_local" / pair / "model.pt", weights_only=True)
        windows = json.loads((tiny_repo / "data/windows" / pair / "windows.json").read_text())
        assert model["model_config"]["encoder_attention"] == windows["encoder_attention"]
    report = (tiny_repo / "reports/report.md").read_text()
    assert "`local.asr_pretraining: local`" in report


@pytest.mark.slow
def test_exp_run_with_smoothing_systems(tiny_repo: Path) -> None:
    """docs/variants.md: `dvc exp run -S smoothing.systems=[...]` trains only the smoothed
    systems (from the baseline's ASR model, or a smoothed one for asr_systems), measures the attention's
    peakiness against the baseline of the same seed, and the report adds the table, figure and flat keys."""
    import torch

    baseline = (tiny_repo / "metrics/baseline/en-de/seed1.json").read_text()
    out = _run(["dvc", "exp", "run", "-S", "smoothing.systems=[rec_pred_all,band]", "-S", "smoothing.seeds=[1]",
                "-S", "smoothing.asr_systems=[rec_pred_all]"], tiny_repo).stdout
    ran = sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage"))
    assert ran == ["report", "train_asr_smoothing@rec_pred_all-en-de", "train_smoothing@band-en-de-1",
                   "train_smoothing@rec_pred_all-en-de-1"], out
    assert (tiny_repo / "metrics/baseline/en-de/seed1.json").read_text() == baseline
    n_layers = TINY["model"]["overrides"]["encoder_layers"]
    for system in ("rec_pred_all", "band"):
        m = json.loads((tiny_repo / f"metrics/variants/smoothing/{system}/en-de/seed1.json").read_text())
        # the workspace's train_st (an earlier test's `dvc exp run -S` may have changed it), as the baseline's
        st_updates = yaml.safe_load((tiny_repo / "params.yaml").read_text())["train_st"]["max_updates"]
        assert m["updates"] == st_updates and 0 <= m["bleu"] <= 100
        for key in ("attn_diag", "attn_entropy", "baseline_attn_diag", "baseline_attn_entropy"):
            assert len(m[key]) == n_layers and all(v >= 0 for v in m[key]), key
        model = torch.load(tiny_repo / f"runs/variants/smoothing/{system}/en-de/seed1/model.pt", weights_only=True)
        specs = model["model_config"]["encoder_attention"]
        assert [s["type"] for s in specs] == (["full"] + ["smooth"] * (n_layers - 1) if system == "rec_pred_all"
                                              else ["smooth"] * n_layers)
        assert (model["model_config"].get("cross_attention") is not None) == (system == "rec_pred_all")
    rec = json.loads((tiny_repo / "metrics/variants/smoothing/rec_pred_all/en-de/seed1.json").read_text())
    assert rec["gate_mean"][0] is None and all(0 < g < 1 for g in rec["gate_mean"][1:])
    band = json.loads((tiny_repo / "metrics/variants/smoothing/band/en-de/seed1.json").read_text())
    assert all(len(b) == 13 for b in band["band_logits"])
    # the same baseline measured by both runs
    assert rec["baseline_attn_diag"] == band["baseline_attn_diag"]
    assert json.loads((tiny_repo / "metrics/variants/smoothing_asr/rec_pred_all/en-de.json").read_text())["wer"] >= 0
    report = (tiny_repo / "reports/report.md").read_text()
    section = report.split("## Attention smoothing with priors (Maekaku et al.)")[1]
    assert "| rec_pred_all |" in section and "| band |" in section and "| Q6 |" in section
    assert (tiny_repo / "plots/variants/smoothing/en-de.png").stat().st_size > 0
    summary = json.loads((tiny_repo / "metrics/summary.json").read_text())
    assert {"en-de/smooth_band/bleu", "en-de/smooth_rec_pred_all/delta_bleu"} <= set(summary)
    assert summary["en-de/smooth_band/bleu"] == band["bleu"]
    assert "Running stage" not in _run(["dvc", "repro"], tiny_repo).stdout


@pytest.mark.slow
def test_exp_run_with_multilingual_head_selection(tiny_repo: Path) -> None:
    """docs/variants.md: `dvc exp run -S multi.systems=[baseline,group]` trains one
    multilingual model per system over the tiny repo's two pairs (from the en-de ASR model), decodes
    each pair, writes the selections and heatmaps, and the report adds the table and flat keys; the
    bilingual runs are untouched."""
    import torch

    baseline = (tiny_repo / "metrics/baseline/en-de/seed1.json").read_text()
    out = _run(["dvc", "exp", "run", "-S", "multi.systems=[baseline,group]", "-S", "multi.max_updates=4",
                "-S", "multi.head_selection.anneal_updates=4"], tiny_repo).stdout
    ran = sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage"))
    assert ran == ["report", "train_multi@baseline-1", "train_multi@group-1"], out
    assert (tiny_repo / "metrics/baseline/en-de/seed1.json").read_text() == baseline
    tasks = json.loads((tiny_repo / "data/prepared_multi/tasks.json").read_text())
    assert tasks["pairs"] == TINY["pairs"] and tasks["tag_ids"] == [4, 5]
    n_layers = TINY["model"]["overrides"]["encoder_layers"]
    for system in ("baseline", "group"):
        m = json.loads((tiny_repo / f"metrics/variants/multi/{system}/seed1.json").read_text())
        assert m["updates"] == 4 and set(TINY["pairs"]) <= set(m)
        assert m["avg_bleu"] == round(sum(m[p]["bleu"] for p in TINY["pairs"]) / 2, 2)
        decoded = tiny_repo / f"data/decoded/variants/multi/{system}/seed1"
        for pair in TINY["pairs"]:
            hyps = (decoded / f"hyps.{pair}.tst-COMMON.txt").read_text().splitlines()
            refs = (decoded / f"refs.{pair}.tst-COMMON.txt").read_text().splitlines()
            assert len(hyps) == len(refs) == m[pair]["sentences"] > 0
            assert not any("<lang:" in h for h in hyps)
        selection = json.loads((decoded / "selection.json").read_text())
        model = torch.load(tiny_repo / f"runs/variants/multi/{system}/seed1/model.pt", weights_only=True)
        if system == "group":
            enc = selection["final"]["encoder"]
            assert len(enc["selected"]) == 2 and len(enc["selected"][0]) == n_layers
            heads = model["model_config"]["n_heads"]
            for layers in enc["selected"]:  # one head from each strided group
                assert all(sorted(h % heads for h in sel) == list(range(heads)) for sel in layers)
            assert 0 <= m["selection_changed_fraction"] <= 1
            assert (tiny_repo / "plots/variants/multi/group/seed1/head_sharing_encoder.png").stat().st_size > 0
            assert (tiny_repo / "plots/variants/multi/group/seed1/head_sharing_decoder.png").stat().st_size > 0
            assert model["model_config"]["encoder_attention"][0]["type"] == "head_select"
        else:
            assert selection == {"init": {}, "final": {}} and m["selection_changed_fraction"] is None
            assert [f.name for f in (tiny_repo / "plots/variants/multi/baseline/seed1").iterdir()] == \
                ["head_sharing_none.png"]
    report = (tiny_repo / "reports/report.md").read_text()
    section = report.split("## Multilingual ST with attention head selection (Gong et al.)")[1]
    assert "| baseline (H heads, tag only) |" in section and "| group (group selection) |" in section
    assert "head_sharing_encoder" in section
    summary = json.loads((tiny_repo / "metrics/summary.json").read_text())
    group = json.loads((tiny_repo / "metrics/variants/multi/group/seed1.json").read_text())
    assert summary["multi/group/avg_bleu"] == group["avg_bleu"]
    assert summary["multi/group/en-es/bleu"] == group["en-es"]["bleu"]
    assert "multi/group/delta_avg_bleu" in summary
    assert "Running stage" not in _run(["dvc", "repro"], tiny_repo).stdout
    shown = json.loads(_run(["dvc", "plots", "show", "--json"], tiny_repo).stdout)  # declared plots, no errors
    assert not shown.get("errors"), shown.get("errors")
    for name in ("group/seed1/head_sharing_encoder", "group/seed1/head_sharing_decoder", "baseline/seed1/head_sharing_none"):
        assert shown["data"][f"plots/variants/multi/{name}.png"][0]["type"] == "image"


@pytest.mark.slow
def test_exp_run_with_per_pair_asr(tiny_repo: Path) -> None:
    """asr.mode=per_pair (the paper): every pair trains its own ASR model; train_asr_shared only
    writes placeholders. (Last in this file: it leaves the workspace in per_pair mode.)"""
    import torch

    out = _run(["dvc", "exp", "run", "-S", "asr.mode=per_pair", "-S", "local.fork=per_pair", "train_asr"],
               tiny_repo).stdout
    assert "Running stage 'train_asr@en-de'" in out and "Running stage 'train_asr@en-es'" in out
    placeholder = torch.load(tiny_repo / "runs/asr_shared/model.pt", weights_only=True)
    assert set(placeholder) == {"unused"}
    assert json.loads((tiny_repo / "metrics/asr_shared.json").read_text()) == {"asr_mode": "per_pair"}
    models = set()
    for pair in TINY["pairs"]:
        m = json.loads((tiny_repo / "metrics/asr" / f"{pair}.json").read_text())
        assert "asr_mode" not in m and m["updates"] == TRAIN_TINY["max_updates"]
        state = torch.load(tiny_repo / "runs/asr" / pair / "model.pt", weights_only=True)
        assert state["pair"] == pair
        models.add((tiny_repo / "runs/asr" / pair / "model.pt").read_bytes())
        assert list((tiny_repo / "runs/asr" / pair / "checkpoints").iterdir())  # trained here
    assert len(models) == len(TINY["pairs"])
