"""Two full pipeline runs side by side: wall time per stage group and quality per pair (issue 12's
"bf16 within one standard deviation of fp32" check).

    python scripts/compare_repro_runs.py REFERENCE CANDIDATE [--names fp32 default] [--md out.md]

REFERENCE and CANDIDATE are workspaces (clones) in which `python scripts/time_repro.py --fresh -f`
ran: each holds `reports/repro_timing.json` and `metrics/summary.json` (or a folder with the two
files side by side, as a run is kept under `reports/`). Prints minutes per stage
group and in total with the candidate / reference ratio, then per pair the ASR WER of both
systems, baseline and local BLEU (mean ± std over the seeds), the candidate − reference
difference, and whether it lies within one standard deviation (the larger of the two runs' stds).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _load(root: Path) -> tuple[dict, dict]:
    kept = (root / "repro_timing.json", root / "summary.json")  # a run's two files kept side by side
    files = kept if all(f.is_file() for f in kept) else (root / "reports" / "repro_timing.json",
                                                          root / "metrics" / "summary.json")
    for f in files:
        if not f.is_file():
            raise SystemExit(f"{f}: missing (run `python scripts/time_repro.py --fresh -f` in {root})")
    return tuple(json.loads(f.read_text(encoding="utf-8")) for f in files)


def timing_table(ref: dict, cand: dict, names: tuple[str, str]) -> list[str]:
    groups = list(dict.fromkeys([*ref["by_stage_group"], *cand["by_stage_group"]]))
    rows = [f"| stage group | {names[0]} (min) | {names[1]} (min) | {names[1]} / {names[0]} |", "|---|---|---|---|"]
    for g in groups:
        a, b = ref["by_stage_group"].get(g, 0.0) / 60, cand["by_stage_group"].get(g, 0.0) / 60
        rows.append(f"| {g} | {a:.1f} | {b:.1f} | {b / a:.2f} |" if a > 0 else f"| {g} | {a:.1f} | {b:.1f} | – |")
    a, b = ref["total_seconds"] / 60, cand["total_seconds"] / 60
    rows.append(f"| **total** | **{a:.1f}** | **{b:.1f}** | **{b / a:.2f}** |")
    return rows


def quality_table(ref: dict, cand: dict, names: tuple[str, str]) -> tuple[list[str], bool]:
    pairs = sorted({k.split("/")[0] for k in ref if k.count("/") == 2 and k.split("/")[1] == "baseline"})
    rows = [f"| pair | metric | {names[0]} | {names[1]} | difference | within one std |", "|---|---|---|---|---|---|"]
    all_within = True
    for pair in pairs:
        for system in ("baseline", "local"):
            wer_a, wer_b = ref.get(f"{pair}/{system}/asr_wer"), cand.get(f"{pair}/{system}/asr_wer")
            if wer_a is not None and wer_b is not None:
                rows.append(f"| {pair} | {system} ASR WER | {wer_a:.2f} | {wer_b:.2f} | {wer_b - wer_a:+.2f} | "
                            "(one model: no std) |")
            a, b = ref[f"{pair}/{system}/bleu"], cand[f"{pair}/{system}/bleu"]
            sa, sb = ref[f"{pair}/{system}/bleu_std"], cand[f"{pair}/{system}/bleu_std"]
            within = abs(b - a) <= max(sa, sb)
            all_within &= within
            rows.append(f"| {pair} | {system} BLEU | {a:.2f} ± {sa:.2f} | {b:.2f} ± {sb:.2f} | {b - a:+.2f} | "
                        f"{'yes' if within else '**no**'} |")
    return rows, all_within


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reference", type=Path)
    ap.add_argument("candidate", type=Path)
    ap.add_argument("--names", nargs=2, default=["fp32", "default"], metavar=("REF", "CAND"))
    ap.add_argument("--md", type=Path, help="also write both tables to this markdown file")
    args = ap.parse_args(argv)
    (t_ref, m_ref), (t_cand, m_cand) = _load(args.reference), _load(args.candidate)
    names = tuple(args.names)
    quality, ok = quality_table(m_ref, m_cand, names)
    text = "\n".join([f"Wall time, `{t_ref['command']}` in each ({args.reference} vs {args.candidate}):", "",
                      *timing_table(t_ref, t_cand, names), "",
                      f"Quality (5-seed BLEU mean ± std; {names[1]} − {names[0]}):", "", *quality, "",
                      f"every BLEU mean within one std: {'yes' if ok else 'no'}"])
    print(text)
    if args.md is not None:
        from lib.io import atomic_write_text
        atomic_write_text(args.md, text + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
