"""The product pages stay true: README.md and docs/*.md name only files, folders, scripts and stages
that exist, the README stays a page (at most 300 lines), and no tracked file spells a machine path.

Paths under the pipeline's generated roots (data/, runs/, metrics/, plots/ and the like) are written
by `dvc repro`, so they may be absent in a fresh clone; every other backticked path must be in git.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP_LEVEL = {p.name for p in REPO.iterdir() if not p.name.startswith(".git")}
# Written by the pipeline, a stage or the venv set-up: may not exist before `make repro`.
GENERATED = ("data/", "runs/", "metrics/", "plots/", ".venv", ".dvc/tmp", ".dvc/cache", "dvclive")

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _tracked() -> set[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    files = {f for f in out.split("\0") if f}
    dirs = {str(Path(f).parent) + "/" for f in files}
    for d in list(dirs):
        parts = Path(d).parts
        dirs.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    return files | dirs


TRACKED = _tracked()


def _exists(path: str) -> bool:
    path = path.removeprefix("./")
    if path.startswith(GENERATED):
        return True
    return path in TRACKED or path.rstrip("/") in TRACKED or path.rstrip("/") + "/" in TRACKED \
        or (REPO / path).exists()


def _repo_path(token: str) -> str | None:
    """The repository path a backticked token names, or None if it names none: it must start with
    a top-level entry of the repository and contain no placeholder, glob, option or spaces."""
    token = token.strip().split("::")[0]
    token = re.sub(r":\d+(-\d+)?$", "", token)  # file.py:123
    if not token or any(c in token for c in " <>*{}$|=,()[]'\"") or token.startswith("-"):
        return None
    if "/" not in token and "." not in token:
        return None
    if token.split("/")[0] not in TOP_LEVEL:
        return None
    return token


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_relative_links_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        target = target.split("#")[0]
        resolved = (page.parent / target).resolve()
        if not resolved.exists():
            rel = resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved
            if not (resolved.is_relative_to(REPO) and _exists(str(rel))):
                missing.append(target)
    assert not missing, f"{_page_id(page)}: links to missing files: {missing}"


REPORTS = sorted((REPO / "reports").rglob("*.md"))


@pytest.mark.parametrize("page", PAGES + REPORTS, ids=_page_id)
def test_images_and_file_links_resolve_to_tracked_files(page: Path) -> None:
    """Every image and file link of README, docs/ and reports/ opens in a fresh clone: it resolves, relative
    to the page, to a file or folder in git (a report that links a figure of an untracked folder, or one
    written for another folder, shows broken images)."""
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        resolved = (page.parent / target.split("#")[0]).resolve()
        rel = resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else None
        if rel is None or not (rel in TRACKED or rel + "/" in TRACKED):
            broken.append(target)
    assert not broken, f"{_page_id(page)}: links that resolve to no tracked file: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_backticked_repository_paths_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = sorted({p for t in CODE_SPAN.findall(FENCE.sub("", text)) if (p := _repo_path(t)) and not _exists(p)})
    assert not missing, f"{_page_id(page)}: names paths that are not in the repository: {missing}"


def _stages() -> set[str]:
    doc = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
    return set(doc["stages"])


def _commands(text: str) -> list[str]:
    lines = []
    for block in FENCE.findall(text):
        for line in block.splitlines():
            line = line.split("#")[0].strip()
            lines.extend(part.strip() for part in re.split(r"&&|;|\|", line) if part.strip())
    return lines


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_commands_in_code_blocks_name_existing_scripts_and_stages(page: Path) -> None:
    stages = _stages()
    bad = []
    for cmd in _commands(page.read_text(encoding="utf-8")):
        words = cmd.split()
        for i, w in enumerate(words[:-1]):
            if w in ("python", "python3", "torchrun") or w.endswith("/python"):
                script = next((x for x in words[i + 1:] if not x.startswith("-") and "=" not in x), None)
                if script and script.endswith(".py") and not (REPO / script).is_file():
                    bad.append(cmd)
        if len(words) >= 3 and words[0] == "dvc" and words[1] == "repro":
            for w in words[2:]:
                if w.startswith("-"):
                    continue
                if w.split("@")[0] not in stages:
                    bad.append(cmd)
    assert not bad, f"{_page_id(page)}: commands that name a missing script or stage: {bad}"


def test_readme_is_a_page_not_a_notebook() -> None:
    n = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= 300, f"README.md has {n} lines; the science goes to docs/"


def test_readme_starts_with_the_two_commands() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    first = FENCE.search(text)
    assert first is not None and text.index(first.group(0)) < 200
    assert [line.split("#")[0].strip() for line in first.group(1).splitlines()] == ["make repro", "make test"]


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


MACHINE_PATH = re.compile(r"(?<![\w.])/(?:tmp|home|work|root|Users)/[A-Za-z0-9_.-]+")


def test_no_tracked_file_outside_tests_spells_a_machine_path() -> None:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    hits = []
    for name in out.split("\0"):
        if not name or name.startswith("tests/"):
            continue
        path = REPO / name
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{name}: {m.group(0)}" for m in MACHINE_PATH.finditer(text)]
    assert not hits, "machine paths in tracked files:\n" + "\n".join(hits[:20])


PAPER_RECIPE = """python scripts/params_profile.py paper --mustc-root /path/to/MUSTC_v1.0  # the paper's params, your copy (checked)
python scripts/repro.py prepare corpus_stats                # the data: features, vocabularies, hours
make repro                                                  # the rest, one run per GPU side by side
python scripts/params_profile.py --restore                  # your params.yaml back
"""


@pytest.mark.parametrize("page", ["README.md", "docs/gpu.md", "docs/mustc_example.md"])
def test_the_paper_run_has_one_recipe(page: str) -> None:
    """The paper's run is given by the same lines wherever it is given, as one fenced block, and no
    page tells the user to overwrite params.yaml by hand."""
    text = (REPO / page).read_text()
    assert any(block == PAPER_RECIPE for block in FENCE.findall(text)), f"{page}: the recipe differs"
    assert "cp profiles/" not in text, f"{page}: copies a profile over params.yaml"
