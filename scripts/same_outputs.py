"""Whether two revisions of the project write the same pipeline outputs, byte for byte: the check a
refactor owes (it must not move a number). For each revision, a git worktree, the tests' tiny demo
pipeline (tests/dvc_repo.py: its TINY params over that revision's params.yaml) run by
`scripts/repro.py -j 2`, and the md5 of every output its dvc.lock records (of a folder: of its files, a
``timing.json`` inside left out); then the two side by side, with the first changed lines of a text file.

    python scripts/same_outputs.py                  # HEAD~1 against HEAD
    python scripts/same_outputs.py REV_A REV_B      # e.g. main my-branch
    python scripts/same_outputs.py --set multi.systems=[baseline,group] --set multi.max_updates=4
                                                    # also the stages a param switches on (here the
                                                    # multilingual variant), as `dvc exp run -S` would

Prints the outputs that differ and exits 1 when any does, except ``timing.json`` (wall seconds, never
the same twice). About 4 min per revision on 2 cores. Both revisions run on this machine with this
checkout's venv: same seed, same machine, same outputs.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
#: Outputs that hold wall-clock seconds: they differ between any two runs.
TIMING = ("timing.json",)

_RUN_TINY = r"""
import json, os, subprocess, sys
from pathlib import Path
import yaml
tree, dest, sets = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
sys.path.insert(0, str(tree / "tests"))
import dvc_repo
params = dvc_repo.merge(yaml.safe_load((tree / "params.yaml").read_text()), dvc_repo.TINY)
for key, value in sets:
    node = params
    *path, last = key.split(".")
    for k in path:
        node = node[k]
    node[last] = value
root = dvc_repo.make_repo(dest, params)
env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
subprocess.run([sys.executable, "scripts/repro.py", "-j", "2"], cwd=root, env=env, check=True,
               stdout=subprocess.DEVNULL)
import hashlib
lock = yaml.safe_load((root / "dvc.lock").read_text())
def digest(path):
    # a folder: its files' md5s, files holding wall seconds (timing.json) left out
    if not path.is_dir():
        return hashlib.md5(path.read_bytes()).hexdigest()
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.name not in ("timing.json",))
    return hashlib.md5("".join(f"{f.relative_to(path)} {hashlib.md5(f.read_bytes()).hexdigest()}\n"
                               for f in files).encode()).hexdigest() + ".dir"
print(json.dumps({o["path"]: digest(root / o["path"]) for st in lock["stages"].values() for o in st.get("outs", [])}))
"""


def outputs(rev: str, work: Path, sets: list[tuple[str, object]] = ()) -> dict[str, str]:
    """{output path: md5} of the tiny pipeline at ``rev``, with the params ``sets`` (dotted key, value)."""
    tree = work / f"tree-{rev.replace('/', '_')}"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), rev], cwd=ROOT, check=True)
    try:
        print(f"{rev}: running the tiny pipeline ...", flush=True)
        out = subprocess.run([sys.executable, "-c", _RUN_TINY, str(tree), str(work / f"repo-{rev.replace('/', '_')}"),
                              json.dumps(list(sets))],
                             cwd=tree, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def text_diff(a: Path, b: Path, lines: int = 8) -> list[str]:
    """The first changed lines of two text files (a report's table row with a wall-clock column, say)."""
    import difflib

    try:
        ta, tb = a.read_text(encoding="utf-8").splitlines(), b.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    changed = [d for d in difflib.unified_diff(ta, tb, lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")]
    return changed[:lines]


def compare(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Outputs that differ or exist on one side only, timing files aside."""
    out = []
    for path in sorted(set(a) | set(b)):
        if Path(path).name in TIMING:
            continue
        if path not in a or path not in b:
            out.append(f"{path}: only in {'the second' if path not in a else 'the first'} revision")
        elif a[path] != b[path]:
            out.append(f"{path}: {a[path]} != {b[path]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("revs", nargs="*", help="two revisions (default: HEAD~1 HEAD)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a param over the tiny params, as `dvc exp run -S` (the value read as YAML); repeatable")
    args = ap.parse_args(argv)
    sets = []
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--set {item!r}: expected KEY=VALUE")
        sets.append((key, yaml.safe_load(value)))
    if len(args.revs) not in (0, 2):
        ap.error("give two revisions, or none")
    a_rev, b_rev = args.revs or ["HEAD~1", "HEAD"]
    for rev in (a_rev, b_rev):  # both before the first tiny pipeline runs (minutes)
        if subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=ROOT,
                          capture_output=True).returncode:
            raise SystemExit(f"error: {rev!r} is not a commit of this repository (git rev-parse finds none)")
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as tmp:
        a, b = outputs(a_rev, Path(tmp), sets), outputs(b_rev, Path(tmp), sets)
        differ = compare(a, b)
        diffs = {line.split(":")[0]: text_diff(Path(tmp) / f"repo-{a_rev.replace('/', '_')}" / line.split(":")[0],
                                               Path(tmp) / f"repo-{b_rev.replace('/', '_')}" / line.split(":")[0])
                 for line in differ}
    same = sum(a[p] == b[p] for p in set(a) & set(b))
    print(f"{a_rev} vs {b_rev}: {len(a)} / {len(b)} outputs, {same} the same"
          + " (timing.json holds wall seconds: never compared)")
    for line in differ:
        print("  " + line)
        for d in diffs.get(line.split(":")[0], []):
            print("      " + d[:160])
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
