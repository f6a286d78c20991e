"""End-to-end: the DVC pipeline on a tiny demo corpus, in a temporary copy of the repository.

Checks what a user relies on: `dvc repro` builds the MuST-C layout, the prepared data, metrics and
plots; a second `dvc repro` is a no-op; changing a param marks exactly the stages that read it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.dvc_repo import TINY, TRAIN_TINY, VENV_BIN, git_commit, tiny_repo_copy
from tests.dvc_repo import run as _run


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    return tiny_repo_copy(tmp_path_factory)


@pytest.mark.slow
def test_repro_builds_mustc_layout_and_prepared_data(tiny_repo: Path) -> None:
    for pair, lang in (("en-de", "de"), ("en-es", "es")):
        for split in ("train", "dev", "tst-COMMON"):
            txt = tiny_repo / "data/mustc-demo" / pair / "data" / split / "txt"
            entries = yaml.safe_load((txt / f"{split}.yaml").read_text())
            en = (txt / f"{split}.en").read_text(encoding="utf-8").splitlines()
            tgt = (txt / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            assert len(entries) == len(en) == len(tgt) == TINY["corpus"]["splits"][split]
            assert set(entries[0]) == {"duration", "offset", "rW", "uW", "speaker_id", "wav"}
            assert (txt.parent / "wav" / entries[0]["wav"]).is_file()
        prepared = tiny_repo / "data/prepared" / pair
        report = json.loads((prepared / "report.json").read_text())
        assert report["splits"]["train"]["kept"] > 0
        for name in ("train.tsv", "dev.tsv", "tst-COMMON.tsv", "spm_asr.model", "spm_st.model"):
            assert (prepared / name).is_file(), name
        for png in ("durations.png", "encoder_length.png", "target_length.png"):
            assert (tiny_repo / "plots/corpus" / pair / png).stat().st_size > 1000
        stats = json.loads((tiny_repo / "metrics/corpus" / f"{pair}.json").read_text())
        assert stats["train"]["segments"] == report["splits"]["train"]["kept"]


@pytest.mark.slow
def test_repro_trains_analyses_and_reports(tiny_repo: Path) -> None:
    import torch

    shared_model = (tiny_repo / "runs/asr_shared/model.pt").read_bytes()  # asr.mode: shared (the demo default)
    for pair in TINY["pairs"]:
        asr = json.loads((tiny_repo / "metrics/asr" / f"{pair}.json").read_text())
        assert 0 <= asr["wer"] and asr["updates"] == TRAIN_TINY["max_updates"]
        assert asr["asr_mode"] == "shared" and asr["trained_on"] == "en-de"
        assert (tiny_repo / "runs/asr" / pair / "model.pt").read_bytes() == shared_model
        hyps = (tiny_repo / "data/decoded/asr" / pair / "hyps.tst-COMMON.txt").read_text().splitlines()
        assert len(hyps) == TINY["corpus"]["splits"]["tst-COMMON"]  # decoded on the pair's own test audio
        for system in ("baseline", "local"):
            m = json.loads((tiny_repo / "metrics" / system / pair / "seed1.json").read_text())
            assert 0 <= m["bleu"] <= 100 and 0 <= m["chrf"] <= 100
            decoded = tiny_repo / "data/decoded" / system / pair / "seed1"
            for name in ("hyps.tst-COMMON.txt", "refs.tst-COMMON.txt"):
                assert len((decoded / name).read_text().splitlines()) == TINY["corpus"]["splits"]["tst-COMMON"]
            assert list((tiny_repo / "plots/train" / system / pair / "seed1").rglob("*.tsv"))
        windows = json.loads((tiny_repo / "data/windows" / pair / "windows.json").read_text())
        spec = windows["encoder_attention"]
        assert len(spec) == 4 and [s["type"] for s in spec] == ["full", "full", "local", "local"]
        assert all(s["window"] % 2 == 1 for s in spec if s["type"] == "local")
        analysis = json.loads((tiny_repo / "metrics/analysis" / f"{pair}.json").read_text())
        assert analysis
        for png in ("fig1_spectrogram_contributions.png", "fig2_diagonality.png", "fig3_ccd_layers.png",
                    "fig4_contributions.png"):
            assert (tiny_repo / "plots/analysis" / pair / png).stat().st_size > 1000
        # local.asr_pretraining: shared (default) -> train_local starts from the baseline's ASR model
        shared = json.loads((tiny_repo / "metrics/asr_local" / f"{pair}.json").read_text())
        assert shared["asr_pretraining"] == "shared"
        local_asr = torch.load(tiny_repo / "runs/asr_local" / pair / "model.pt", weights_only=True)
        base_asr = torch.load(tiny_repo / "runs/asr" / pair / "model.pt", weights_only=True)
        assert all(torch.equal(local_asr["model"][k], base_asr["model"][k]) for k in base_asr["model"])
        for model in ("asr", "st"):  # attention health of both models (stages health_asr, health_st)
            health = json.loads((tiny_repo / "metrics/health" / pair / f"{model}.json").read_text())
            assert {"full", "w1", "alg1"} <= set(health["band_test"]) and health["summary"]["heads"] > 0
            assert (tiny_repo / "plots/health" / pair / f"{model}.png").stat().st_size > 1000
    summary = json.loads((tiny_repo / "metrics/summary.json").read_text())
    assert set(summary) >= {f"{p}/{s}/bleu" for p in TINY["pairs"] for s in ("baseline", "local")} | \
        {f"{p}/{k}" for p in TINY["pairs"] for k in ("asr_wer", "local_minus_baseline/bleu", "st_c_ii", "windows")}
    assert all(isinstance(v, (int, float, str)) for v in summary.values())  # flat
    report = (tiny_repo / "reports/report.md").read_text()
    assert "Table 2" in report and "| en-de | local |" in report and "## Attention health" in report


@pytest.mark.slow
def test_second_repro_is_noop_and_params_invalidate_only_dependents(tiny_repo: Path) -> None:
    start = time.perf_counter()
    out = _run(["dvc", "repro"], tiny_repo).stdout
    elapsed = time.perf_counter() - start
    assert "up to date" in out, out
    print(f"second dvc repro (no-op): {elapsed:.2f} s")

    params_path = tiny_repo / "params.yaml"
    original = params_path.read_text()

    def changed_by(**edits) -> set[str]:
        params = yaml.safe_load(original)
        for key, value in edits.items():
            section, _, name = key.partition("__")
            if name:
                params[section][name] = value
            else:
                params[section] = value
        params_path.write_text(yaml.safe_dump(params, sort_keys=False))
        return set(json.loads(_run(["dvc", "status", "--json"], tiny_repo).stdout))

    pairs, seeds = TINY["pairs"], TINY["seeds"]
    try:
        assert changed_by(prepare__min_frames=6) == {f"prepare@{p}" for p in pairs}  # corpus untouched
        assert {f"corpus@{p}" for p in pairs} <= changed_by(prepare__min_frames=6, corpus__noise_level=0.002)
        # One pair: nothing of that pair reruns (no stage reads the whole `pairs` list but the report,
        # the joint vocabulary of the multilingual model and the one fork of local.fork: shared, whose
        # windows are the widest of all pairs'; the default since the depth setting, a placeholder under
        # per_pair).
        assert changed_by(pairs=pairs[:1]) == {"report", "prepare_multi", "train_asr_local_shared"}
        # Another seed: only its own runs and the report; the analysed baseline (analysis.st_seed) and
        # everything upstream stay cached.
        assert changed_by(seeds=seeds + [2]) == ({f"train_baseline@{p}-2" for p in pairs}
                                                 | {f"train_local@{p}-2" for p in pairs} | {"report"})
        # (a seed list without analysis.st_seed, e.g. [2], is refused: tests/test_params.py)
        # Runs side by side: the per-pair / per-seed training stages and the shared fork, whose thread
        # count follows it (the one shared ASR model trains alone with every core: untouched)
        by_jobs = changed_by(parallel={"jobs": 1})
        assert ({f"train_{s}@{p}" for s in ("asr", "asr_local") for p in pairs}
                | {f"train_{s}@{p}-1" for s in ("baseline", "local") for p in pairs}) <= by_jobs
        # ... and the per-pair analyses, which share the cores the same way (lib.parallel.share_cores)
        assert {f"{s}@{p}" for s in ("analyze", "select_windows", "health_asr", "health_st") for p in pairs} <= by_jobs
        # ... and the one-thread stages of seconds, which list it so that scripts/repro.py runs them
        # beside the others (they rerun in seconds when it changes)
        assert {"train_asr_local_shared", "prepare_multi"} | {f"corpus_stats@{p}" for p in pairs} <= by_jobs
        assert all(name.split("@")[0] in ("train_asr", "train_asr_local", "train_asr_local_shared", "train_baseline",
                                          "train_local", "train_asr_smoothing", "train_smoothing", "analyze",
                                          "select_windows", "health_asr", "health_st", "prepare_multi",
                                          "corpus_stats") for name in by_jobs), by_jobs
        assert "train_asr_shared" not in by_jobs
    finally:
        params_path.write_text(original)


@pytest.mark.slow
def test_an_edit_to_a_variant_retrains_no_baseline(tiny_repo: Path) -> None:
    """Editing the smoothing or head-selection code leaves the baseline's chain up to date (their
    modules load only in the stages that train them); so does editing a variant's params code, but for
    the report, which reads every variant's section, and that variant's own stages (smoothing's edited
    here: the multilingual variant's prepare_multi stays up to date); editing the shared attention core
    does not."""
    edited = [tiny_repo / "lib/model/attention/smoothing.py", tiny_repo / "lib/model/attention/head_selection.py",
              tiny_repo / "lib/train/head_selection.py"]
    variant_params = tiny_repo / "lib/params/smoothing.py"
    core = tiny_repo / "lib/model/attention/base.py"
    originals = {path: path.read_text() for path in edited + [variant_params, core]}
    try:
        for path in edited:
            path.write_text(originals[path] + "\n# an edit\n")
        changed = set(json.loads(_run(["dvc", "status", "--json"], tiny_repo).stdout))
        chain = ("train_asr", "train_asr_local", "train_baseline", "train_local", "analyze", "select_windows",
                 "health_asr", "health_st", "report")
        assert not {name for name in changed if name.split("@")[0] in chain}, changed
        variant_params.write_text(originals[variant_params] + "\n# an edit\n")
        changed = set(json.loads(_run(["dvc", "status", "--json"], tiny_repo).stdout))
        assert {name.split("@")[0] for name in changed if name.split("@")[0] in chain} == {"report"}, changed
        assert "prepare_multi" not in changed, changed
        # (the variants' own stages are opt-in: the default pipeline has none of them to rerun)
        core.write_text(originals[core] + "\n# an edit\n")
        changed = set(json.loads(_run(["dvc", "status", "--json"], tiny_repo).stdout))
        assert {f"train_baseline@{p}-1" for p in TINY["pairs"]} <= changed
    finally:
        for path, text in originals.items():
            path.write_text(text)


@pytest.mark.slow
def test_corpus_is_byte_identical_for_same_params(tiny_repo: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([sys.executable, "stages/corpus.py", "en-de", str(tmp_path)], cwd=tiny_repo, env=env,
                   check=True, capture_output=True)
    a = tiny_repo / "data/mustc-demo/en-de"
    b = tmp_path / "en-de"
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _cached_objects(repo: Path) -> set[str]:
    """The md5 of every output of the pipeline's stages in dvc.lock (which also keeps the entries of
    stages no longer in the pipeline, e.g. of a pair left out) that DVC caches (the ones git does
    not track; `cache: false` metrics, plots and the report are committed to git) and, for a
    directory, its .dir listing and the files it lists (read from ``repo``'s cache)."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    stages = set(_run(["dvc", "stage", "list", "--name-only"], repo).stdout.split())
    tracked = _run(["git", "ls-files"], repo).stdout.splitlines()
    objects = set()
    for name, stage in lock["stages"].items():
        if name not in stages:
            continue
        for out in stage.get("outs", []):
            assert "/checkpoints" not in out["path"] and "/live" not in out["path"], out["path"]
            if any(t == out["path"] or t.startswith(out["path"] + "/") for t in tracked):
                continue
            objects.add(out["md5"])
            if out["md5"].endswith(".dir"):
                listing = repo / ".dvc/cache/files/md5" / out["md5"][:2] / out["md5"][2:]
                objects |= {entry["md5"] for entry in json.loads(listing.read_text())}
    return objects


@pytest.mark.slow
def test_results_round_trip_through_a_dvc_remote(tiny_repo: Path, tmp_path: Path) -> None:
    """README, "Sharing results through a DVC remote": commit, add a default remote, push; a fresh
    clone pulls and is up to date (nothing reruns, no metric differs). The remote holds exactly the
    outputs in dvc.lock: no training resume state (runs/<run>/checkpoints/, live/)."""
    store = tmp_path / "dvc-store"
    _run(["dvc", "remote", "add", "-d", "store", str(store)], tiny_repo)
    git_commit(tiny_repo, "results, and the remote they are pushed to")
    _run(["dvc", "push"], tiny_repo)

    pushed = {p.parent.name + p.name for p in (store / "files/md5").glob("*/*")}
    expected = _cached_objects(tiny_repo)
    assert _md5(tiny_repo / "runs/baseline/en-de/seed1/model.pt") in expected  # the models are outputs
    assert pushed == expected
    resume_state = [p for d in (tiny_repo / "runs").rglob("*") if d.name in ("checkpoints", "live")
                    for p in d.rglob("*") if p.is_file()]
    assert any(p.name == "last.pt" for p in resume_state) and any(p.suffix == ".tsv" for p in resume_state)
    # (checkpoints/fork.pt is the resume copy of the fork.pt output: the same bytes, pushed as the output;
    # so is a prev.pt of the fork's update, the training state one save back)
    fork_copies = {_md5(p) for p in resume_state if p.name == "fork.pt"}
    assert any(p.name == "prev.pt" for p in resume_state)
    assert not ({_md5(p) for p in resume_state if p.name != "fork.pt"} - fork_copies) & pushed

    # the stages wrote bytecode into lib/ (directory deps), which a fresh clone lacks (.dvcignore)
    assert list((tiny_repo / "lib").rglob("__pycache__/*.pyc"))
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(tiny_repo), str(clone)], tmp_path)
    _run(["dvc", "pull"], clone)
    assert json.loads(_run(["dvc", "status", "--json"], clone).stdout) == {}
    out = _run(["dvc", "repro"], clone).stdout
    assert "Running stage" not in out, out
    assert json.loads(_run(["dvc", "metrics", "diff", "--json"], clone).stdout or "{}") == {}
    for rel in ("runs/baseline/en-de/seed1/model.pt", "data/windows/en-de/windows.json", "reports/report.md"):
        assert (clone / rel).read_bytes() == (tiny_repo / rel).read_bytes(), rel
    assert not [p for p in (clone / "runs").rglob("*") if p.name in ("checkpoints", "live")]


