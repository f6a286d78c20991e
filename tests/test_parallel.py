"""lib/parallel.py: how many runs side by side (``parallel.jobs``) and how many threads each."""
from __future__ import annotations

from pathlib import Path

import pytest

from lib import parallel
from lib.params import ParamError, load_params

REPO = Path(__file__).resolve().parent.parent


def test_auto_jobs_is_the_cores_on_a_cpu_and_the_gpus_with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    assert parallel.resolve_jobs("auto", cuda=False) == 2 and parallel.threads_per_run("auto", cuda=False) == 1
    for gpus, jobs in ((0, 1), (1, 1), (4, 4), (16, 8)):
        monkeypatch.setattr(torch.cuda, "device_count", lambda gpus=gpus: gpus)
        assert parallel.resolve_jobs("auto", cuda=True) == jobs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert parallel.threads_per_run("auto", cuda=True) == 2
    monkeypatch.setattr(parallel, "available_cores", lambda: 64)
    assert parallel.resolve_jobs("auto", cuda=False) == parallel.MAX_AUTO_JOBS == 8
    assert parallel.threads_per_run("auto", cuda=False) == 8
    assert parallel.resolve_jobs(3, cuda=False) == 3 and parallel.threads_per_run(3, cuda=False) == 21
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    assert parallel.threads_per_run(4, cuda=False) == 1  # never fewer than one


@pytest.mark.parametrize("bad", [0, -1, "fast", True, 1.5])
def test_a_bad_jobs_value_names_the_key(tmp_path: Path, bad: object) -> None:
    import yaml

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["parallel"] = {"jobs": bad}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ParamError, match=r"parallel\.jobs"):
        load_params(path)


def test_per_pair_and_per_seed_runs_share_the_cores_the_shared_model_keeps_them(monkeypatch) -> None:
    from lib.train.experiments import spec_from_params

    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    p = load_params(REPO / "params.yaml")
    assert p.parallel.jobs == "auto"
    assert spec_from_params(p, REPO, "baseline", "en-de", 1).threads == 1
    assert spec_from_params(p, REPO, "local", "en-it", 3).threads == 1
    assert spec_from_params(p, REPO, "asr_local", "en-es").threads == 1
    assert spec_from_params(p, REPO, "asr_shared", "en-de").threads is None  # trains alone: every core
    # the one shared fork (local.fork: shared) shares the machine with the baselines of later seeds
    assert spec_from_params(p, REPO, "asr_local_shared", "en-de").threads == 1


def test_only_the_shared_asr_model_and_the_machine_wide_stages_run_alone() -> None:
    """scripts/repro.py runs a stage beside others when it lists `parallel` among its params. The
    stages that take seconds on one thread (the shared fork's placeholders, prepare_multi,
    corpus_stats) list it, so they no longer hold a core idle while they wait for the machine."""
    import yaml

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    shares = {name for name, stage in stages.items() if "parallel" in stage.get("params", [])}
    assert {"train_asr_local_shared", "prepare_multi", "corpus_stats", "train_baseline", "train_local",
            "train_asr_local", "select_windows", "analyze", "health_asr", "health_st"} <= shares
    assert not shares & {"corpus", "prepare", "train_asr_shared", "report"}


@pytest.mark.parametrize("stage, argv, adopt", [
    ("train_asr", ["en-es"], "adopt_shared_asr"),        # asr.mode: shared (the default)
    ("train_asr_local", ["en-es"], "adopt_shared_asr"),  # local.fork: shared
])
def test_stages_that_decode_a_shared_model_share_the_cores_first(monkeypatch: pytest.MonkeyPatch, stage: str,
                                                                  argv: list[str], adopt: str) -> None:
    """Copying a shared model decodes the pair's test set beside other stages under `make repro`;
    with torch's default thread count (every core) next to a 1-thread run it was 10-30x slower."""
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(REPO / "stages"))
    module = importlib.import_module(stage)
    import dataclasses

    p = load_params(REPO / "params.yaml")
    p = dataclasses.replace(p, asr=dataclasses.replace(p.asr, mode="shared"),
                            local=dataclasses.replace(p.local, asr_pretraining="fork", fork="shared"))
    calls: list[str] = []
    monkeypatch.setattr(module, "stage_params", lambda pair=None: p)
    monkeypatch.setattr(module, "share_cores", lambda jobs: calls.append(f"share_cores({jobs})"))
    monkeypatch.setattr(module, adopt, lambda *a, **k: calls.append("adopt") or {})
    monkeypatch.setattr(sys, "argv", [f"{stage}.py", *argv])
    module.main()
    assert calls == ["share_cores(auto)", "adopt"]


_HOLD = """
import sys
from pathlib import Path
from lib.parallel import claim_gpu
print(claim_gpu(sys.argv[2].split(","), Path(sys.argv[1])), flush=True)
sys.stdin.readline()  # hold the claim until told
"""


def test_each_process_claims_a_gpu_no_other_holds_until_it_exits(tmp_path: Path) -> None:
    """Three processes on three GPUs get 0, 1, 2; a fourth gets None (every GPU held); when the holder
    of GPU 1 exits, its GPU is free again."""
    import subprocess
    import sys

    keys = "GPU-aaa,GPU-bbb,GPU-ccc"
    procs, got = [], []
    try:
        for _ in range(4):
            proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path), keys], cwd=REPO, text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            procs.append(proc)
            got.append(proc.stdout.readline().strip())
        assert got == ["0", "1", "2", "None"]
        procs[1].stdin.close()
        procs[1].wait(timeout=30)
        assert parallel.claim_gpu(keys.split(","), tmp_path) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-GPU-aaa.lock", "gpu-GPU-bbb.lock", "gpu-GPU-ccc.lock"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.stdin.close()
                proc.wait(timeout=30)


def test_auto_jobs_with_several_processes_per_run_fit_the_runs_on_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """train_st.processes GPUs per run: an 8-GPU node runs 8 one-GPU runs, 4 two-GPU runs, 1 eight-GPU run."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert [parallel.resolve_jobs("auto", cuda=True, processes_per_run=n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    assert parallel.resolve_jobs(3, cuda=True, processes_per_run=2) == 3  # a number is taken as given


def test_a_multi_gpu_run_claims_free_gpus_and_releases_a_partial_claim(tmp_path: Path) -> None:
    """claim_gpus: n GPUs no other process holds (the runs side by side), or none at all."""
    import fcntl

    keys = ["a", "b", "c", "d"]
    held = open(tmp_path / "gpu-b.lock", "a+")  # another process's claim (another open file: same effect)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    before = len(parallel._claims)
    try:
        assert parallel.claim_gpus(keys, tmp_path, 4) is None
        assert len(parallel._claims) == before  # nothing kept from the partial claim
        got = parallel.claim_gpus(keys, tmp_path, 2)
        assert got == [0, 2]
        assert parallel.claim_gpus(keys, tmp_path, 1) == [3]
        assert parallel.claim_gpus(keys, tmp_path, 1) is None
    finally:
        for f in parallel._claims[before:]:
            f.close()
        del parallel._claims[before:]
        held.close()
