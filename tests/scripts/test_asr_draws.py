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
    argv = ["--draws", "2", "--seeds", "1", "2", "--params", str(params), "--prepared", str(prepared),
            "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "out" / "draws"), "--jobs", "1"]
    try:
        result = asr_draws.main(argv, runner=in_process(calls))
    finally:
        torch.set_num_threads(old)
    # per draw: the shared ASR model; the pair's ASR copy, 2 baselines, windows, 2 health checks, band test;
    # the shared fork; the pair's fork copy and 2 local runs
    assert len(calls) == 2 * (1 + 7 + 1 + 3)
    order = [c[0][0] for c in calls[:12]]
    assert order.index("stages/select_windows.py") < order.index("stages/train_asr_local.py") < \
        order.index("stages/train_local.py")
    assert (tmp_path / "w" / ".gitignore").read_text() == "*\n"
    draw = {seed: tmp_path / "w" / "params" / f"seed{seed}" for seed in (1, 2)}
    for seed, folder in draw.items():
        p = yaml.safe_load((folder / "params.yaml").read_text())
        assert p["train_asr"]["seed"] == seed and p["seeds"] == [1, 2] and p["controls"]["band_seeds"] == [1]
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
        # the ASR model's dev-WER curve, as the run logged it
        wer = (draw[int(seed)] / "plots/train/asr_shared/dev/wer.tsv").read_text().split()
        assert row["asr_dev_wer"] and row["asr_dev_wer"][-1][1] == pytest.approx(float(wer[-1]))
        # every seed's BLEU of both systems, and local - baseline paired by seed
        for system in ("baseline", "local"):
            for i, st_seed in enumerate((1, 2)):
                m = json.loads((draw[int(seed)] / f"metrics/{system}/en-de/seed{st_seed}.json").read_text())
                assert row["runs"][system]["bleu"][i] == m["bleu"]
        diffs = [a - b for a, b in zip(row["runs"]["local"]["bleu"], row["runs"]["baseline"]["bleu"])]
        from lib.stats import interval

        assert f"| {seed} | en-de |" in md and interval(diffs).cell() in md
    rhos = [table["draws"][s]["pairs"]["en-de"]["rho"] for s in ("1", "2")]
    from lib.stats import mean_ci

    m, h = mean_ci(rhos)
    assert table["summary"]["pairs"]["en-de"]["rho"] == {"mean": round(m, 4), "ci95": round(h, 4), "n": 2}
    assert table["summary"]["pooled"]["n"] == 2
    outcome = table["summary"]["outcomes"]["local"]["en-de"]
    assert outcome["lose"] + outcome["gain"] + outcome["hold_0"] == 2
    # the recorded command names its --out: run as written, it rewrites this table, not the default one
    assert table["command"] == f"python scripts/asr_draws.py --draws 2 --seeds 1 2 --out {tmp_path / 'out' / 'draws'}"
    assert "## en-de: the ST windows per layer" in md and "## local − baseline per draw and pair" in md
    # the JSON keeps what the per-layer tables read, not the whole health dump
    kept = table["draws"]["1"]["pairs"]["en-de"]["health_st"]
    assert set(kept) == {"algorithm1_windows", "layers"}
    assert set(next(iter(kept["layers"].values()))) <= set(asr_draws.LAYER_KEYS)
    check_merge(table, md, tmp_path / "merge")
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
    # a workspace draw has no band-test stage (controls.band_seeds: []): Algorithm 1's gap from health_st
    (draw[1] / "metrics/variants/band_test/en-de/seed1.json").unlink()
    row = asr_draws.collect_draw(draw[1], "en-de", 1, [1, 2], ["baseline", "local"])
    health = json.loads((draw[1] / "metrics/health/en-de/st.json").read_text())
    assert row["gap"] == {"alg1": health["summary"].get("alg1_gap_recovered"), "uniform": None, "shuffled": None}
    assert row["acc_full"] == health["summary"].get("acc_full") and row["acc_w1"] == health["summary"].get("acc_w1")
    assert f"| 1 | en-de | {' '.join(map(str, row['windows']))} |" in asr_draws.markdown(
        {**table, "draws": {1: {**table["draws"]["1"], "pairs": {"en-de": row}}}})


def check_merge(table: dict, md: str, folder: Path) -> None:
    """``--merge``: the two draws of ``table`` written as two results and joined again give the same tables
    (the command line aside); unlike settings, a draw twice and overwriting an input are refused; a result
    written before the JSON kept the per-layer figures gives the draw tables only."""
    folder.mkdir()
    parts = []
    for seed in ("1", "2"):
        part = {**table, "command": f"python scripts/asr_draws.py --asr-seeds {seed}",
                "draws": {seed: table["draws"][seed]}}
        (folder / f"d{seed}.json").write_text(json.dumps(part))
        parts.append(folder / f"d{seed}.json")
    merged = asr_draws.main(["--merge", *map(str, parts), "--out", str(folder / "all")])
    assert merged["summary"] == table["summary"]
    out_md = (folder / "all.md").read_text()
    body = lambda text: text.split("\n", 3)[3]  # noqa: E731 (after the title and the command line)
    assert body(out_md) == body(md)
    assert "--asr-seeds 1" in out_md and "--asr-seeds 2" in out_md and "trains nothing" in out_md
    assert json.loads((folder / "all.json").read_text())["draws"] == table["draws"]
    with pytest.raises(SystemExit, match="draw 1 is also in an earlier file"):
        asr_draws.main(["--merge", str(parts[0]), str(parts[0]), "--out", str(folder / "twice")])
    other = {**json.loads(parts[1].read_text()), "seeds": [1, 2, 3]}
    (folder / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match=r"other.json: seeds is \[1, 2, 3\]"):
        asr_draws.main(["--merge", str(parts[0]), str(folder / "other.json"), "--out", str(folder / "x")])
    assert len(table["setting"]) == 16 and json.loads((folder / "all.json").read_text())["setting"] == table["setting"]
    (folder / "otherparams.json").write_text(json.dumps({**json.loads(parts[1].read_text()), "setting": "0" * 16}))
    with pytest.raises(SystemExit, match=r"otherparams.json: trained with other params than .*d1.json"):
        asr_draws.main(["--merge", str(parts[0]), str(folder / "otherparams.json"), "--out", str(folder / "x")])
    (folder / "bad.json").write_text("{\"draws\": {}}")
    with pytest.raises(SystemExit, match="bad.json: not a result of scripts/asr_draws.py"):
        asr_draws.main(["--merge", str(folder / "bad.json"), "--out", str(folder / "x")])
    with pytest.raises(SystemExit):  # argparse: --out would overwrite an input
        asr_draws.main(["--merge", str(parts[0]), "--out", str(folder / "d1")])
    old = json.loads(parts[1].read_text())
    old["draws"]["2"]["pairs"]["en-de"].pop("health_st")
    (folder / "old.json").write_text(json.dumps(old))
    asr_draws.main(["--merge", str(parts[0]), str(folder / "old.json"), "--out", str(folder / "mixed")])
    mixed = (folder / "mixed.md").read_text()
    assert "No per-layer tables: draw 2 comes" in mixed and "per layer over the draws" not in mixed
    assert "## local − baseline per draw and pair" in mixed
    assert not (folder / "x.json").exists() and not (folder / "twice.md").exists()


def test_merge_rebuilds_the_committed_tables(tmp_path: Path, capsys) -> None:
    """reports/asr_draws_all is the merge its own command line names; a result merged alone gives its own
    table but for the command line; the merged table's command line names its --out (it refuses to run
    without one)."""
    reports = REPO / "reports"
    body = lambda text: text.split("\n", 3)[3]  # noqa: E731 (after the title and the command line)
    committed = json.loads((reports / "asr_draws_all.json").read_text())
    argv = committed["command"].split()[2:]
    assert argv[0] == "--merge" and argv[-2:] == ["--out", "reports/asr_draws_all"]
    inputs = [REPO / name for name in argv[1:-2]]
    assert len(inputs) >= 2 and all(path.is_file() for path in inputs)
    out = tmp_path / "all"
    merged = asr_draws.main(["--merge", *map(str, inputs), "--out", str(out)])
    assert body(out.with_suffix(".md").read_text(encoding="utf-8")) == \
        body((reports / "asr_draws_all.md").read_text(encoding="utf-8"))
    assert merged["command"].endswith(f" --out {out}")
    assert json.loads(out.with_suffix(".json").read_text())["summary"] == committed["summary"]
    one = tmp_path / "one"
    asr_draws.main(["--merge", str(reports / "asr_draws_4.json"), "--out", str(one)])
    assert body(one.with_suffix(".md").read_text(encoding="utf-8")) == \
        body((reports / "asr_draws_4.md").read_text(encoding="utf-8"))
    capsys.readouterr()


def test_a_merged_result_merges_again(tmp_path: Path, capsys) -> None:
    """A merged result as an input: its sources and CPUs are carried over, not the merge command and a
    "None cores"."""
    r = json.loads((REPO / "reports" / "asr_draws_4.json").read_text())
    other = {**r, "cpu": "Intel Xeon", "cores": 16, "command": "python scripts/asr_draws.py --asr-seeds 99",
             "draws": {"99": r["draws"]["4"]}}
    (tmp_path / "d5.json").write_text(json.dumps(other))
    first = asr_draws.main(["--merge", str(REPO / "reports" / "asr_draws_4.json"), str(tmp_path / "d5.json"),
                            "--out", str(tmp_path / "m45")])
    assert first["cpu"] == "AMD EPYC (2 cores) / Intel Xeon (16 cores)" and first["cores"] is None
    again = asr_draws.main(["--merge", str(REPO / "reports" / "asr_draws.json"), str(tmp_path / "m45.json"),
                            "--out", str(tmp_path / "all")])
    assert again["cpu"] == first["cpu"] and again["cores"] is None
    assert len(again["sources"]) == 3 and not any("--merge" in x or "None" in x for x in again["sources"])
    assert list(again["draws"]) == [1, 2, 3, 4, 99]
    same_cpu = asr_draws.main(["--merge", str(REPO / "reports" / "asr_draws_all.json"), str(tmp_path / "d5.json"),
                               "--out", str(tmp_path / "x")])
    committed = json.loads((REPO / "reports" / "asr_draws_all.json").read_text())
    assert same_cpu["cpu"] == first["cpu"] and len(same_cpu["sources"]) == len(committed["sources"]) + 1
    capsys.readouterr()


def test_steps_wait_for_what_they_need_and_a_failure_stops_the_draw(tmp_path: Path) -> None:
    steps = asr_draws.draw_steps(["en-de", "en-es"], [1, 2], 2, ["baseline", "local"], "local_uniform", control_fork=True)
    names = [s.name for s in steps]
    assert names[0] == "asr" and names.index("baseline@en-de-2") < names.index("baseline@en-de-1")  # analysed seed first
    by = {s.name: s for s in steps}
    assert by["asr_local"].after == {"asr", "windows@en-de", "windows@en-es"}
    assert by["control@en-es-1"].after == {"asr_local@en-es", "asr_control", "windows@en-es"}
    ran: list[str] = []

    def runner(argv, cwd):  # noqa: ANN001, ANN202
        ran.append(" ".join(argv))
    (tmp_path / asr_draws.DONE).mkdir()
    assert asr_draws.run_steps(tmp_path, steps, 2, runner) is True
    position = {cmd: i for i, cmd in enumerate(ran)}
    for step in steps:  # with two workers, nothing starts before what it waits for finished
        for dep in step.after:
            assert position[" ".join(by[dep].argv)] < position[" ".join(step.argv)]
    assert asr_draws.run_steps(tmp_path, steps, 2, runner) is False  # markers: nothing runs twice
    (tmp_path / "again" / asr_draws.DONE).mkdir(parents=True)

    def failing(argv, cwd):  # noqa: ANN001, ANN202
        if argv[0] == "stages/select_windows.py":
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        asr_draws.run_steps(tmp_path / "again", steps, 1, failing)
    assert not list((tmp_path / "again" / asr_draws.DONE).glob("stages_train_local.py*"))
    with pytest.raises(ValueError, match="unknown steps"):
        asr_draws.run_steps(tmp_path, [asr_draws.Step("a", ["x"], {"b"})], 1, runner)


def test_summary_counts_draws_that_lose_gain_or_hold_zero() -> None:
    def row(rho, base, local):  # noqa: ANN001, ANN202
        return {"rho": rho, "gap": {"alg1": 0.5}, "runs": {"baseline": {"bleu": base, "dev_nll": [1.0] * len(base)},
                                                          "local": {"bleu": local, "dev_nll": [1.0] * len(local)}}}
    draws = {1: {"pairs": {"p": row(0.5, [10, 11, 12], [8, 9, 10.5])}},     # -2, -2, -1.5: below 0
             2: {"pairs": {"p": row(-0.1, [10, 11, 12], [11, 10, 12.5])}},  # holds 0
             3: {"pairs": {"p": row(0.3, [10, 11, 12], [11, 12, 13.2])}}}   # +1, +1, +1.2: above 0
    s = asr_draws.summarize(draws, ["p"], ["baseline", "local"])
    assert s["outcomes"]["local"]["p"] == {"lose": 1, "gain": 1, "hold_0": 1}
    assert s["draw_mean_range"] == pytest.approx(0.6) and s["pooled"]["positive"] == 2 and s["pooled"]["n"] == 3


def test_pooled_rho_takes_the_draw_as_its_unit() -> None:
    """Three pairs of one draw share its ASR model and give near-identical ρ: pooling the 6 draw × pair
    profiles as if independent gave a t-interval over n = 6; the interval is the per-draw means' (n = 2)."""
    def row(rho):  # noqa: ANN001, ANN202
        return {"rho": rho, "gap": {"alg1": 0.5}, "runs": {}}
    draws = {1: {"pairs": {p: row(0.6) for p in ("a", "b", "c")}}, 2: {"pairs": {p: row(0.8) for p in ("a", "b", "c")}}}
    s = asr_draws.summarize(draws, ["a", "b", "c"])
    # over the two draws: 0.7 ± t(0.975, 1) · 0.1414 / √2 = 0.7 ± 1.2706 (over six profiles it was ± 0.1150)
    assert s["draw_mean"] == {"mean": 0.7, "ci95": pytest.approx(12.7062047 * 0.1, abs=1e-4), "n": 2}
    assert s["pooled"] == {"mean": 0.7, "ci95": None, "n": 6, "positive": 6}


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
    assert asr_draws.draw_params(params, 3, None, [1, 2, 3])["seeds"] == [1, 2, 3]
    control = asr_draws.draw_params(params, 3, None, None, "local_uniform")["controls"]
    assert control["systems"] == ["local_uniform"]
    assert control["asr_systems"] == (["local_uniform"] if params["local"]["asr_pretraining"] == "fork" else [])
    for key in ("train_asr", "seeds", "controls"):
        out.pop(key), params.pop(key)
    assert out == params
    with pytest.raises(SystemExit, match="no prepared data"):
        asr_draws.main(["--draws", "1", "--prepared", str(tmp_path)], runner=lambda a, c: None)
    # the setting's digest: the same for any ASR seed, another for any other param
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    digest = asr_draws.setting_digest
    assert digest(asr_draws.draw_params(params, 3, None)) == digest(asr_draws.draw_params(params, 4, None))
    assert digest(asr_draws.draw_params(params, 3, None)) != digest(asr_draws.draw_params(params, 3, "none"))
    params["train_st"]["max_updates"] += 1
    assert digest(asr_draws.draw_params(params, 3, None)) != digest(asr_draws.draw_params(
        yaml.safe_load((REPO / "params.yaml").read_text()), 3, None))


def test_asr_seeds_pick_any_set_of_draws(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        asr_draws.main(["--asr-seeds", "3", "3", "--prepared", str(tmp_path)], runner=lambda a, c: None)
    assert "--asr-seeds: a seed given twice" in capsys.readouterr().err
    prepared = tmp_path / "prepared"
    for pair in yaml.safe_load((REPO / "params.yaml").read_text())["pairs"]:
        (prepared / pair).mkdir(parents=True)
        (prepared / pair / "train.tsv").write_text("id\n")
    started: list = []

    def stop_at_asr(argv, cwd):  # noqa: ANN001, ANN202
        started.append(Path(cwd).name)
        raise RuntimeError("stop")
    with pytest.raises(RuntimeError, match="stop"):
        asr_draws.main(["--asr-seeds", "3", "1", "--prepared", str(prepared), "--workdir", str(tmp_path / "w"),
                        "--jobs", "1"], runner=stop_at_asr)
    assert started == ["seed3"]  # the first seed given, not the lowest
