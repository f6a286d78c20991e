"""The DVC graph tells the truth: every module a stage imports is one of its deps, paths agree with
lib/layout.py, stages that need no torch do not import it. Static (ast + yaml), a few seconds."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dvc_graph import REPO, code_deps, covered, dvc_stages, import_closure, stage_script

STAGES = dvc_stages()
DVC_YAML = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
TORCH_FREE_STAGES = ("corpus_stats", "report")


def _exempt(path: Path) -> bool:
    """An ``__init__.py`` that holds nothing but a docstring cannot change what a stage computes."""
    if path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_deps_cover_its_import_closure(name: str) -> None:
    stage = STAGES[name]
    script = stage_script(stage)
    assert script.is_file(), f"{name}: {script} does not exist"
    deps = code_deps(stage)
    rel = script.relative_to(REPO).as_posix()
    assert rel in deps, f"{name}: its own script {rel} is not in its deps"
    files, _ = import_closure(script)
    missing = sorted(f.relative_to(REPO).as_posix() for f in files if not covered(f, deps) and not _exempt(f))
    assert not missing, f"dvc.yaml stage {name!r} imports modules its deps do not list: {missing}"


def test_closure_sees_lazy_and_from_imports(tmp_path: Path) -> None:
    """The checker itself: a function-level import and `from pkg import module` are both followed."""
    (tmp_path / "lib" / "sub").mkdir(parents=True)
    (tmp_path / "stages").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "sub" / "__init__.py").write_text("")
    (tmp_path / "lib" / "a.py").write_text("def f():\n    from lib.sub import b\n")
    (tmp_path / "lib" / "sub" / "b.py").write_text("import numpy\n")
    (tmp_path / "stages" / "_common.py").write_text("")
    (tmp_path / "stages" / "s.py").write_text("from _common import x\nimport lib.a\n")
    files, external = import_closure(tmp_path / "stages" / "s.py", root=tmp_path)
    rel = {f.relative_to(tmp_path.resolve()).as_posix() for f in files}
    assert rel == {"stages/s.py", "stages/_common.py", "lib/__init__.py", "lib/a.py", "lib/sub/__init__.py",
                   "lib/sub/b.py"}
    assert external == {"numpy"}
    assert not covered(tmp_path / "lib" / "sub" / "b.py", ["lib/a.py", "lib/su"], root=tmp_path)
    # a name that a package's __getattr__ imports from a submodule on first use (its _LAZY table)
    (tmp_path / "lib" / "pkg").mkdir()
    (tmp_path / "lib" / "pkg" / "__init__.py").write_text('_LAZY = {"Thing": "variant"}\n')
    (tmp_path / "lib" / "pkg" / "variant.py").write_text("")
    (tmp_path / "stages" / "t.py").write_text("from lib.pkg import Thing\n")
    files, _ = import_closure(tmp_path / "stages" / "t.py", root=tmp_path)
    assert tmp_path.resolve() / "lib" / "pkg" / "variant.py" in files
    assert covered(tmp_path / "lib" / "sub" / "b.py", ["lib/sub"], root=tmp_path)


@pytest.mark.parametrize("name", TORCH_FREE_STAGES)
def test_stages_that_need_no_torch_do_not_import_it(name: str) -> None:
    _, external = import_closure(stage_script(STAGES[name]))
    assert "torch" not in external, f"{name} imports torch (directly or through lib/)"


def test_params_load_without_torch() -> None:
    code = ("import sys; from lib.params import load_params; load_params('params.yaml'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_dvc_yaml_paths_follow_lib_layout() -> None:
    """Stage by stage (rendered by DVC itself), the outputs are where lib/layout.py says."""
    from dvc.repo import Repo

    from lib import layout
    from lib.layout import RunPaths
    from lib.params import load_params

    p = load_params(REPO / "params.yaml")
    with Repo(str(REPO)) as repo:
        stages = {s.addressing: s for s in repo.index.stages}

    def outs(name: str) -> set[str]:
        return {o.def_path for o in stages[name].outs}

    def deps(name: str) -> set[str]:
        return {d.def_path for d in stages[name].deps}

    def rel(path: Path) -> str:
        return path.relative_to(REPO).as_posix()

    def run_outs(run: RunPaths) -> set[str]:
        return {rel(run.model), rel(run.timing), rel(run.decoded), rel(run.metrics), rel(run.curves)}

    def asr_outs(run: RunPaths) -> set[str]:  # ASR runs also keep a fork state (asr.fork_updates)
        return run_outs(run) | {rel(run.fork_state)}

    assert outs("train_asr_shared") == asr_outs(RunPaths(REPO, "asr_shared"))
    # local.fork: shared -> one fork for every pair, from the shared ASR training's fork state and every
    # pair's windows; each train_asr_local@<pair> copies it
    fork = RunPaths(REPO, "asr_local_shared")
    assert outs("train_asr_local_shared") == run_outs(fork)
    assert {rel(RunPaths(REPO, "asr_shared").fork_state), "data/windows"} <= deps("train_asr_local_shared")
    assert all(rel(layout.windows_dir(REPO, pair)).startswith("data/windows/") for pair in p.pairs)
    for pair in p.pairs:
        assert outs(f"train_asr@{pair}") == asr_outs(RunPaths(REPO, "asr", pair))
        assert rel(RunPaths(REPO, "asr", pair).fork_state) in deps(f"train_asr_local@{pair}")
        assert outs(f"train_asr_local@{pair}") == run_outs(RunPaths(REPO, "asr_local", pair))
        assert {rel(fork.model), rel(fork.metrics), rel(fork.curves)} <= deps(f"train_asr_local@{pair}")
        for seed in p.seeds:
            assert outs(f"train_baseline@{pair}-{seed}") == run_outs(RunPaths(REPO, "baseline", pair, seed))
            assert outs(f"train_local@{pair}-{seed}") == run_outs(RunPaths(REPO, "local", pair, seed))
        assert rel(layout.windows_dir(REPO, pair)) in outs(f"select_windows@{pair}")
        assert rel(layout.windows_metrics(REPO, pair)) in outs(f"select_windows@{pair}")
        assert rel(layout.analysis_dir(REPO, pair)) in outs(f"analyze@{pair}")
        assert rel(layout.analysis_metrics(REPO, pair)) in outs(f"analyze@{pair}")
        for model in ("asr", "st"):
            assert outs(f"health_{model}@{pair}") == {rel(layout.health_data(REPO, pair, model)),
                                                      rel(layout.health_metrics(REPO, pair, model)),
                                                      rel(layout.health_plot(REPO, pair, model))}
        assert outs(f"corpus_stats@{pair}") == {rel(layout.corpus_metrics(REPO, pair)),
                                                rel(layout.corpus_plots(REPO, pair))}
    assert outs("report") == {layout.REPORT.as_posix(), layout.SUMMARY.as_posix(), layout.SMOOTHING_PLOTS.as_posix()}
    report_deps = {d.def_path for d in stages["report"].deps}
    assert {layout.VARIANT_METRICS.as_posix(), layout.VARIANT_DECODED.as_posix()} <= report_deps
    # The variants' stages exist only when their systems are listed (all empty by default).
    assert not [name for name in stages if "smoothing" in name or name.startswith("train_multi")]
    assert "prepare_multi" in stages  # the joint vocabulary is always built (cheap)
    # The analysed ST model is the baseline run of analysis.st_seed.
    for pair in p.pairs:
        deps = {d.def_path for d in stages[f"analyze@{pair}"].deps}
        assert rel(RunPaths(REPO, "baseline", pair, p.analysis.st_seed).model) in deps


def test_report_reads_no_models() -> None:
    """The report depends on small files only: nothing under runs/ (models, checkpoints)."""
    deps = [d for d in STAGES["report"]["deps"] if isinstance(d, str)]
    assert not [d for d in deps if d.startswith("runs")], deps


def test_training_stages_can_be_saved_to_the_run_cache() -> None:
    """The per-seed recipe and `dvc exp` restore training runs from DVC's run-cache. DVC saves a stage there
    only when no output is `persist` and no plain output (`outs`, not metrics or plots) has `cache: false`
    (dvc/stage: `no_cache_outs`). So a training stage's per-run metrics file is a DVC-cached output; the
    analysis stages (seconds to minutes, never queued per seed) keep theirs in git."""
    analysis = {"corpus_stats", "analyze", "select_windows", "health_asr", "health_st", "band_test", "report"}
    for name, stage in STAGES.items():
        for kind in ("outs", "metrics", "plots"):
            for out in stage.get(kind, []):
                if isinstance(out, dict):
                    (path, opts), = out.items()
                    assert not opts.get("persist"), f"{name}: {path} is persist"
                    if kind == "outs" and name not in analysis:
                        assert opts.get("cache", True), f"{name}: plain output {path} has cache: false"


def test_summary_json_is_the_only_declared_metrics_file() -> None:
    """`dvc exp show` / `dvc metrics diff` compare the headline only: metrics/summary.json (the report stage)
    is the one declared metrics file; every per-run, corpus, health, analysis and window file is a plain
    output. Its keys: per pair at most 14 (BLEU and chrF with their intervals for both systems, local −
    baseline with its interval, ASR WER, C_ii, the windows and their ρ), so three pairs fit one screen."""
    declared = [(name, out) for name, stage in STAGES.items() for out in stage.get("metrics", [])]
    assert [(name, next(iter(out)) if isinstance(out, dict) else out) for name, out in declared] == \
        [("report", "metrics/summary.json")]
    assert "metrics" not in DVC_YAML
    import json

    from tests.report import report_fixture as rf

    flat = json.loads((rf.FIXTURES / "summary_no_controls.json").read_text(encoding="utf-8"))
    pairs = {key.split("/")[0] for key in flat}
    assert len(pairs) == 2 and len(flat) == 14 * len(pairs)  # 3 pairs: 42 columns beside the params


def test_variant_stages_follow_lib_layout(tmp_path: Path) -> None:
    """With smoothing systems listed, DVC renders one train_smoothing stage per system x pair x seed and
    one train_asr_smoothing per ASR system x pair, with the outputs lib/layout.py names, the baseline of
    the same seed and the folder of smoothed ASR models among the deps, and the report downstream."""
    import shutil

    import yaml
    from dvc.repo import Repo

    from lib import layout
    from lib.layout import RunPaths

    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text(encoding="utf-8"))
    params["smoothing"].update(systems=["rec", "band"], asr_systems=["rec"], pairs=["en-de", "en-it"], seeds=[1, 3])
    params["multi"].update(systems=["baseline", "group"], seeds=[1, 2], asr_init="en-es")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)
    with Repo(str(tmp_path)) as repo:
        stages = {s.name: s for s in repo.index.stages}
        graph_edges = {(a.name, b.name) for a, b in repo.index.graph.edges}

    def rel(path: Path) -> str:
        return path.relative_to(tmp_path).as_posix()

    def run_outs(run: RunPaths) -> set[str]:
        return {rel(run.model), rel(run.timing), rel(run.decoded), rel(run.metrics), rel(run.curves)}

    smoothing = sorted(n for n in stages if n.startswith("train_smoothing@"))
    assert len(smoothing) == 2 * 2 * 2
    assert sorted(n for n in stages if n.startswith("train_asr_smoothing@")) == [
        "train_asr_smoothing@rec-en-de", "train_asr_smoothing@rec-en-it"]
    for system in ("rec", "band"):
        for pair in ("en-de", "en-it"):
            for seed in (1, 3):
                name = f"train_smoothing@{system}-{pair}-{seed}"
                assert {o.def_path for o in stages[name].outs} == run_outs(
                    RunPaths(tmp_path, "smoothing", pair, seed, variant=system))
                deps = {d.def_path for d in stages[name].deps}
                assert rel(RunPaths(tmp_path, "baseline", pair, seed).model) in deps
                assert "runs/variants/smoothing_asr" in deps
                assert f"smoothing.defs.{system}" in {k for d in stages[name].deps if hasattr(d, "params")
                                                      for k in d.params}
                # DVC's graph points from a stage to the stages whose outputs it reads
                assert ("report", name) in graph_edges
                assert (name, f"train_baseline@{pair}-{seed}") in graph_edges
        for pair in ("en-de", "en-it"):
            if system == "rec":
                assert {o.def_path for o in stages[f"train_asr_smoothing@rec-{pair}"].outs} == run_outs(
                    RunPaths(tmp_path, "smoothing_asr", pair, variant="rec"))
                assert (f"train_smoothing@rec-{pair}-1", f"train_asr_smoothing@rec-{pair}") in graph_edges
    assert layout.SMOOTHING_PLOTS.as_posix() in {o.def_path for o in stages["report"].outs}
    # the multilingual runs (Gong et al.): one per system x seed, from the ASR model of multi.asr_init
    assert sorted(n for n in stages if n.startswith("train_multi@")) == [
        "train_multi@baseline-1", "train_multi@baseline-2", "train_multi@group-1", "train_multi@group-2"]
    for system in ("baseline", "group"):
        for seed in (1, 2):
            name = f"train_multi@{system}-{seed}"
            run = RunPaths(tmp_path, "multi", None, seed, variant=system)
            assert {o.def_path for o in stages[name].outs} == run_outs(run) | {
                rel(layout.multi_plots(tmp_path, system, seed))}
            assert (name, "prepare_multi") in graph_edges and (name, "train_asr@en-es") in graph_edges
            assert ("report", name) in graph_edges
    assert {o.def_path for o in stages["prepare_multi"].outs} == {layout.PREPARED_MULTI.as_posix()}


def test_committed_lock_holds_only_the_pipelines_stages() -> None:
    """DVC never drops a lock entry when a stage is renamed or removed, and it re-parses the whole
    dvc.lock (pure-Python YAML, ≈ 1 s for 250 kB) around every stage it runs: 15 entries of a
    renamed stage cost 0.43 s per stage run (≈ 26 s per full `dvc repro`). So the committed lock,
    which goes with the committed params, holds exactly the stages `dvc.yaml` renders from them."""
    import yaml
    from dvc.repo import Repo

    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    with Repo(str(REPO)) as repo:
        stages = {s.addressing for s in repo.index.stages}
    stale = sorted(set(lock["stages"]) - stages)
    assert not stale, f"dvc.lock has entries of stages the pipeline no longer has: {stale[:5]}"
    assert set(lock["stages"]) == stages, sorted(stages - set(lock["stages"]))[:5]


def test_control_stages_follow_lib_layout(tmp_path: Path) -> None:
    """The controls for Algorithm 1 exist only when listed: none by default; with `controls.systems` one
    train_control stage per system x pair x seed, from the local system's ASR model and windows, with the
    outputs lib/layout.py names; with `controls.band_seeds` one band_test per pair x seed on that seed's
    baseline. The report is downstream of both."""
    import shutil

    import yaml
    from dvc.repo import Repo

    from lib import layout
    from lib.layout import RunPaths

    assert all("matrix" in STAGES[n] for n in ("train_control", "band_test"))  # per listed item only
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text(encoding="utf-8"))
    assert params["controls"]["systems"] == [] and params["controls"]["band_seeds"] == []
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)
    with Repo(str(tmp_path)) as repo:
        assert not [s.name for s in repo.index.stages
                    if s.name.startswith(("train_control", "train_asr_control", "band_test"))]
    params["controls"].update(systems=["local_uniform", "local_shuffled"], asr_systems=["local_uniform"], band_seeds=[2])
    params.update(pairs=["en-de", "en-it"], seeds=[1, 2])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    with Repo(str(tmp_path)) as repo:
        stages = {s.name: s for s in repo.index.stages}
        graph_edges = {(a.name, b.name) for a, b in repo.index.graph.edges}

    def rel(path: Path) -> str:
        return path.relative_to(tmp_path).as_posix()

    controls = sorted(n for n in stages if n.startswith("train_control@"))
    assert len(controls) == 2 * 2 * 2
    for system in ("local_uniform", "local_shuffled"):
        for pair in ("en-de", "en-it"):
            for seed in (1, 2):
                name = f"train_control@{system}-{pair}-{seed}"
                run = RunPaths(tmp_path, "controls", pair, seed, variant=system)
                assert {o.def_path for o in stages[name].outs} == {rel(run.model), rel(run.timing), rel(run.decoded),
                                                                   rel(run.metrics), rel(run.curves)}
                deps = {d.def_path for d in stages[name].deps}
                assert {rel(RunPaths(tmp_path, "asr_local", pair).model), rel(layout.windows_json(tmp_path, pair))} <= deps
                assert ("report", name) in graph_edges and (name, f"train_asr_local@{pair}") in graph_edges
                # the control's own fork, when it has one, is upstream (through the folder it depends on)
                assert rel(RunPaths(tmp_path, "controls_asr", variant="local_uniform").run_dir.parent) in deps
                assert (name, "train_asr_control@local_uniform") in graph_edges
    # one fork per control listed in asr_systems, for every pair: local's shared fork rule
    assert sorted(n for n in stages if n.startswith("train_asr_control")) == ["train_asr_control@local_uniform"]
    fork = RunPaths(tmp_path, "controls_asr", variant="local_uniform")
    name = "train_asr_control@local_uniform"
    assert {o.def_path for o in stages[name].outs} == {rel(fork.model), rel(fork.timing), rel(fork.decoded),
                                                       rel(fork.metrics), rel(fork.curves)}
    deps = {d.def_path for d in stages[name].deps}
    assert {rel(RunPaths(tmp_path, "asr_shared").fork_state), "data/windows"} <= deps
    assert (name, "train_asr_shared") in graph_edges and all(
        (name, f"select_windows@{pair}") in graph_edges for pair in ("en-de", "en-it"))
    assert sorted(n for n in stages if n.startswith("band_test@")) == ["band_test@en-de-2", "band_test@en-it-2"]
    for pair in ("en-de", "en-it"):
        name = f"band_test@{pair}-2"
        assert {o.def_path for o in stages[name].outs} == {rel(layout.band_test_metrics(tmp_path, pair, 2)),
                                                           rel(layout.band_test_plot(tmp_path, pair, 2))}
        assert rel(RunPaths(tmp_path, "baseline", pair, 2).model) in {d.def_path for d in stages[name].deps}
        assert ("report", name) in graph_edges and (name, f"select_windows@{pair}") in graph_edges


#: The attention package's modules that load on demand: those its __init__.py does not import (every
#: variant's module; a new one is found here without a list to extend).
_ATTENTION = REPO / "lib" / "model" / "attention"
ON_DEMAND_ATTENTION = tuple(sorted(
    f.relative_to(REPO).as_posix() for f in _ATTENTION.glob("[!_]*.py")
    if f.resolve() not in import_closure(_ATTENTION / "__init__.py")[0]))
#: Code of the attention variants (smoothing, head selection, any new one): loaded only by the stages that
#: train them.
VARIANT_CODE = ON_DEMAND_ATTENTION + ("lib/train/head_selection.py", "lib/params/smoothing.py", "lib/params/multi.py")
BASELINE_CHAIN = ("train_asr", "train_asr_shared", "train_asr_local", "train_asr_local_shared", "train_baseline",
                  "train_local", "analyze", "select_windows", "health_asr", "health_st", "band_test")


@pytest.mark.parametrize("name", BASELINE_CHAIN)
def test_variant_code_is_no_dep_of_the_baseline_chain(name: str) -> None:
    """An edit to a variant retrains no baseline: no stage of the baseline's chain imports or lists it."""
    deps = code_deps(STAGES[name])
    files, _ = import_closure(stage_script(STAGES[name]))
    for rel in VARIANT_CODE:
        assert REPO / rel not in files, f"{name} imports {rel}"
        assert not covered(REPO / rel, deps), f"dvc.yaml stage {name!r} lists {rel} (or its folder) in its deps"


