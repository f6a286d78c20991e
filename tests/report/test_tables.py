"""Report tables from small fixed metric files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lib.report.tables import load_scores, summary, table2_markdown


def _write(root: Path, folder: str, pair: str, seed: int, bleu: float, chrf: float) -> None:
    path = root / "metrics" / folder / pair / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bleu": bleu, "chrf": chrf}))


def test_table2_mean_std_and_flat_summary(tmp_path: Path) -> None:
    for seed, (b, c) in zip([1, 2, 3], [(20.0, 50.0), (22.0, 52.0), (24.0, 54.0)]):
        _write(tmp_path, "st", "en-de", seed, b, c)
        _write(tmp_path, "local", "en-de", seed, b - 1, c - 1)
    base = load_scores(tmp_path, "en-de", "baseline", [1, 2, 3])
    local = load_scores(tmp_path, "en-de", "local", [1, 2, 3])
    assert base.bleu_mean_std == pytest.approx((22.0, 2.0))  # sample std over seeds
    flat = summary([base, local])
    assert flat == {"en-de/baseline/bleu": 22.0, "en-de/baseline/bleu_std": 2.0, "en-de/baseline/chrf": 52.0,
                    "en-de/local/bleu": 21.0, "en-de/local/bleu_std": 2.0, "en-de/local/chrf": 51.0}
    md = table2_markdown([base, local], {"en-de": [{"seed": 1, "p_value": 0.2}]})
    assert "| en-de | baseline | 22.00 ± 2.00 | 52.00 ± 2.00 | 3 | 22.53 |" in md
    assert "| en-de | local | 21.00 ± 2.00 | 51.00 ± 2.00 | 3 | 22.49 | 0.200 |" in md


def test_missing_run_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="seed1.json"):
        load_scores(tmp_path, "en-de", "local", [1])
