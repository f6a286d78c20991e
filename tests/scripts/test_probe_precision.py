"""scripts/probe_precision.py: amp: auto's probe measured again per pair, the cache untouched."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import probe_precision  # noqa: E402

from lib import precision  # noqa: E402
from lib.data.prepare import prepare_pair  # noqa: E402
from lib.params import PrepareParams, load_params  # noqa: E402
from tests.corpus_factory import default_spec, make_corpus  # noqa: E402


def test_each_pair_is_probed_as_a_run_would_and_the_cache_is_left_alone(tmp_path, monkeypatch, capsys):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    p = load_params(tmp_path / "params.yaml")
    make_corpus(tmp_path / "mustc", default_spec(), pair="en-de")
    prepare_pair(tmp_path / "mustc", "en-de", tmp_path / p.data.prepared_dir / "en-de",
                 PrepareParams(workers=1, asr_vocab_size=40, st_vocab_size=40), progress=False)
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path / "cache"))
    seen: list[dict] = []
    speedups = iter([1.30, 1.10])

    def probe(model_config, batches, ctc_weight=0.0, bf16_batches=None):
        seen.append({"model": model_config, "ctc": ctc_weight, "fp32": batches, "bf16": bf16_batches})
        s = next(speedups)
        return {"none": 0.2, "bf16": 0.2 / s, "speedup": s}

    monkeypatch.setattr(probe_precision, "probe_step_times", probe)
    probe_precision.main(["--params", str(tmp_path / "params.yaml"), "--pairs", "en-de", "--threads", "1"])
    out = capsys.readouterr().out
    assert "| en-de | 200.0 | 153.8 | 1.30x | bf16 |" in out
    assert "| en-de | 200.0 | 181.8 | 1.10x | fp32 |" in out
    assert "| en-de: median of 2 | | | 1.20x | |" in out
    assert len(seen) == 2
    # the baseline's model (full attention), the ST run's CTC weight, bf16 on batches padded as a bf16 run pads
    assert all(layer == {"type": "full"} for layer in seen[0]["model"]["encoder_attention"])
    assert seen[0]["ctc"] == p.train_st.ctc_weight
    pad_frames = precision.BF16_PAD_TO[0]
    assert all(b.feats.shape[1] % pad_frames == 0 for b in seen[0]["bf16"])
    assert [b.ids for b in seen[0]["bf16"]] == [b.ids for b in seen[0]["fp32"]]
    assert not (tmp_path / "cache").exists()


def test_missing_prepared_data_is_named(tmp_path):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    with pytest.raises(SystemExit, match=r"^error: .*en-de/train.tsv: missing; run `dvc repro prepare@en-de`"):
        probe_precision.main(["--params", str(tmp_path / "params.yaml"), "--pairs", "en-de"])


def test_a_broken_params_file_is_one_line(tmp_path):
    from tests.tool_tree import BROKEN_PARAMS, one_error_line, run_in, tool_tree

    root = tool_tree(tmp_path, "scripts", BROKEN_PARAMS)
    assert "params.yaml: not valid YAML" in one_error_line(run_in(root, "scripts/probe_precision.py", "--repeats", "1"))
