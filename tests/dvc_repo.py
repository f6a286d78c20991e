"""Temporary copies of the repository for the end-to-end `dvc` tests (tests/test_pipeline*.py,
tests/test_paper_profile.py): the tiny demo params, param merging, subprocess runs with the venv on PATH,
a repo factory (a git repo of this repository's tracked files, without the pipeline outputs, with its own
params.yaml and a local git identity), and the one tiny `make repro` that a test session builds and the
end-to-end files copy.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    "asr": {"fork_updates": 1},  # the default local.asr_pretraining: fork, from update 2 of 3
}


def merge(base: dict, over: dict) -> dict:
    """``base`` with ``over``'s values (nested mappings merged key by key)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def get_key(params: dict, dotted: str) -> Any:
    """``get_key(params, "train_st.max_updates")``."""
    node = params
    for part in dotted.split("."):
        node = node[part]
    return node


def set_keys(params: dict, dotted: dict[str, Any]) -> dict:
    """A copy of ``params`` with ``{"section.key": value}`` set; KeyError for a key ``params`` lacks
    (an override can only change a value, never add a key)."""
    out = yaml.safe_load(yaml.safe_dump(params))  # deep copy of plain YAML data
    for key, value in dotted.items():
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node[part]
        if last not in node:
            raise KeyError(key)
        node[last] = value
    return out


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``cmd`` with the venv first on PATH; AssertionError with its output when it fails.
    Python writes bytecode as in a user's shell (``__pycache__/`` beside the modules in lib/, which
    are directory deps of the stages), whatever this process was started with."""
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def copy_repo(dst: Path) -> None:
    """This repository's tracked (and untracked, not ignored) files into ``dst``, without the
    pipeline outputs (the committed benchmark results the report embeds are kept) and without
    dvc.lock: the copy records only its own runs. (DVC parses and rewrites the whole lock with a
    pure-Python YAML parser around every stage it runs, so the default pipeline's large lock would
    only slow the tiny repo's runs down.)"""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    outputs = ("runs/", "reports/", "data/", "metrics/", "plots/")  # pipeline outputs: rebuilt by the run
    benchmark = ("metrics/efficiency.", "plots/efficiency/")  # committed benchmark results the report embeds
    for rel in filter(None, files):
        if rel == "dvc.lock":
            continue
        # .gitkeep / README.md keep folders that stages depend on present (e.g. metrics/variants)
        if rel.startswith(outputs) and not rel.endswith((".gitkeep", "/README.md")) and not rel.startswith(benchmark):
            continue
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def git_commit(repo: Path, message: str) -> None:
    """``git add -A`` and commit (an empty commit when nothing changed, so callers need not know)."""
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-q", "--allow-empty", "-m", message], repo)


def make_repo(root: Path, params: dict) -> Path:
    """A git repo at ``root``: this repository's code (no outputs), ``params`` as params.yaml, a
    local git identity, one commit. Its DVC cache is its own (``root/.dvc/cache``)."""
    root.mkdir(parents=True, exist_ok=True)
    copy_repo(root)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q"], root)
    run(["git", "config", "user.name", "t"], root)
    run(["git", "config", "user.email", "t@t"], root)
    git_commit(root, "params")
    return root


def built_tiny_repo(root: Path) -> Path:
    """A tiny repository at ``root`` (the repository's params.yaml with :data:`TINY` over it) after the
    README's `make repro`: DVC's stages two at a time (scripts/repro.py)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    repo = make_repo(root, merge(params, TINY))
    out = run([sys.executable, "scripts/repro.py", "-j", "2"], repo).stdout
    assert "started  train_baseline@en-de-1" in out and "done:" in out, out
    return repo


def tiny_repo_copy(tmp_path_factory) -> Path:
    """A private copy of the one tiny repository (:func:`built_tiny_repo`) that a test session builds.
    The first end-to-end file to ask builds it, under a lock in the folder that every pytest-xdist worker
    of the session shares; the others wait for it and copy it (a second) instead of building their own
    (two minutes each). A failed build is reported once and re-raised in every file that asks."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    built, done, failed = shared / "tiny-repo", shared / "tiny-repo.done", shared / "tiny-repo.failed"
    with open(shared / "tiny-repo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if failed.exists():
            raise AssertionError(f"the session's tiny repository failed to build:\n{failed.read_text()}")
        if not done.exists():
            shutil.rmtree(built, ignore_errors=True)
            try:
                built_tiny_repo(built)
            except BaseException as exc:
                failed.write_text(f"{type(exc).__name__}: {exc}")
                raise
            done.touch()
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(built, repo, symlinks=True, dirs_exist_ok=True)
    return repo
