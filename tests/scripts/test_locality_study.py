"""scripts/locality_study.py: rows read from a workspace or from a DVC experiment's commit."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import locality_study  # noqa: E402

ROOT = locality_study.ROOT


def test_collect_reads_the_rows_figures_through_any_reader() -> None:
    files = {
        ROOT / "metrics/health/en-de/asr.json": {"summary": {"c_ii_mean": 0.7}, "algorithm1_windows": "1 3 5",
                                                 "band_test": {"full": {"acc": 99.0}, "w1": {"acc": 80.0}}},
        ROOT / "metrics/asr_shared.json": {"wer": 1.5},
    }
    got = locality_study.collect("asr", lambda p: files.get(p, {}))
    assert got == {"summary": {"c_ii_mean": 0.7}, "windows": "1 3 5", "band_test": {"full": 99.0, "w1": 80.0},
                   "wer": 1.5}
    st = locality_study.collect("st", lambda p: {})  # nothing there: empty figures, no error
    assert st["summary"] == {} and st["bleu"] is None and st["local_bleu"] is None


def test_every_row_has_a_command_and_new_rows_build_on_the_default() -> None:
    names = [r[0] for r in locality_study.ROWS]
    assert len(names) == len(set(names))
    by_name = {r[0]: r for r in locality_study.ROWS}
    for row in ("W", "X"):
        cmd = locality_study.row_command(row, by_name[row][2], by_name[row][3])
        assert cmd[-1] == "health_asr@en-de"
        assert "train_asr.specaug_time_p=0.1" in cmd and "train_asr.max_updates=2400" in cmd
    assert "corpus.noise_level=0.03" in locality_study.row_command("W", by_name["W"][2], "asr")
    assert "corpus.reverb_rt60=[0.4,0.9]" in locality_study.row_command("X", by_name["X"][2], "asr")


def test_every_model_override_of_the_default_is_pinned_to_what_the_rows_ran_with() -> None:
    """`-S` merges into params.yaml's model.overrides, so an override the default gained after the
    study would leak into every rerun row unless OLD_DEFAULT states its value then."""
    import yaml

    overrides = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["model"]["overrides"]
    missing = sorted(k for k in overrides if f"model.overrides.{k}" not in locality_study.OLD_DEFAULT)
    assert not missing, f"model.overrides keys not pinned by OLD_DEFAULT: {missing}"
    assert locality_study.OLD_DEFAULT["model.overrides.ctc_zero_init"] == "false"


@pytest.mark.parametrize("args, message", [
    (["--record", "ZZ", "noise03", "--minutes", "1"], "unknown row 'ZZ'"),
    (["--record", "W", "noise03"], "--record needs --minutes"),
    (["--record", "W", "no-such-experiment-xyz", "--minutes", "1"], "0 DVC experiments named 'no-such-experiment-xyz'"),
])
def test_record_refuses_bad_arguments_and_writes_nothing(args, message) -> None:
    before = locality_study.OUT_JSON.read_bytes()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "locality_study.py"), *args], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and message in proc.stderr
    assert locality_study.OUT_JSON.read_bytes() == before


def test_record_options_without_record_are_refused_before_any_row_runs(monkeypatch, capsys) -> None:
    """`--minutes 13.9` alone used to be ignored and start every row of the study (hours of `dvc exp run`)."""
    def no_run(*a, **k):
        raise AssertionError(f"ran {a}")

    monkeypatch.setattr(locality_study.subprocess, "run", no_run)
    for argv in (["--minutes", "3"], ["--note", "x"], ["--baseline-only"]):
        with pytest.raises(SystemExit) as e:
            locality_study.main(argv)
        assert e.value.code == 2
        assert "go with --record" in capsys.readouterr().err
