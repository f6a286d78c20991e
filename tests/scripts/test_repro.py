"""scripts/repro.py: `dvc repro` with independent stages side by side, on a small DVC project of
sleeping stages (a and b independent, c after both; a failing stage stops what depends on it)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import repro  # noqa: E402

STAMP = "import sys, time; t = time.time(); time.sleep({sleep}); open(sys.argv[1], 'w').write(f'{{t}} {{time.time()}}')"


def _stage(name: str, deps: list[str], sleep: float = 1.5, fail: bool = False, shares: bool = True) -> dict:
    code = "import sys; sys.exit(3)" if fail else STAMP.format(sleep=sleep)
    stage = {"cmd": f'{sys.executable} -c "{code}" {name}.out', "deps": deps or ["input.txt"], "outs": [f"{name}.out"]}
    return {**stage, "params": ["parallel"]} if shares else stage


def _project(root: Path, stages: dict) -> Path:
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["dvc", "init", "-q"], cwd=root, check=True)
    (root / "input.txt").write_text("x\n")
    (root / "params.yaml").write_text("parallel:\n  jobs: 2\n")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    return root


def _repro(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / "repro.py"), *args], cwd=root, capture_output=True,
                          text=True, timeout=300)


def test_span_and_timing_groups() -> None:
    assert repro._span([(0, 2), (1, 3), (5, 6)]) == 4
    rec = repro.timing_record({"t@a": (0.0, 2.0), "t@b": (1.0, 3.0), "u": (3.0, 4.0)}, 4.0, 2, "cmd", 0)
    assert rec["by_stage_group"] == {"t": 3.0, "u": 1.0}  # wall time, not the 4.0 s of stage time
    assert rec["by_stage"] == {"t@a": 2.0, "t@b": 2.0, "u": 1.0}


def test_only_stages_that_share_the_machine_run_beside_each_other() -> None:
    p = repro.Plan(order=["s1", "s2", "s3", "alone"], needs={n: set() for n in ("s1", "s2", "s3", "alone")},
                   shares={"s1", "s2", "s3"})
    assert repro.can_start(p, "s2", {"s1"}, 2) and not repro.can_start(p, "s3", {"s1", "s2"}, 2)
    assert not repro.can_start(p, "alone", {"s1"}, 2) and repro.can_start(p, "alone", set(), 2)
    assert not repro.can_start(p, "s1", {"alone"}, 2)


def test_ready_stages_most_downstream_work_first() -> None:
    p = repro.Plan(order=["a", "b", "c", "d"], needs={"a": set(), "b": set(), "c": {"b"}, "d": {"a", "b"}},
                   downstream={"a": 1, "b": 2})
    assert repro.next_ready(p, set(), set()) == ["b", "a"]
    assert repro.next_ready(p, {"b"}, {"b", "a"}) == ["c"]
    assert repro.next_ready(p, {"a", "b"}, {"a", "b"}) == ["c", "d"]


@pytest.mark.slow
def test_independent_stages_run_side_by_side_and_dvc_records_them(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", {"a": _stage("a", []), "b": _stage("b", []),
                                     "c": _stage("c", ["a.out", "b.out"], sleep=0.1),
                                     "d": _stage("d", ["c.out"], sleep=0.5, shares=False),
                                     "e": _stage("e", ["c.out"], sleep=0.5)})
    proc = _repro(root, "-j", "2", "--timing", "t.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (a0, a1), (b0, b1), (c0, _) = ([float(x) for x in (root / f"{s}.out").read_text().split()] for s in "abc")
    assert a0 < b1 and b0 < a1, "a and b did not overlap"
    assert c0 >= max(a1, b1), "c started before its dependencies finished"
    (d0, d1), (e0, e1) = ([float(x) for x in (root / f"{s}.out").read_text().split()] for s in "de")
    assert d1 <= e0 or e1 <= d0, "d (no `parallel` param) ran beside e"
    assert "up to date" in subprocess.run(["dvc", "status"], cwd=root, capture_output=True, text=True).stdout
    timing = json.loads((root / "t.json").read_text())
    assert set(timing["by_stage"]) == {"a", "b", "c", "d", "e"} and timing["jobs"] == 2
    again = _repro(root, "-j", "2")
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout


@pytest.mark.slow
def test_a_failing_stage_stops_its_dependents_and_names_itself(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", {"bad": _stage("bad", [], fail=True), "ok": _stage("ok", [], sleep=0.5),
                                     "after": _stage("after", ["bad.out"], sleep=0.1)})
    proc = _repro(root, "-j", "2")
    assert proc.returncode == 1
    assert "FAILED   bad (exit" in proc.stdout and ".dvc/tmp/repro/bad.log" in proc.stdout, proc.stdout
    assert not (root / "after.out").exists() and (root / "ok.out").exists()


def test_bad_jobs_value_is_named(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", {"a": _stage("a", [])})
    proc = _repro(root, "-j", "0")
    assert proc.returncode != 0 and "-j/--jobs" in proc.stderr, proc.stderr


def test_an_unknown_target_is_one_line(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", {"a": _stage("a", [])})
    proc = _repro(root, "-j", "2", "--dry", "nosuch")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "error: no such stage: nosuch (Stage 'nosuch' not found inside 'dvc.yaml' file)"
    assert _repro(root, "-j", "2", "--dry", "a").returncode == 0


def _time_repro_project(root: Path) -> Path:
    """A tiny DVC project holding copies of time_repro.py and what it runs (its repository is the folder
    above scripts/)."""
    _project(root, {"a": _stage("a", [], sleep=0.2), "b": _stage("b", [], sleep=0.2)})
    (root / "scripts").mkdir()
    for name in ("time_repro.py", "repro.py", "_venv.py", "_progress.py"):
        shutil.copy(SCRIPTS / name, root / "scripts" / name)
    (root / "lib").symlink_to(SCRIPTS.parent / "lib", target_is_directory=True)
    (root / ".gitignore").write_text("/lib\n")
    return root


def test_time_repro_checks_its_arguments_before_it_removes_anything(tmp_path: Path) -> None:
    """A typo after --fresh, or a stage that does not exist, used to cost every run's checkpoints and the
    last timing file before scripts/repro.py refused the argument; --replay of that file deleted it first."""
    root = _time_repro_project(tmp_path / "p")
    ckpt = root / "runs" / "baseline" / "en-de" / "seed1" / "checkpoints"
    ckpt.mkdir(parents=True)
    timing = root / "reports" / "repro_timing.json"
    timing.parent.mkdir()
    timing.write_text("{}\n")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "scripts/time_repro.py", "-j", "2", *args], cwd=root, capture_output=True,
                              text=True, timeout=300)

    for args, rc, says in ((["--fresh", "--bogus"], 2, "unrecognized arguments: --bogus"),
                           (["--fresh", "nosuch"], 1, "error: no such stage: nosuch"),
                           (["--fresh", "--dry"], 2, "--fresh: nothing runs"),
                           (["--timing", "t.json"], 2, "writes reports/repro_timing.json itself"),
                           (["--replay", "reports/repro_timing.json"], 1, "error: reports/repro_timing.json")):
        proc = run(*args)
        out = proc.stdout + proc.stderr  # (--replay says its error on stdout)
        assert proc.returncode == rc and says in out and "Traceback" not in out, (args, out)
        assert ckpt.is_dir() and timing.read_text() == "{}\n", args
    help_text = run("--help").stdout
    assert help_text.startswith("usage: time_repro.py") and "--fresh" in help_text and "repro_timing.json" in help_text


def test_a_stage_that_must_wait_holds_back_the_queue_unless_nothing_waits_for_it() -> None:
    """At the end of a default run: the last training run on one core, then (all ready) prepare_multi
    (alone, nothing downstream) and the analyses (shared, nothing downstream): the analyses pass it."""
    names = ("train", "prepare_multi", "analyze1", "analyze2", "fork", "baseline")
    p = repro.Plan(order=list(names), needs={n: set() for n in names},
                   shares={"train", "analyze1", "analyze2", "baseline"},
                   downstream={"train": 1, "fork": 5, "baseline": 2})
    assert repro.to_start(p, ["prepare_multi", "analyze1", "analyze2"], {"train"}, 2) == ["analyze1"]
    assert repro.to_start(p, ["prepare_multi", "analyze1", "analyze2"], set(), 2) == ["prepare_multi"]
    # a stage others wait for (a fork, alone here) holds back everything behind it, leaves included
    assert repro.to_start(p, ["fork", "baseline", "analyze1"], {"train"}, 2) == []
    # nothing changes where everything fits: most urgent first, up to `jobs`
    assert repro.to_start(p, ["baseline", "analyze1", "analyze2"], set(), 2) == ["baseline", "analyze1"]
    assert repro.to_start(p, ["analyze1"], {"train", "baseline"}, 2) == []


def test_simulate_follows_the_scheduling_rules_on_given_durations() -> None:
    """a runs alone (c and d wait for it, b may not start beside it); then b and c side by side, d
    in c's slot; from 15 s to 17 s d runs alone on one core."""
    p = repro.Plan(order=["a", "b", "c", "d"], needs={"a": set(), "b": set(), "c": {"a"}, "d": {"a"}},
                   downstream={"a": 2}, shares={"b", "c", "d"})
    times = repro.simulate(p, {"a": 10.0, "b": 5.0, "c": 3.0, "d": 4.0}, jobs=2)
    assert times == {"a": (0.0, 10.0), "b": (10.0, 15.0), "c": (10.0, 13.0), "d": (13.0, 17.0)}
    assert repro.idle_share_seconds(times, p.shares) == 2.0  # a ran alone too, but it uses every core
    assert repro.simulate(p, {"a": 10.0, "b": 5.0, "c": 3.0, "d": 4.0}, jobs=1)["d"] == (18.0, 22.0)
    with pytest.raises(KeyError, match="no recorded duration for d"):
        repro.simulate(p, {"a": 1.0, "b": 1.0, "c": 1.0}, jobs=2)



