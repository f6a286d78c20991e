"""End-to-end: the DVC pipeline on a tiny demo corpus, in a temporary copy of the repository.

Checks what a user relies on: `dvc repro` builds the MuST-C layout, the prepared data, metrics and
plots; a second `dvc repro` is a no-op; changing a param marks exactly the stages that read it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

TRAIN_TINY = {"max_updates": 3, "warmup_updates": 2, "max_frames": 2000, "eval_every": 2, "save_every": 1,
              "average_last": 2}
TINY = {
    "pairs": ["en-de", "en-es"],
    "seeds": [1],
    "corpus": {"splits": {"train": 24, "dev": 6, "tst-COMMON": 6}, "segments_per_talk": 6, "n_speakers": 4,
               "workers": 1},
    "prepare": {"asr_vocab_size": 60, "st_vocab_size": 60, "workers": 1},
    "model": {"size": "tiny", "overrides": {"encoder_layers": 4}},
    "train_asr": TRAIN_TINY,
    "train_st": TRAIN_TINY,
    "decode": {"beam": 2, "max_len_b": 10, "dev_sentences": 3},
    "analysis": {"samples": 3, "window_samples": 4, "full_layers": 2, "transparency_samples": 1},
}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _copy_repo(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    outputs = ("runs/", "reports/", "data/", "metrics/", "plots/")  # pipeline outputs: rebuilt by the run
    benchmark = ("metrics/efficiency.", "plots/efficiency/")  # committed benchmark results the report embeds
    for rel in filter(None, files):
        if rel.startswith(outputs) and not rel.endswith(".gitkeep") and not rel.startswith(benchmark):
            continue
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    _copy_repo(root)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump(_merge(params, TINY), sort_keys=False))
    _run(["git", "init", "-q"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny"], root)
    _run(["dvc", "repro"], root)
    return root


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
        # local.asr_pretraining: shared (default) -> train_local starts from a copy of the baseline's ASR
        shared = json.loads((tiny_repo / "metrics/asr_local" / f"{pair}.json").read_text())
        assert shared == {**asr, "asr_pretraining": "shared"}
        assert ((tiny_repo / "runs/asr_local" / pair / "model.pt").read_bytes()
                == (tiny_repo / "runs/asr" / pair / "model.pt").read_bytes())
        for model in ("asr", "st"):  # attention health of both models (stages health_asr, health_st)
            health = json.loads((tiny_repo / "metrics/health" / pair / f"{model}.json").read_text())
            assert {"full", "w1", "alg1"} <= set(health["band_test"]) and health["summary"]["heads"] > 0
            assert (tiny_repo / "plots/health" / pair / f"{model}.png").stat().st_size > 1000
    summary = json.loads((tiny_repo / "metrics/summary.json").read_text())
    assert set(summary) >= {f"{p}/{s}/{m}" for p in TINY["pairs"] for s in ("baseline", "local")
                            for m in ("bleu", "asr_wer")}
    assert all(isinstance(v, (int, float)) for v in summary.values())  # flat
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
        # One pair: nothing of that pair reruns (no stage reads the whole `pairs` list but the report).
        assert changed_by(pairs=pairs[:1]) == {"report"}
        # Another seed: only its own runs and the report; the analysed baseline (analysis.st_seed) and
        # everything upstream stay cached.
        assert changed_by(seeds=seeds + [2]) == ({f"train_baseline@{p}-2" for p in pairs}
                                                 | {f"train_local@{p}-2" for p in pairs} | {"report"})
        assert changed_by(seeds=[2]) == {f"train_{s}@{p}-2" for s in ("baseline", "local") for p in pairs} | {"report"}
    finally:
        params_path.write_text(original)


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


@pytest.mark.slow
def test_exp_run_then_metrics_diff_shows_the_change(tiny_repo: Path) -> None:
    """What a user does: commit the results, run an experiment with one param changed, diff metrics."""
    _run(["git", "add", "-A"], tiny_repo)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "results"], tiny_repo)
    _run(["dvc", "exp", "run", "-S", "train_st.max_updates=4"], tiny_repo)
    diff = json.loads(_run(["dvc", "metrics", "diff", "--json"], tiny_repo).stdout)
    st = diff["metrics/baseline/en-de/seed1.json"]
    assert st["updates"] == {"old": 3, "new": 4, "diff": 1}
    assert "metrics/asr/en-de.json" not in diff  # ASR did not depend on train_st


@pytest.mark.slow
def test_exp_run_with_local_asr_pretraining(tiny_repo: Path) -> None:
    """local.asr_pretraining=local: ASR is pretrained with the local spec; the baseline is untouched."""
    import torch

    baseline_asr = (tiny_repo / "runs/asr/en-de/model.pt").read_bytes()
    out = _run(["dvc", "exp", "run", "-S", "local.asr_pretraining=local"], tiny_repo).stdout
    assert "Running stage 'train_asr_local@en-de'" in out and "Running stage 'train_local@en-de-1'" in out
    assert "Running stage 'train_asr@en-de'" not in out and "Running stage 'train_baseline@en-de-1'" not in out
    assert (tiny_repo / "runs/asr/en-de/model.pt").read_bytes() == baseline_asr
    for pair in TINY["pairs"]:
        m = json.loads((tiny_repo / "metrics/asr_local" / f"{pair}.json").read_text())
        assert m["asr_pretraining"] == "local" and m["updates"] == TRAIN_TINY["max_updates"]
        model = torch.load(tiny_repo / "runs/asr_local" / pair / "model.pt", weights_only=True)
        windows = json.loads((tiny_repo / "data/windows" / pair / "windows.json").read_text())
        assert model["model_config"]["encoder_attention"] == windows["encoder_attention"]
    report = (tiny_repo / "reports/report.md").read_text()
    assert "`local.asr_pretraining: local`" in report


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


@pytest.mark.slow
def test_parallel_seed_recipe_gathers_from_the_run_cache(tiny_repo: Path) -> None:
    """The README's per-seed recipe, with seeds [1, 2]: seed 1 first (the analysed baseline and its
    windows), every other seed as a queued experiment (run in parallel by the queue's workers), then one
    `dvc exp run` over all seeds restores every run from DVC's run-cache and reruns only the report."""
    _run(["dvc", "exp", "run", "-S", "seeds=[1]"], tiny_repo)
    _run(["dvc", "exp", "run", "--queue", "-S", "seeds=[1,2]", "-n", "seed2"], tiny_repo)
    _run(["dvc", "exp", "run", "--run-all", "-j", "1"], tiny_repo)
    out = _run(["dvc", "exp", "run", "-S", "seeds=[1,2]"], tiny_repo).stdout
    ran = sorted(line for line in out.splitlines() if line.startswith("Running stage"))
    assert ran == ["Running stage 'report':"], out
    for pair in TINY["pairs"]:
        for system in ("baseline", "local"):
            assert f"Stage 'train_{system}@{pair}-2' is cached - skipping run" in out, out
            m = json.loads((tiny_repo / "metrics" / system / pair / "seed2.json").read_text())
            assert 0 <= m["bleu"] <= 100
    report = (tiny_repo / "reports/report.md").read_text()
    assert "seeds [1, 2]" in report and "| en-de | local |" in report
    assert "| 2 |" in report.split("## Table 2")[1].split("##")[0]  # two seeds per row of Table 2
    assert "Running stage" not in _run(["dvc", "repro"], tiny_repo).stdout


@pytest.mark.slow
def test_exp_run_with_per_pair_asr(tiny_repo: Path) -> None:
    """asr.mode=per_pair (the paper): every pair trains its own ASR model; train_asr_shared only
    writes placeholders. (Last in this file: it leaves the workspace in per_pair mode.)"""
    import torch

    out = _run(["dvc", "exp", "run", "-S", "asr.mode=per_pair", "train_asr"], tiny_repo).stdout
    assert "Running stage 'train_asr@en-de'" in out and "Running stage 'train_asr@en-es'" in out
    placeholder = torch.load(tiny_repo / "runs/asr_shared/model.pt", weights_only=True)
    assert set(placeholder) == {"unused"}
    assert json.loads((tiny_repo / "metrics/asr_shared.json").read_text()) == {"asr_mode": "per_pair"}
    models = set()
    for pair in TINY["pairs"]:
        m = json.loads((tiny_repo / "metrics/asr" / f"{pair}.json").read_text())
        assert "asr_mode" not in m and m["updates"] == TRAIN_TINY["max_updates"]
        state = torch.load(tiny_repo / "runs/asr" / pair / "model.pt", weights_only=True)
        assert state["pair"] == pair
        models.add((tiny_repo / "runs/asr" / pair / "model.pt").read_bytes())
        assert list((tiny_repo / "runs/asr" / pair / "checkpoints").iterdir())  # trained here
    assert len(models) == len(TINY["pairs"])
