"""scripts/asr_draws.py: k ASR draws of a tiny setting, each through the pipeline's own stage scripts in
a scratch folder, then one table with the mean ± 95 % CI of ρ. The stages run in-process here (the
command runs each in its own Python process; that runner is checked on its own)."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lib.data.prepare import prepare_pair
from lib.params import PrepareParams
from tests.corpus_factory import default_spec, make_corpus
from tests.dvc_repo import REPO, TRAIN_TINY, merge

sys.path.insert(0, str(REPO / "scripts"))

import asr_draws  # noqa: E402

TINY = {"pairs": ["en-de"], "seeds": [1], "model": {"size": "tiny", "overrides": {"encoder_layers": 4}},
        "train_asr": {**TRAIN_TINY, "amp": "none"}, "train_st": {**TRAIN_TINY, "amp": "none"},
        "decode": {"beam": 1, "max_len_b": 6, "dev_sentences": 2}, "asr": {"fork_updates": 1},
        "analysis": {"samples": 3, "window_samples": 4, "full_layers": 2, "transparency_samples": 1},
        "health": {"samples": 3, "band_windows": [3]}, "parallel": {"jobs": 1}}


def in_process(calls: list) -> asr_draws.Runner:
    """Run a stage script's main() in this process with its ROOT at the draw folder."""
    def run(argv: list[str], cwd: Path) -> None:
        calls.append((argv, cwd))
        mp = pytest.MonkeyPatch()
        try:
            mp.syspath_prepend(str(REPO / "stages"))
            import _common

            name = Path(argv[0]).stem
            spec = importlib.util.spec_from_file_location(f"_draw_{name}", REPO / argv[0])
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mp.setattr(_common, "ROOT", cwd)
            mp.setattr(mod, "ROOT", cwd)
            mp.setattr(sys, "argv", [argv[0], *argv[1:]])
            mp.chdir(cwd)
            mod.main()
        finally:
            mp.undo()
            torch.set_num_threads(1)
    return run


@pytest.fixture
def setting(tmp_path: Path) -> tuple[Path, Path]:
    make_corpus(tmp_path / "mustc", default_spec(), pair="en-de")
    prepare_pair(tmp_path / "mustc", "en-de", tmp_path / "prepared" / "en-de",
                 PrepareParams(workers=1, asr_vocab_size=40, st_vocab_size=40), progress=False)
    params = merge(yaml.safe_load((REPO / "params.yaml").read_text()), TINY)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return tmp_path / "params.yaml", tmp_path / "prepared"