@pytest.mark.slow
def test_repro_after_a_kill_in_final_decoding_keeps_the_curves(tiny_repo: Path) -> None:
    """A run killed after its last checkpoint (while decoding) is rerun by DVC: it resumes at the final
    update from its resume state (runs/<run>/checkpoints, live/: not DVC outputs, so DVC does not
    delete them), only decodes, and the training curves logged before the kill survive."""
    run_dir = tiny_repo / "runs/asr_shared"  # asr.mode: shared trains here
    curves = tiny_repo / "plots/train/asr_shared/train/loss.tsv"
    curve = curves.read_text()
    metrics = (tiny_repo / "metrics/asr_shared.json").read_text()
    # -f: DVC deletes the stage's outputs and runs it, as after a kill during the final decoding
    proc = _run(["dvc", "repro", "-f", "-s", "train_asr_shared"], tiny_repo)
    assert "Running stage 'train_asr_shared'" in proc.stdout
    assert f"at update {TRAIN_TINY['max_updates']}" in proc.stdout + proc.stderr  # resumed, not retrained
    assert curves.read_text() == curve  # every step's row, none lost and none doubled
    assert len(curve.splitlines()) == 1 + TRAIN_TINY["max_updates"]
    assert (tiny_repo / "metrics/asr_shared.json").read_text() == metrics

    # the live curves deleted as well (checkpoints kept): the stage still completes, with a warning
    shutil.rmtree(run_dir / "live")
    proc = _run(["dvc", "repro", "-f", "-s", "train_asr_shared"], tiny_repo)
    assert "training curves up to update 3 are lost" in proc.stdout + proc.stderr
    assert curves.parent.parent.is_dir()
    assert (tiny_repo / "metrics/asr_shared.json").read_text() == metrics
