"""Two full pipeline runs side by side: wall time per stage group and quality per pair (for example
whether bf16 stays within one standard deviation of fp32).

    python scripts/compare_repro_runs.py REFERENCE CANDIDATE [--names fp32 default] [--md out.md]
                                         [--candidate-timing reports/repro_timing_<commit>.json]
                                         [--reference-timing reports/<run>/repro_timing.json]

REFERENCE and CANDIDATE are workspaces (clones) in which `python scripts/time_repro.py --fresh -f`
ran: each holds `reports/repro_timing.json` and `metrics/summary.json` (or a folder with the two
files side by side, as a run is kept under `reports/`). Prints minutes per stage
group and in total with the candidate / reference ratio, then per pair the ASR WER, baseline and
local BLEU (mean with the half-width of its 95 % interval over seeds), the candidate − reference
difference, and whether it lies within the larger of the two runs' half-widths.

    python scripts/compare_repro_runs.py REFERENCE CANDIDATE --seed-metrics [--systems baseline] [--names fp32 bf16]

compares only the ST runs that both workspaces trained, from their per-seed metrics
(`metrics/{baseline,local}/<pair>/seed<k>.json`), without timing or a report: e.g. the 15
baselines retrained in fp32 from the same ASR model (`train_st.amp: none`, then
`python scripts/repro.py train_baseline`), so that the two columns differ in the ST runs'
precision alone (`--systems baseline`: the other systems' metrics in such a workspace are the ones it
was cloned with).
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
            raise SystemExit(f"error: {f}: missing (run `python scripts/time_repro.py --fresh -f` in {root})")
    return tuple(json.loads(f.read_text(encoding="utf-8")) for f in files)


def seed_metrics_summary(root: Path, systems: tuple[str, ...] = ("baseline", "local")) -> dict:
    """``metrics/summary.json``'s BLEU keys, computed from the per-seed metrics of every system and pair
    whose runs are all present (``seed<k>.json`` for k = 1..)."""
    from lib.report.tables import load_scores, summary

    flat: dict = {}
    for system in systems:
        for pair_dir in sorted((root / "metrics" / system).glob("*")):
            seeds = sorted(int(f.stem[4:]) for f in pair_dir.glob("seed*.json"))
            if seeds:
                flat.update(summary([load_scores(root, pair_dir.name, system, seeds)]))
                flat[f"{pair_dir.name}/{system}/seeds"] = seeds
    if not flat:
        raise SystemExit(f"error: {root / 'metrics'}: no per-seed ST metrics (metrics/<system>/<pair>/seed<k>.json)")
    return flat


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
    rows = [f"| pair | metric | {names[0]} | {names[1]} | difference | within the 95 % interval over seeds |",
            "|---|---|---|---|---|---|"]
    all_within = True
    for pair in pairs:
        for system in ("baseline", "local"):
            if f"{pair}/{system}/bleu" not in cand or f"{pair}/{system}/bleu" not in ref:
                continue  # --seed-metrics: a system one of the two workspaces did not train
            if ref.get(f"{pair}/{system}/seeds", []) != cand.get(f"{pair}/{system}/seeds", []):
                raise SystemExit(f"error: {pair}/{system}: seeds {ref[f'{pair}/{system}/seeds']} against "
                                 f"{cand[f'{pair}/{system}/seeds']}")
            wer_a, wer_b = ref.get(f"{pair}/asr_wer"), cand.get(f"{pair}/asr_wer")
            if system == "baseline" and wer_a is not None and wer_b is not None:
                rows.append(f"| {pair} | ASR WER | {wer_a:.2f} | {wer_b:.2f} | {wer_b - wer_a:+.2f} | "
                            "(one model: no interval) |")
            a, b = ref[f"{pair}/{system}/bleu"], cand[f"{pair}/{system}/bleu"]
            ha, hb = ref.get(f"{pair}/{system}/bleu_ci95", 0.0), cand.get(f"{pair}/{system}/bleu_ci95", 0.0)
            within = abs(b - a) <= max(ha, hb)
            all_within &= within
            rows.append(f"| {pair} | {system} BLEU | {a:.2f} ± {ha:.2f} | {b:.2f} ± {hb:.2f} | {b - a:+.2f} | "
                        f"{'yes' if within else '**no**'} |")
    return rows, all_within


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reference", type=Path)
    ap.add_argument("candidate", type=Path)
    ap.add_argument("--names", nargs=2, default=["fp32", "default"], metavar=("REF", "CAND"))
    ap.add_argument("--md", type=Path, help="also write both tables to this markdown file")
    ap.add_argument("--candidate-timing", type=Path, metavar="TIMING",
                    help="the candidate's wall times from this --timing file instead (e.g. a rerun kept as "
                         "reports/repro_timing_<commit>.json whose outputs are byte-identical to CANDIDATE's)")
    ap.add_argument("--reference-timing", type=Path, metavar="TIMING",
                    help="the same for the reference: e.g. an fp32 rerun whose outputs are byte-identical to "
                         "REFERENCE's, kept as its timing file alone")
    ap.add_argument("--seed-metrics", action="store_true",
                    help="compare the ST runs' per-seed metrics only (no timing, no summary.json needed)")
    ap.add_argument("--systems", nargs="+", choices=["baseline", "local"], default=["baseline", "local"],
                    help="with --seed-metrics: the ST systems to compare (default: both)")
    args = ap.parse_args(argv)
    names = tuple(args.names)
    if args.seed_metrics:
        systems = tuple(args.systems)
        quality, ok = quality_table(seed_metrics_summary(args.reference, systems),
                                    seed_metrics_summary(args.candidate, systems), names)
        text = "\n".join([f"Quality ({args.reference} vs {args.candidate}; BLEU mean ± 95 % half-width over seeds; "
                          f"{names[1]} − {names[0]}):", "", *quality, "",
                          f"every BLEU mean within the interval: {'yes' if ok else 'no'}"])
        return _emit(text, args.md)
    (t_ref, m_ref), (t_cand, m_cand) = _load(args.reference), _load(args.candidate)
    if args.candidate_timing is not None:  # a rerun whose outputs equal CANDIDATE's, its timing kept alone
        t_cand = json.loads(args.candidate_timing.read_text(encoding="utf-8"))
    if args.reference_timing is not None:
        t_ref = json.loads(args.reference_timing.read_text(encoding="utf-8"))
    quality, ok = quality_table(m_ref, m_cand, names)
    text = "\n".join([f"Wall time, `{t_ref['command']}` in each ({args.reference} vs {args.candidate}):", "",
                      *timing_table(t_ref, t_cand, names), "",
                      f"Quality (BLEU mean ± 95 % half-width over seeds; {names[1]} − {names[0]}):", "", *quality, "",
                      f"every BLEU mean within the interval: {'yes' if ok else 'no'}"])
    return _emit(text, args.md)


def _emit(text: str, md: Path | None) -> int:
    print(text)
    if md is not None:
        from lib.io import atomic_write_text
        atomic_write_text(md, text + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from lib.cli import run_tool

    run_tool(main)
