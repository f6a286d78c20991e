"""Switch params.yaml to a profile (``profiles/<name>.yaml``) and back, keeping yours.

    python scripts/params_profile.py paper       # params.yaml := profiles/paper.yaml; yours kept aside
    python scripts/params_profile.py paper --mustc-root /path/to/MUSTC_v1.0   # ... and your MuST-C copy
    python scripts/params_profile.py --restore   # your params.yaml back, with every edit it had

The params.yaml it replaces, committed or not, is kept as ``params.before-profile.yaml`` (ignored by
git) until ``--restore`` moves it back. A second switch while one is kept is refused, so the kept file
is never overwritten: restore first. Every write is a rename of a complete file. Edits made under the
profile (``dvc exp run -S data.mustc_root=...``) are dropped by ``--restore``; they live on in the
experiments and the runs that DVC recorded.

``--mustc-root`` first checks the copy for every pair and split the profile names
(lib.data.corpora.check_corpus: the folders only, nothing is read) and refuses, with one line saying
what was found and what to set and nothing switched, a root that `prepare` would not read; then it
sets ``data.mustc_root`` in the new params.yaml (that one line; the profile's comments stay).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

KEPT = "params.before-profile.yaml"
CODE = Path(__file__).resolve().parent.parent  # this repository's lib/
_ROOT_LINE = re.compile(r"^(data:\n(?:[ \t]+.*\n|[ \t]*\n)*?[ \t]+mustc_root:)[ \t]*[^#\n]*?([ \t]*(?:#.*)?)$", re.MULTILINE)


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


def check_mustc_root(root: Path, name: str, corpus: str) -> None:
    """SystemExit with one line when profile ``name``'s pairs and splits are not all at ``corpus``
    (relative to ``root``, as the prepare stage reads it)."""
    import yaml

    if str(CODE) not in sys.path:
        sys.path.insert(0, str(CODE))
    from lib.data.corpora import check_corpus
    from lib.data.reader import CorpusError

    profile = yaml.safe_load((root / "profiles" / f"{name}.yaml").read_text(encoding="utf-8")) or {}
    folder = Path(corpus) if Path(corpus).is_absolute() else root / corpus
    splits = (profile.get("prepare") or {}).get("splits") or ["train", "dev", "tst-COMMON"]
    for pair in profile.get("pairs") or []:
        try:
            check_corpus(folder, pair, splits)
        except CorpusError as e:
            raise SystemExit(f"error: --mustc-root {corpus}: {e}") from None


def set_mustc_root(root: Path, corpus: str) -> None:
    """params.yaml's ``data.mustc_root`` := ``corpus``, by rewriting that one line (comments stay)."""
    import yaml

    params = root / "params.yaml"
    text = params.read_text(encoding="utf-8")
    new, n = _ROOT_LINE.subn(lambda m: f"{m.group(1)} {json.dumps(corpus)}{m.group(2)}", text, count=1)
    if n != 1:
        raise SystemExit(f"error: {params}: no `mustc_root:` line in its `data:` section to set")
    if (yaml.safe_load(new) or {}).get("data", {}).get("mustc_root") != corpus:
        raise SystemExit(f"error: {params}: could not set data.mustc_root to {corpus!r}")
    tmp = params.with_name(params.name + ".tmp")
    tmp.write_text(new, encoding="utf-8")
    os.replace(tmp, params)


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
    ap.add_argument("--mustc-root", metavar="PATH",
                    help="with a profile: your MuST-C copy, checked, then set as data.mustc_root")
    args = ap.parse_args(argv)
    if args.restore and args.profile:
        ap.error(f"give a profile ({args.profile}) or --restore, not both")
    if not args.restore and not args.profile:
        ap.error("give a profile or --restore")
    if args.mustc_root is not None and args.restore:
        ap.error("--mustc-root goes with a profile, not with --restore")
    if args.mustc_root is not None and not args.mustc_root.strip():  # "" would be the repository itself
        ap.error("--mustc-root: empty; give the folder that holds en-de/, en-es/, ... of your MuST-C copy")
    root = Path.cwd()
    if args.mustc_root is not None:  # the corpus check reads with the library: under the project's venv
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _venv import ensure_project_venv

        ensure_project_venv(CODE)
    if args.restore:
        print(restore(root))
        return
    if args.mustc_root is not None and (root / "profiles" / f"{args.profile}.yaml").is_file():
        check_mustc_root(root, args.profile, args.mustc_root)  # before anything is switched
    print(switch(root, args.profile))
    if args.mustc_root is not None:
        set_mustc_root(root, args.mustc_root)
        print(f"data.mustc_root is {args.mustc_root} (checked: every pair and split of the profile is there)")


if __name__ == "__main__":
    sys.exit(main())
