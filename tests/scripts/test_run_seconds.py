"""scripts/run_seconds.py: ST runs' training / decoding seconds collected and compared."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import run_seconds  # noqa: E402


def _run(root: Path, kind: str, pair: str, seed: int, train: float, decode: float) -> None:
    d = root / "runs" / kind / pair / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "timing.json").write_text(json.dumps({"train_seconds": train, "decode_seconds": decode}))


def test_collect_and_compare(tmp_path, capsys):
    before, after = tmp_path / "a", tmp_path / "b"
    for root, scale in ((before, 2.0), (after, 1.0)):
        for seed in (1, 2):
            _run(root, "baseline", "en-de", seed, 10.0 * scale, 3.0 * scale)
        _run(root, "local", "en-de", 1, 5.0, 1.0 * scale)
    for root in (before, after):
        run_seconds.main(["collect", str(root), "--out", str(root / "t.json")])
    data = json.loads((before / "t.json").read_text())
    assert data["baseline/en-de/seed2"] == {"train_seconds": 20.0, "decode_seconds": 6.0}
    capsys.readouterr()
    run_seconds.main(["compare", str(before / "t.json"), str(after / "t.json")])
    out = capsys.readouterr().out
    assert "| baseline/en-de | 2 | 40.0 | 20.0 | 2.00× | 12.0 | 6.0 | 2.00× |" in out
    assert "| local/en-de | 1 | 5.0 | 5.0 | 1.00× | 2.0 | 1.0 | 2.00× |" in out


def test_collect_names_the_bad_file(tmp_path):
    with pytest.raises(SystemExit, match="^error: .*no ST run timing"):
        run_seconds.collect(tmp_path)
    d = tmp_path / "runs" / "baseline" / "en-de" / "seed1"
    d.mkdir(parents=True)
    (d / "timing.json").write_text("{}")
    with pytest.raises(SystemExit, match="seed1/timing.json"):
        run_seconds.collect(tmp_path)