def test_plan_counts_the_stages_downstream_of_each_and_what_each_waits_for(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """repro.plan on a DVC graph (a and b, then c, then d; e on its own): a stage's priority is the
    number of planned stages that depend on it, not the number it depends on."""
    root = _project(tmp_path / "p", {"a": _stage("a", []), "b": _stage("b", []),
                                     "c": _stage("c", ["a.out", "b.out"]), "d": _stage("d", ["c.out"], shares=False),
                                     "e": _stage("e", [])})
    monkeypatch.chdir(root)  # as `make repro` runs it: DVC names the stages relative to the project
    p = repro.plan(root, [], force=True)
    assert p.order == ["a", "b", "c", "d", "e"]
    assert p.downstream == {"a": 2, "b": 2, "c": 1, "d": 0, "e": 0}
    assert p.needs == {"a": set(), "b": set(), "c": {"a", "b"}, "d": {"c"}, "e": set()}
    assert p.shares == {"a", "b", "c", "e"}
    assert repro.next_ready(p, set(), set()) == ["a", "b", "e"]


@pytest.mark.parametrize("value", ["train_baseline=0", "train_baseline=-1", "=1.5", "train_baseline=soon",
                                   "train_baseline"])
def test_estimate_hours_must_be_positive(value: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=f"expected GROUP=HOURS .*got '{value}'"):
        repro._group_hours(value)
    assert repro._group_hours("train_baseline=1.41") == ("train_baseline", 1.41)

def test_replay_schedules_a_recorded_runs_durations_by_the_current_rules(tmp_path: Path) -> None:
    """`--replay`: nothing runs; the recorded durations (here as if a and b had run one after the
    other) are scheduled by this checkout's rules (a and b side by side)."""
    root = _project(tmp_path / "p", {"a": _stage("a", []), "b": _stage("b", []),
                                     "c": _stage("c", ["a.out", "b.out"], shares=False)})
    record = {"total_seconds": 9.0, "intervals": {"a": [0.0, 4.0], "b": [4.0, 8.0], "c": [8.0, 9.0]}}
    (root / "t.json").write_text(json.dumps(record))
    proc = _repro(root, "-j", "2", "--replay", "t.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "recorded: 9.0 s, a stage that shares the machine ran alone for 8.0 s" in proc.stdout, proc.stdout
    assert "replayed by these rules: 5.0 s, a stage that shares the machine ran alone for 0.0 s" in proc.stdout
    assert not any((root / f"{s}.out").exists() for s in "abc")
    del record["intervals"]["c"]
    (root / "t.json").write_text(json.dumps(record))
    proc = _repro(root, "-j", "2", "--replay", "t.json")
    assert proc.returncode == 1 and "t.json" in proc.stdout and "no recorded duration for c" in proc.stdout
    (root / "t.json").write_text(json.dumps({"total_seconds": 9.0}))  # some other JSON file
    proc = _repro(root, "-j", "2", "--replay", "t.json")
    assert proc.returncode == 1 and "t.json: not a --timing record: no key 'intervals'" in proc.stdout, proc.stdout


def test_estimate_schedules_planned_hours_per_stage_group(tmp_path: Path) -> None:
    """`--estimate`: nothing runs; every stage of a named group takes its hours, the rest none: two
    parallel a-stages and a b-stage after both take 1 + 2 hours on two jobs, 4 on one."""
    a = _stage("a${item.i}", [])
    root = _project(tmp_path / "p", {"a": {"matrix": {"i": [1, 2]}, **a}, "b": _stage("b", ["a1.out", "a2.out"]),
                                     "c": _stage("c", ["b.out"], shares=False)})
    for jobs, wall in (("2", "3.0"), ("1", "4.0")):
        proc = _repro(root, "-j", jobs, "--estimate", "a=1", "--estimate", "b=2")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"3 timed stage(s) of 4, {jobs} at a time (a 1 h, b 2 h; every other stage 0 h):" in proc.stdout
        assert f"4.0 stage-hours, wall time {wall} h" in proc.stdout, proc.stdout
    assert not any(root.glob("*.out"))
    proc = _repro(root, "-j", "2", "--estimate", "train_x=1")
    assert proc.returncode == 1 and "no planned stage in train_x (groups: a, b, c)" in proc.stdout
    proc = _repro(root, "-j", "2", "--estimate", "a=soon")
    assert proc.returncode == 2 and "expected GROUP=HOURS" in proc.stderr


BAR = """import sys, time
from tqdm import tqdm
bar = tqdm(total=10, desc="train fake-1", unit="upd", mininterval=0)
for _ in range(10):
    time.sleep(0.4)
    bar.update(1)
bar.close()
open(sys.argv[1], "w").write("x")
"""


@pytest.mark.slow
def test_the_status_line_shows_a_stages_own_tqdm_progress(tmp_path: Path) -> None:
    """A stage that draws a tqdm bar beside a silent one: `make repro`'s status line repeats the bar's
    count, rate and ETA from the stage's log, and the silent stage's running time. Without the
    pipeline's metrics (this tiny project) no summary is printed and nothing fails."""
    root = _project(tmp_path / "p", {})
    (root / "bar.py").write_text(BAR)
    stages = {"fake": {"cmd": f"{sys.executable} bar.py fake.out", "deps": ["bar.py"], "outs": ["fake.out"],
                       "params": ["parallel"]},
              "quiet": _stage("quiet", [], sleep=2.0)}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    proc = _repro(root, "-j", "2", "--status-every", "0.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = [line for line in proc.stdout.splitlines() if line.startswith("[") and " done] " in line]
    counts = [int(m) for line in status for m in re.findall(r"fake train (\d+)/10", line)]
    assert any(0 < n < 10 for n in counts), proc.stdout
    assert any(re.search(r"fake train \d+/10 [0-9.]+(upd/s|s/upd) ETA [0-9:]+", line) for line in status), proc.stdout
    assert any(re.search(r"\| quiet running 0:0\d|quiet running 0:0\d \|", line) for line in status), proc.stdout
    assert "report:" not in proc.stdout and proc.stdout.rstrip().splitlines()[-1].startswith("done: 2 stage(s)")
    assert "train fake-1: " in (root / ".dvc" / "tmp" / "repro" / "fake.log").read_text()  # the stage's own bar
    bad = _repro(root, "-j", "2", "--status-every", "0")
    assert bad.returncode != 0 and "--status-every" in bad.stderr


def test_timing_files_record_paths_relative_to_the_repository(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "reports").mkdir(parents=True)
    assert repro.portable_arg(str(root / "reports" / "t.json"), root) == "reports/t.json"
    assert repro.portable_arg("reports/t.json", root) == "reports/t.json"
    assert repro.portable_arg("-j", root) == "-j"
    assert repro.portable_arg(f"--timing={root / 'reports' / 't.json'}", root) == "--timing=reports/t.json"
    outside = str(tmp_path / "elsewhere.json")
    assert repro.portable_arg(outside, root) == outside  # not the repository's: left as given
    repro.write_json(root / "reports" / "t.json", {"a": 1})
    assert json.loads((root / "reports" / "t.json").read_text()) == {"a": 1}
    assert [f.name for f in (root / "reports").iterdir()] == ["t.json"]  # no temporary file left


@pytest.mark.slow
def test_time_repro_records_no_absolute_path(tmp_path: Path) -> None:
    """scripts/time_repro.py, run from a copy of the scripts in a tiny DVC project (its repository
    is the folder above scripts/), writes reports/repro_timing.json with repository-relative paths."""
    root = _project(tmp_path / "p", {"a": _stage("a", [], sleep=0.2), "b": _stage("b", [], sleep=0.2)})
    (root / "scripts").mkdir()
    for name in ("time_repro.py", "repro.py", "_venv.py", "_progress.py"):
        shutil.copy(SCRIPTS / name, root / "scripts" / name)
    (root / "lib").symlink_to(SCRIPTS.parent / "lib", target_is_directory=True)
    (root / ".gitignore").write_text("/lib\n")
    proc = subprocess.run([sys.executable, "scripts/time_repro.py", "-j", "2"], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (root / "reports" / "repro_timing.json").read_text()
    record = json.loads(text)
    assert record["command"] == "python scripts/repro.py -j 2 --timing reports/repro_timing.json"
    assert str(tmp_path) not in text and set(record["by_stage"]) == {"a", "b"}



def test_fresh_removes_the_pipelines_resume_state_only(tmp_path) -> None:
    """time_repro --fresh: the pipeline's runs lose their checkpoints; the scratch draws of asr_draws /
    st_length (a workdir whose .gitignore is `*`) keep theirs, so their interrupted runs still resume."""
    import time_repro

    runs = tmp_path / "runs"
    for d in ("asr_shared/checkpoints", "baseline/en-de/seed1/checkpoints", "draws/params/seed2/runs/asr_shared/checkpoints",
              "st_length/720/runs/local/en-de/seed1/checkpoints"):
        (runs / d).mkdir(parents=True)
    for scratch in ("draws", "st_length"):
        (runs / scratch / ".gitignore").write_text("*\n")
    assert time_repro.pipeline_checkpoints(runs) == [runs / "asr_shared/checkpoints",
                                                     runs / "baseline/en-de/seed1/checkpoints"]


def _corpus_project(root: Path, mustc_root: str) -> Path:
    """A DVC project shaped like the pipeline's start: the demo corpus stage per pair, and `prepare`
    reading ``${data.mustc_root}/${item.pair}``, with the repository's params.yaml (mustc_root set)."""
    params = yaml.safe_load((SCRIPTS.parent / "params.yaml").read_text())
    params["data"]["mustc_root"] = mustc_root
    make = f'{sys.executable} -c "import os, sys; os.makedirs(sys.argv[1] + \'/data/train\')"'
    stages = {"corpus": {"matrix": {"pair": "${pairs}"}, "cmd": make + " data/mustc-demo/${item.pair}",
                         "deps": ["input.txt"], "outs": ["data/mustc-demo/${item.pair}"]},
              "prepare": {"matrix": {"pair": "${pairs}"},
                          "cmd": f'{sys.executable} -c "{STAMP.format(sleep=0)}" prepared-${{item.pair}}.out',
                          "deps": ["${data.mustc_root}/${item.pair}"], "outs": ["prepared-${item.pair}.out"]}}
    _project(root, stages)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def test_a_real_corpus_root_is_checked_before_dvc_runs_and_the_demo_corpus_is_not_built(tmp_path: Path) -> None:
    """data.mustc_root on a real copy: nothing reads the demo corpus, so `make repro` leaves its stages
    out; a root `prepare` could not read stops before DVC runs, with the reader's one line naming the
    param and what to set (DVC's own check would only say "No such file or directory")."""
    mustc = tmp_path / "MUSTC_v1.0"
    for pair in ("en-de", "en-es", "en-it"):
        for split in ("train", "dev", "tst-COMMON"):
            (mustc / pair / "data" / split / "txt").mkdir(parents=True)
            (mustc / pair / "data" / split / "wav").mkdir()
            for lang in ("yaml", *pair.split("-")):
                (mustc / pair / "data" / split / "txt" / f"{split}.{lang}").touch()
    demo = _repro(_corpus_project(tmp_path / "demo", "data/mustc-demo"), "--dry")
    assert demo.returncode == 0 and "corpus@en-de" in demo.stdout and "prepare@en-de" in demo.stdout, demo.stdout + demo.stderr
    real = _repro(_corpus_project(tmp_path / "real", str(mustc)), "--dry")
    assert real.returncode == 0, real.stdout + real.stderr
    assert "corpus@" not in real.stdout and "3 stage(s) to run" in real.stdout and "prepare@en-it" in real.stdout
    wrong = _repro(_corpus_project(tmp_path / "wrong", str(mustc / "en-de")), "-j", "1")
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert f"error: data.mustc_root ({mustc / 'en-de'}): " in wrong.stderr
    assert "this is a language pair's folder" in wrong.stderr and "Running stage" not in wrong.stdout
    assert not list((tmp_path / "wrong").glob("prepared-*.out"))


# A stage that says it started, and on SIGTERM or SIGINT records which, then takes `linger` seconds
# to clean up (a training run saving its state) before it exits with 128 + the signal.
_SIGNALLED_STAGE = """
import signal, sys, time
out, linger = sys.argv[1], float(sys.argv[2])
def stop(signum, frame):
    open(out, "a").write(signal.Signals(signum).name + "\\n")
    time.sleep(linger)
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
open(out, "w").write("started\\n")
time.sleep(60)
"""

_DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {scripts!r})
import repro
root, linger = Path(sys.argv[1]), sys.argv[2]
import signal
signal.signal(signal.SIGTERM, repro._on_sigterm)
plan = repro.Plan(order=["a", "b"], needs={{"a": set(), "b": set()}}, shares={{"a", "b"}})
rc, _ = repro.execute(plan, 2, lambda name: [sys.executable, "-c", {stage!r}, str(root / name), linger], root)
sys.exit(rc)
"""


def _start_two_stages(tmp_path: Path, linger: float) -> subprocess.Popen:
    import signal
    import time

    driver = _DRIVER.format(scripts=str(SCRIPTS), stage=_SIGNALLED_STAGE)
    # SIGINT at its default in the driver, whatever this process inherited (a background job's is ignored)
    proc = subprocess.Popen([sys.executable, "-c", driver, str(tmp_path), str(linger)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not all((tmp_path / n).is_file() and (tmp_path / n).read_text().startswith("started") for n in "ab"):
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return proc


def test_sigterm_reaches_every_running_stage_as_sigterm(tmp_path: Path) -> None:
    """A scheduler's pre-emption (SIGTERM to repro.py): the stages run in sessions of their own, so it
    passes SIGTERM on to each (on which training saves its state), waits for them and exits 143."""
    import signal

    proc = _start_two_stages(tmp_path, linger=0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert "interrupted by SIGTERM: stopped a, b" in out, out
    for name in "ab":
        assert (tmp_path / name).read_text() == "started\nSIGTERM\n"


def test_a_second_interrupt_kills_the_stages_without_a_traceback(tmp_path: Path) -> None:
    """Ctrl-C, then Ctrl-C again while the stages clean up: they are killed, repro.py still waits for
    them and exits 130 with one line each time, not a traceback."""
    import signal
    import time

    proc = _start_two_stages(tmp_path, linger=30)
    proc.send_signal(signal.SIGINT)
    deadline = time.time() + 30
    while not all("SIGINT" in (tmp_path / n).read_text() for n in "ab"):
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)  # far less than the stages' 30 s of cleaning up
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted again: killing the running stages" in out and "interrupted by SIGINT: stopped a, b" in out, out


def test_a_params_file_dvc_cannot_read_is_one_line(tmp_path: Path) -> None:
    """With -j given the script reads no params itself; DVC's error on a params.yaml it cannot parse was a
    traceback of 100 lines. Now it is DVC's own message with its cause, on one line."""
    root = _project(tmp_path / "p", {"a": {"cmd": "echo ${x}"}})
    (root / "params.yaml").write_text("x: [1\nparallel:\n  jobs: 2\n")
    proc = _repro(root, "-j", "1", "--dry")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unable to read: 'params.yaml'"), lines