def test_the_variants_modules_are_found_without_a_list() -> None:
    assert {"lib/model/attention/smoothing.py", "lib/model/attention/head_selection.py"} <= set(ON_DEMAND_ATTENTION)
    assert not {"lib/model/attention/full.py", "lib/model/attention/local.py"} & set(ON_DEMAND_ATTENTION)


SMOOTHING_CODE, HEAD_SELECTION_CODE = "lib/model/attention/smoothing.py", "lib/model/attention/head_selection.py"


@pytest.mark.parametrize(("name", "rel"), [("train_smoothing", SMOOTHING_CODE), ("train_asr_smoothing", SMOOTHING_CODE),
                                           ("train_multi", HEAD_SELECTION_CODE),
                                           ("train_multi", "lib/train/head_selection.py"),
                                           ("train_smoothing", "lib/params/smoothing.py"),
                                           ("train_asr_smoothing", "lib/params/smoothing.py"),
                                           ("train_multi", "lib/params/multi.py"),
                                           ("prepare_multi", "lib/params/multi.py"),
                                           ("report", "lib/params/smoothing.py"), ("report", "lib/params/multi.py")])
def test_a_variants_stages_import_and_list_its_code(name: str, rel: str) -> None:
    files, _ = import_closure(stage_script(STAGES[name]))
    assert REPO / rel in files and covered(REPO / rel, code_deps(STAGES[name]))


@pytest.mark.parametrize("name", ("train_smoothing", "train_asr_smoothing", "train_multi"))
def test_a_variants_stages_list_no_other_variants_code(name: str) -> None:
    """An edit to one variant (or a new variant's module) reruns no other variant's runs: a variant's stage
    lists the files it imports, not the lib/model or lib/train folders."""
    files, _ = import_closure(stage_script(STAGES[name]))
    deps = code_deps(STAGES[name])
    for rel in VARIANT_CODE:
        if REPO / rel not in files:
            assert not covered(REPO / rel, deps), f"dvc.yaml stage {name!r} lists {rel} (or its folder) in its deps"
