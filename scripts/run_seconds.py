"""Training and decoding seconds of every ST run of a workspace, and two such collections side by side.

    python scripts/run_seconds.py collect [ROOT] --out FILE   # runs/{baseline,local}/<pair>/seed<n>/timing.json -> FILE
    python scripts/run_seconds.py compare BEFORE.json AFTER.json

Each ST stage writes ``timing.json`` next to its model (``train_seconds``: the training loop with its
dev evaluation and checkpoints; ``decode_seconds``: beam search over tst-COMMON). ``collect`` keeps
them in one file (a run's ``runs/`` is not in git, so a run kept under ``reports/`` carries this file);
``compare`` prints, per system and pair, the sums over the seeds and the before / after ratios.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KINDS = ("baseline", "local")


def collect(root: Path) -> dict[str, dict[str, float]]:
    """{"<kind>/<pair>/seed<n>": {"train_seconds": ..., "decode_seconds": ...}} under ``root``/runs."""
    out: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        for f in sorted((root / "runs" / kind).glob("*/seed*/timing.json")):
            key = f"{kind}/{f.parent.parent.name}/{f.parent.name}"
            try:
                t = json.loads(f.read_text(encoding="utf-8"))
                out[key] = {k: float(t[k]) for k in ("train_seconds", "decode_seconds")}
            except (OSError, ValueError, KeyError) as e:
                raise SystemExit(f"error: {f}: unreadable timing ({e})") from e
    if not out:
        raise SystemExit(f"error: {root / 'runs'}: no ST run timing found (runs/baseline/<pair>/seed<n>/timing.json)")
    return out


def compare(before: dict, after: dict) -> list[str]:
    groups = sorted({k.rsplit("/", 1)[0] for k in before} & {k.rsplit("/", 1)[0] for k in after})
    rows = ["| system | runs | train s, before | after | ratio | decode s, before | after | ratio |",
            "|---|---|---|---|---|---|---|---|"]
    for g in groups:
        keys = sorted(k for k in before if k.startswith(g + "/") and k in after)
        tb, ta = (sum(d[k]["train_seconds"] for k in keys) for d in (before, after))
        db, da = (sum(d[k]["decode_seconds"] for k in keys) for d in (before, after))
        rows.append(f"| {g} | {len(keys)} | {tb:.1f} | {ta:.1f} | {tb / ta:.2f}× | {db:.1f} | {da:.1f} | {db / da:.2f}× |")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("root", nargs="?", default=".", type=Path)
    c.add_argument("--out", required=True, type=Path)
    k = sub.add_parser("compare")
    k.add_argument("before", type=Path)
    k.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "collect":
        data = collect(args.root)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(args.out)
        print(f"{args.out}: {len(data)} runs")
    else:
        loaded = []
        for f in (args.before, args.after):
            try:
                loaded.append(json.loads(f.read_text(encoding="utf-8")))
            except (OSError, ValueError) as e:
                sys.exit(f"error: {f}: {e}")
        print("\n".join(compare(*loaded)))


if __name__ == "__main__":
    main()