@pytest.mark.slow
def test_two_draws_end_to_end_and_resume(setting, tmp_path: Path) -> None:
    params, prepared = setting
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    calls: list = []
    argv = ["--draws", "2", "--params", str(params), "--prepared", str(prepared), "--workdir", str(tmp_path / "w"),
            "--out", str(tmp_path / "out" / "draws"), "--jobs", "1"]
    try:
        result = asr_draws.main(argv, runner=in_process(calls))
    finally:
        torch.set_num_threads(old)
    assert len(calls) == 2 * (1 + 6)  # the shared ASR model, then the pair's six stages, per draw
    assert (tmp_path / "w" / ".gitignore").read_text() == "*\n"
    draw = {seed: tmp_path / "w" / "params" / f"seed{seed}" for seed in (1, 2)}
    for seed, folder in draw.items():
        p = yaml.safe_load((folder / "params.yaml").read_text())
        assert p["train_asr"]["seed"] == seed and p["seeds"] == [1] and p["controls"]["band_seeds"] == [1]
    # two draws: two different ASR models, both the pipeline's (same path, same stage)
    assert (draw[1] / "runs/asr_shared/model.pt").read_bytes() != (draw[2] / "runs/asr_shared/model.pt").read_bytes()
    table = json.loads((tmp_path / "out" / "draws.json").read_text())
    md = (tmp_path / "out" / "draws.md").read_text()
    for seed in ("1", "2"):
        row = table["draws"][seed]["pairs"]["en-de"]
        health = json.loads((draw[int(seed)] / "metrics/health/en-de/st.json").read_text())
        assert row["windows"] == [int(w) for w in health["algorithm1_windows"].split()] and len(row["windows"]) == 2
        assert row["rho"] == health["summary"].get("alg1_windows_rho")
        assert set(row["gap"]) == {"alg1", "uniform", "shuffled"}
        assert f"| {seed} | en-de | {' '.join(map(str, row['windows']))} |" in md
    rhos = [table["draws"][s]["pairs"]["en-de"]["rho"] for s in ("1", "2")]
    from lib.report.controls import mean_ci

    m, h = mean_ci(rhos)
    assert table["summary"]["pairs"]["en-de"]["rho"] == {"mean": round(m, 4), "ci95": round(h, 4), "n": 2}
    assert "python scripts/asr_draws.py --draws 2" == table["command"] and "## en-de: the ST windows per layer" in md
    assert "health_st" not in table["draws"]["1"]["pairs"]["en-de"]  # the per-layer dump stays in the draw folder
    # a rerun finds every step done: nothing trains again, the same table
    again: list = []
    asr_draws.main(argv, runner=in_process(again))
    assert again == []
    rerun = json.loads((tmp_path / "out" / "draws.json").read_text())
    assert rerun["summary"] == table["summary"]
    assert rerun["draws"]["1"]["wall_minutes"] == table["draws"]["1"]["wall_minutes"]  # a no-op adds no time
    # other params for a finished draw folder are refused instead of mixing two settings
    with pytest.raises(SystemExit, match="made with other params"):
        asr_draws.prepare_draw(draw[1], {"x": 1}, prepared, "data/prepared")
    assert result["summary"] == table["summary"]


def test_subprocess_runner_names_the_log(tmp_path: Path, monkeypatch) -> None:
    class Done:
        returncode = 3

    seen = {}

    def fake_run(cmd, cwd, stdout, stderr):  # noqa: ANN001, ANN202
        seen.update(cmd=cmd, cwd=cwd)
        return Done()

    monkeypatch.setattr(asr_draws.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match=r"stages/health.py en-de st failed \(3\).*health_en-de_st.log"):
        asr_draws.subprocess_runner(["stages/health.py", "en-de", "st"], tmp_path)
    assert seen == {"cmd": [os.path.abspath(sys.executable), "stages/health.py", "en-de", "st"], "cwd": tmp_path}


def test_subprocess_runner_runs_a_relative_interpreter_from_the_draw_folder(tmp_path: Path, monkeypatch) -> None:
    # `PATH=.venv/bin:$PATH python scripts/asr_draws.py` gives a relative sys.executable; the stage runs
    # with the draw folder as its cwd, where that relative path does not exist
    here = Path.cwd()
    rel = os.path.relpath(sys.executable, here)
    monkeypatch.setattr(asr_draws.sys, "executable", rel)
    draw = tmp_path / "draw"
    (draw / "stages").mkdir(parents=True)
    (draw / "stages" / "hello.py").write_text("print('ran')\n")
    asr_draws.subprocess_runner(["stages/hello.py"], draw)
    assert (draw / "logs" / "hello.log").read_text().strip() == "ran"


def test_draw_params_change_only_the_draw(tmp_path: Path) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    out = asr_draws.draw_params(params, 3, "auto")
    assert out["train_asr"]["seed"] == 3 and out["train_asr"]["amp"] == "auto"
    assert out["seeds"] == [params["analysis"]["st_seed"]] and out["controls"]["band_seeds"] == out["seeds"]
    for key in ("train_asr", "seeds", "controls"):
        out.pop(key), params.pop(key)
    assert out == params
    with pytest.raises(SystemExit, match="no prepared data"):
        asr_draws.main(["--draws", "1", "--prepared", str(tmp_path)], runner=lambda a, c: None)
