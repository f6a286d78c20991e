"""The real users' path: profiles/paper.yaml as params.yaml (`python scripts/params_profile.py paper`), then
`dvc repro` to the report.

tests/test_params.py compares the paper profile's values with the paper's Appendices B-C; this runs
them. Every value of profiles/paper.yaml is used as it is (the paper's model size s, asr.mode
per_pair, update_freq 8, amp auto, beam 5, warm-up, averaging, analysis settings, ...) except the
sizes in SIZE_OVERRIDES, which make the whole chain fit a tiny demo corpus and ~2 minutes on 2 CPU
cores. A change to the profile (or to the code) that breaks this path fails here.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.dvc_repo import REPO, TINY, get_key, make_repo, run, set_keys

PAPER = REPO / "profiles" / "paper.yaml"

# Sizes only, and no more of them than the tiny corpus and the time budget need.
SIZE_OVERRIDES = {
    "pairs": ["en-de"],  # paper: en-de, en-es, en-it
    "seeds": [1],  # paper: 5 seeds
    **{f"corpus.splits.{split}": n for split, n in TINY["corpus"]["splits"].items()},  # the tiny corpus
    "prepare.asr_vocab_size": TINY["prepare"]["asr_vocab_size"],  # paper 5000: too many pieces for it
    "prepare.st_vocab_size": TINY["prepare"]["st_vocab_size"],  # paper 8000
    # s2t_transformer_s's depth (12 + 6 layers), heads, dropout and input, narrower (27 M -> 1.1 M
    # parameters): one training step of the full width takes seconds on 2 cores
    "model.overrides": {"d_model": 64, "ffn_dim": 256, "conv_channels": 128},
    "train_asr.max_updates": 2,  # paper: 50000
    "train_asr.max_frames": 1000,  # paper: 40000 (with update_freq 8: 8 batches per update)
    "train_st.max_updates": 2,
    "train_st.max_frames": 1000,
    "decode.max_len_b": 15,  # paper: 200 (an untrained model decodes to the length limit)
    "analysis.window_samples": 4,  # paper: 400 training sentences for Algorithm 1 (select_windows)
    "health.samples": 4,  # 100 (health_asr, health_st)
}
WIDTHS = {"d_model", "ffn_dim", "conv_channels"}


def paper_tiny_params() -> dict:
    return set_keys(yaml.safe_load(PAPER.read_text()), SIZE_OVERRIDES)


def test_size_overrides_are_the_only_deviation_from_the_paper_profile() -> None:
    paper, params = yaml.safe_load(PAPER.read_text()), paper_tiny_params()
    print("paper profile values overridden for the tiny run:")
    for key in SIZE_OVERRIDES:
        print(f"  {key}: {get_key(paper, key)!r} -> {get_key(params, key)!r}")
        assert get_key(params, key) != get_key(paper, key), f"{key}: not a deviation; drop it from the list"
    # putting the overridden values back gives the paper profile: nothing else differs
    assert set_keys(params, {key: get_key(paper, key) for key in SIZE_OVERRIDES}) == paper
    # what the paper's path is about stays the paper's
    assert set(get_key(params, "model.overrides")) <= WIDTHS and get_key(params, "model.size") == "s"
    assert get_key(params, "asr.mode") == "per_pair"
    assert get_key(params, "train_st.update_freq") == get_key(params, "train_asr.update_freq") == 8
    assert get_key(params, "train_st.encoder_lr_scale") == 1.0  # one lr, as in the paper


@pytest.mark.slow
def test_paper_profile_runs_through_dvc_repro_to_the_report(tmp_path: Path) -> None:
    import torch

    from lib.model.config import model_config
    from lib.params import load_params
    from lib.precision import resolve_amp

    params = paper_tiny_params()
    repo = make_repo(tmp_path / "repo", params)
    p = load_params(repo / "params.yaml")
    out = run(["dvc", "repro"], repo).stdout
    ran = set(re.findall(r"Running stage '([^']+)'", out))
    stages = set(run(["dvc", "stage", "list", "--name-only"], repo).stdout.split())
    assert ran == stages, f"not run: {sorted(stages - ran)}"
    assert json.loads(run(["dvc", "status", "--json"], repo).stdout) == {}

    report = (repo / "reports/report.md").read_text()
    assert "Table 2" in report and "| en-de | local |" in report
    summary = json.loads((repo / "metrics/summary.json").read_text())
    assert {"en-de/baseline/bleu", "en-de/local/bleu", "en-de/asr_wer"} <= set(summary)

    # asr.mode per_pair: en-de's ASR model is trained in its own run, not copied from a shared one
    asr = json.loads((repo / "metrics/asr/en-de.json").read_text())
    assert "asr_mode" not in asr and asr["updates"] == p.train_asr.max_updates
    assert (repo / "runs/asr/en-de/checkpoints/last.pt").is_file()
    # the paper's model (size s, no overrides) in the paper's precision, resolved on this device
    precision = resolve_amp(p.train_st.amp, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    for system in ("baseline", "local"):
        m = json.loads((repo / "metrics" / system / "en-de/seed1.json").read_text())
        assert m["updates"] == p.train_st.max_updates and m["precision"] == precision
        saved = torch.load(repo / "runs" / system / "en-de/seed1/model.pt", weights_only=True)["model_config"]
        expected = model_config(p.model.size, vocab_size=saved["vocab_size"], **p.model.overrides).to_dict()
        for key in ("vocab_size", "encoder_attention"):
            saved.pop(key), expected.pop(key)
        assert saved == expected
