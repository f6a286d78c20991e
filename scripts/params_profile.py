"""Switch params.yaml to a profile (``profiles/<name>.yaml``) and back, keeping yours.

    python scripts/params_profile.py paper       # params.yaml := profiles/paper.yaml; yours kept aside
    python scripts/params_profile.py --restore   # your params.yaml back, with every edit it had

The params.yaml it replaces, committed or not, is kept as ``params.before-profile.yaml`` (ignored by
git) until ``--restore`` moves it back. A second switch while one is kept is refused, so the kept file
is never overwritten: restore first. Every write is a rename of a complete file. Edits made under the
profile (``dvc exp run -S data.mustc_root=...``) are dropped by ``--restore``; they live on in the
experiments and the runs that DVC recorded.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

KEPT = "params.before-profile.yaml"


def _copy_atomic(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def switch(root: Path, name: str) -> str:
    """params.yaml := profiles/<name>.yaml, the old one kept as :data:`KEPT`. SystemExit with one line
    for an unknown profile or a kept file already there."""
    profiles = root / "profiles"
    profile = profiles / f"{name}.yaml"
    if not profile.is_file():
        names = sorted(p.stem for p in profiles.glob("*.yaml"))
        raise SystemExit(f"error: no profile {name!r} in {profiles.name}/ (have: {', '.join(names) or 'none'})")
    params, kept = root / "params.yaml", root / KEPT
    if kept.exists():
        raise SystemExit(f"error: {KEPT} already holds the params.yaml of an earlier switch; "
                         f"`python scripts/params_profile.py --restore` first")
    if params.exists():
        _copy_atomic(params, kept)
    _copy_atomic(profile, params)
    return (f"params.yaml is now profiles/{name}.yaml; yours is kept in {KEPT} "
            f"(`python scripts/params_profile.py --restore` puts it back)")


def restore(root: Path) -> str:
    kept = root / KEPT
    if not kept.exists():
        raise SystemExit(f"error: no {KEPT} to restore (no profile switch is pending); "
                         f"`git checkout params.yaml` gives the committed one")
    os.replace(kept, root / "params.yaml")
    return "params.yaml is yours again"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", nargs="?", help="a profile in profiles/ (paper, demo-fast)")
    ap.add_argument("--restore", action="store_true", help="put the kept params.yaml back")
    args = ap.parse_args(argv)
    if args.restore == bool(args.profile):
        ap.error("give a profile or --restore")
    root = Path.cwd()
    print(restore(root) if args.restore else switch(root, args.profile))


if __name__ == "__main__":
    sys.exit(main())
