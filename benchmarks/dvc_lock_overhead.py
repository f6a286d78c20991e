"""What the size of dvc.lock costs: DVC loads and rewrites the whole lock, with ruamel's pure-Python
round-trip YAML parser, around every stage it runs (README, "Tests").

    python benchmarks/dvc_lock_overhead.py            # parse/rewrite times of the lock, then the tiny repos
    python benchmarks/dvc_lock_overhead.py --no-tiny  # only the parse/rewrite times (seconds)

Prints, side by side in one run:
- for this workspace's dvc.lock and for the one of commit dd0e2a4 (15 entries of the former
  `train_st` stages still in it): size, and the median of 3 round-trip loads and of 3 load + dump;
- with ``--tiny`` (default): the first `dvc repro` of the tests' tiny repository (tests/dvc_repo.py)
  started without a lock, as the tests do now, and started with this workspace's lock, as they did
  before (≈ 1.5-2 min each on 2 cores).
"""
from __future__ import annotations

import argparse
import io
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OLD_COMMIT = "dd0e2a4"  # the last commit whose dvc.lock kept the train_st entries


def _lock_times(text: str) -> tuple[float, float]:
    from ruamel.yaml import YAML

    loads, rewrites = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        data = YAML().load(text)
        t1 = time.perf_counter()
        YAML().dump(data, io.StringIO())
        loads.append(t1 - t0)
        rewrites.append(time.perf_counter() - t0)
    return statistics.median(loads), statistics.median(rewrites)


def _tiny_repro(with_lock: bool) -> float:
    import yaml

    from tests.dvc_repo import REPO, TINY, git_commit, make_repo, merge, run

    with tempfile.TemporaryDirectory(prefix="lock-bench-") as tmp:
        root = make_repo(Path(tmp) / "repo", merge(yaml.safe_load((REPO / "params.yaml").read_text()), TINY))
        if with_lock:
            shutil.copy2(REPO / "dvc.lock", root / "dvc.lock")
            git_commit(root, "the default pipeline's lock")
        t0 = time.perf_counter()
        run(["dvc", "repro"], root)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-tiny", dest="tiny", action="store_false", help="skip the tiny repositories' runs")
    args = ap.parse_args()

    old = subprocess.run(["git", "show", f"{OLD_COMMIT}:dvc.lock"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    print("dvc.lock                       kB   load s  load+dump s")
    for name, text in (("this workspace", (ROOT / "dvc.lock").read_text()), (f"{OLD_COMMIT} (stale entries)", old)):
        load, rewrite = _lock_times(text)
        print(f"{name:<28} {len(text.encode()) / 1000:5.0f}   {load:6.2f}  {rewrite:11.2f}")
    if args.tiny:
        without = _tiny_repro(with_lock=False)
        with_ = _tiny_repro(with_lock=True)
        print("\ntiny repository, first `dvc repro`   seconds")
        print(f"started without a lock (now)        {without:7.1f}")
        print(f"started with the default's lock     {with_:7.1f}   ({with_ / without:.2f}x)")


if __name__ == "__main__":
    main()
