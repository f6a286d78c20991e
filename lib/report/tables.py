"""The paper's Table 2 (BLEU of the baseline vs local attention over seeds) and the final report.

Numbers come only from files the pipeline wrote (per-run metrics JSON and hypotheses); nothing is
typed in by hand except the paper's published values, which are labelled as such.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lib import layout
from lib.io import InputError, read_json
from lib.stats import spearman
from lib.decode.metrics import paired_bootstrap
from lib.layout import ST_SYSTEMS, TEST_SPLIT, RunPaths
from lib.paper import EN_DE_WINDOWS as PAPER_EN_DE_WINDOWS
from lib.paper import MAIN_DIAGONAL as PAPER_MAIN_DIAGONAL
from lib.paper import TABLE2 as PAPER_TABLE2
from lib.stats import Interval, interval, mean_std, paired_interval


@dataclass
class SystemScores:
    pair: str
    system: str
    seeds: list[int]
    bleu: list[float]
    chrf: list[float]

    @staticmethod
    def _mean_std(values: Sequence[float]) -> tuple[float, float]:
        return mean_std(values)

    @property
    def bleu_mean_std(self) -> tuple[float, float]:
        return self._mean_std(self.bleu)

    @property
    def chrf_mean_std(self) -> tuple[float, float]:
        return self._mean_std(self.chrf)


def load_scores(root: Path, pair: str, system: str, seeds: Sequence[int]) -> SystemScores:
    """Per-seed BLEU/chrF of one ST system from ``metrics/<system>/<pair>/seed<k>.json``."""
    bleu, chrf = [], []
    for seed in seeds:
        path = RunPaths(root, system, pair, seed).metrics
        m = read_json(path, f"train_{system}@{pair}-{seed}", numbers=("bleu", "chrf"))
        bleu.append(float(m["bleu"]))
        chrf.append(float(m["chrf"]))
    return SystemScores(pair, system, list(seeds), bleu, chrf)


def read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (written by the stage that trained and decoded the run)")
    return path.read_text(encoding="utf-8").splitlines()


def significance(root: Path, pair: str, seeds: Sequence[int], split: str = TEST_SPLIT,
                 n_samples: int = 1000) -> list[dict]:
    """sacreBLEU's paired bootstrap (baseline vs local) for each seed's pair of runs, on the runs'
    decoded test sets (data/decoded/<system>/<pair>/seed<k>/)."""
    out = []
    for seed in seeds:
        runs = {system: RunPaths(root, system, pair, seed) for system in ST_SYSTEMS}
        refs = read_lines(runs["baseline"].refs(split))
        if read_lines(runs["local"].refs(split)) != refs:
            raise ValueError(f"{runs['local'].refs(split)} differs from {runs['baseline'].refs(split)}: "
                             f"the two systems were not decoded on the same test set")
        hyps = {}
        for system, paths in runs.items():
            hyps[system] = read_lines(paths.hyps(split))
            if len(hyps[system]) != len(refs):
                raise ValueError(f"{paths.hyps(split)}: {len(hyps[system])} hypotheses for {len(refs)} references")
        res = paired_bootstrap(hyps["baseline"], hyps["local"], refs, n_samples=n_samples)
        out.append({"seed": seed, "p_value": res["p_value"]})
    return out


def summary(scores: Sequence[SystemScores]) -> dict[str, float]:
    """Flat ``{"<pair>/<system>/<metric>": value}`` of the headline (metrics/summary.json): per system the
    mean BLEU and chrF over seeds and the half-width of their 95 % t-interval over seeds (``*_ci95``)."""
    out: dict[str, float] = {}
    for s in scores:
        for metric, values in (("bleu", s.bleu), ("chrf", s.chrf)):
            ci = interval(values)
            out[f"{s.pair}/{s.system}/{metric}"] = round(ci.mean, 2)
            if ci.defined:
                out[f"{s.pair}/{s.system}/{metric}_ci95"] = round(ci.half, 2)
    return out


def local_minus_baseline(base: SystemScores, local: SystemScores) -> Interval:
    """local − baseline BLEU, paired by seed: the mean of the per-seed differences and its 95 % t-interval."""
    if base.seeds != local.seeds:
        raise ValueError(f"{base.pair}: baseline seeds {base.seeds} and local seeds {local.seeds} differ")
    return paired_interval(local.bleu, base.bleu)


def table2_markdown(scores: Sequence[SystemScores], sig: dict[str, list[dict]],
                    p_cells: dict[tuple[str, str], str] | None = None) -> str:
    """Table 2: BLEU and chrF, mean over seeds with its 95 % t-interval over seeds and the sample std, with
    the paper's BLEU alongside. The last column is the per-seed test-set bootstrap: local's p-values against
    the baseline (``sig``), or ``p_cells[(pair, system)]`` for another system (the controls)."""
    lines = ["| pair | system | BLEU, mean [95 % CI over seeds] | BLEU std | chrF, mean [95 % CI over seeds] | seeds | "
             "paper BLEU (MuST-C) | test-set bootstrap p per seed (test-set sampling only) |",
             "|---|---|---|---|---|---|---|---|"]
    for s in scores:
        bleu, chrf = interval(s.bleu), interval(s.chrf)
        paper = PAPER_TABLE2.get(s.pair, {}).get(s.system)
        ps = ", ".join(f"{x['p_value']:.3f}" for x in sig.get(s.pair, [])) if s.system == "local" else \
            (p_cells or {}).get((s.pair, s.system), "")
        lines.append(f"| {s.pair} | {s.system} | {_level_cell(bleu)} | {s.bleu_mean_std[1]:.2f} | {_level_cell(chrf)} | "
                     f"{len(s.seeds)} | {'' if paper is None else f'{paper:.2f}'} | {ps} |")
    return "\n".join(lines) + "\n"


def per_seed_markdown(scores: Sequence[SystemScores]) -> str:
    """BLEU / chrF of every run, one row per pair and system, and per pair the per-seed local − baseline
    BLEU: the numbers behind Table 2 and the intervals (the per-run metrics files are DVC outputs)."""
    seeds = sorted({seed for s in scores for seed in s.seeds})
    lines = ["| pair | system | " + " | ".join(f"seed {k}: BLEU / chrF" for k in seeds) + " |",
             "|---|---|" + "---|" * len(seeds)]
    by = {(s.pair, s.system): s for s in scores}
    for s in scores:
        cells = {k: f"{b:.2f} / {c:.2f}" for k, b, c in zip(s.seeds, s.bleu, s.chrf)}
        lines.append(f"| {s.pair} | {s.system} | " + " | ".join(cells.get(k, "") for k in seeds) + " |")
        if s.system == "local" and (s.pair, "baseline") in by:
            base = by[(s.pair, "baseline")]
            diff = {k: f"{b - a:+.2f}" for k, a, b in zip(base.seeds, base.bleu, s.bleu)}
            lines.append(f"| {s.pair} | local − baseline (BLEU) | " + " | ".join(diff.get(k, "") for k in seeds) + " |")
    return "\n".join(lines) + "\n"


def _level_cell(ci: Interval) -> str:
    """``m [lo, hi]`` without signs (a level, not a difference)."""
    return f"{ci.mean:.2f}" + (f" [{ci.lo:.2f}, {ci.hi:.2f}]" if ci.defined else "")


HEALTH_COLUMNS = (
    ("position_share", "position share (layer 1)", "{:.2f}"),
    ("c_ii_mean", "C_ii", "{:.2f}"),
    ("band2_mean", "±2 mass / uniform", "{:.2f}"),
    ("local_heads", "heads ≥ 2× at ±2", "{}"),
    ("falloff_mean", "contribution offsets 1-2 / 6-8", "{:.2f}"),
    ("acc_full", "acc full", "{:.1f}"),
    ("acc_w1", "acc w=1", "{:.1f}"),
    ("acc_alg1", "acc Alg. 1", "{:.1f}"),
    ("alg1_gap_recovered", "gap recovered", "{:.0%}"),
)


def health_markdown(root: Path, pairs: Sequence[str]) -> str:
    """One row per pair and model from ``metrics/health/<pair>/<model>.json`` (stages health_asr /
    health_st): the summary over layers k+1..L, Algorithm 1's windows, and the band test."""
    head = "| pair | model | " + " | ".join(c[1] for c in HEALTH_COLUMNS) + " | Alg. 1 windows (layers k+1..L) |"
    lines = [head, "|" + "---|" * (len(HEALTH_COLUMNS) + 3)]
    for pair in pairs:
        for model in ("asr", "st"):
            m = _health(root, pair, model)
            s = m["summary"]
            cells = [("–" if s.get(key) is None else fmt.format(s[key])) for key, _, fmt in HEALTH_COLUMNS]
            lines.append(f"| {pair} | {model.upper()} | " + " | ".join(cells) + f" | {m.get('algorithm1_windows', '–')} |")
    return "\n".join(lines) + "\n"


def _windows(value) -> list[int]:
    return [int(w) for w in (value.split() if isinstance(value, str) else value)]


def paper_comparison_markdown(root: Path, scores: Sequence[SystemScores], sig: dict[str, list[dict]]) -> str:
    """What this run shows next to the paper, per pair: local − baseline BLEU with its 95 % t-interval over
    seeds (paired by seed), the seeds where the per-seed test-set bootstrap finds p < 0.05 (a secondary
    column: it sees test-set sampling, not training variance), the ST encoder's main-diagonal share C_ii,
    and Algorithm 1's windows in the local layers (how many are >= 3, and Spearman's rho of w vs layer).
    Reads metrics/health/<pair>/st.json (stage health_st)."""
    by = {(s.pair, s.system): s for s in scores}
    pairs = list(dict.fromkeys(s.pair for s in scores))
    paper_rho = spearman(range(len(PAPER_EN_DE_WINDOWS)), PAPER_EN_DE_WINDOWS)
    lines = ["| pair | local − baseline BLEU [95 % CI over seeds] (paper) | seeds with test-set bootstrap p < 0.05 | "
             f"ST C_ii (paper ≈ {PAPER_MAIN_DIAGONAL}) | windows ≥ 3 (paper en-de: 9 of 9) | windows vs depth, Spearman ρ "
             f"(paper en-de: {paper_rho:+.2f}) | ST Alg. 1 windows |", "|---|---|---|---|---|---|---|"]
    for pair in pairs:
        base, local = by.get((pair, "baseline")), by.get((pair, "local"))
        if base is None or local is None:
            continue
        health = st_health(root, pair)
        windows = _windows(health["algorithm1_windows"])
        gap = local_minus_baseline(base, local)
        paper = PAPER_TABLE2.get(pair)
        paper_gap = f" ({paper['local'] - paper['baseline']:+.2f})" if paper else ""
        n_sig = sum(x["p_value"] < 0.05 for x in sig.get(pair, []))
        ge3 = sum(w >= 3 for w in windows)
        lines.append(f"| {pair} | {gap.cell()}{paper_gap} | {n_sig} of {len(sig.get(pair, []))} | "
                     f"{health['summary']['c_ii_mean']:.2f} | {ge3} of {len(windows)} | {_rho(windows):+.2f} | "
                     f"{' '.join(map(str, windows))} |")
    return "\n".join(lines) + "\n"


def st_health(root: Path, pair: str) -> dict:
    """metrics/health/<pair>/st.json (stage health_st): the analysed ST baseline's attention health."""
    return _health(root, pair, "st", keys=("algorithm1_windows",))


def _health(root: Path, pair: str, model: str, keys: tuple[str, ...] = ()) -> dict:
    """metrics/health/<pair>/<model>.json with its ``summary`` (a mapping) and ``keys``; InputError
    naming the file and the stage to rerun otherwise."""
    path, producer = layout.health_metrics(root, pair, model), f"health_{model}@{pair}"
    m = read_json(path, producer, keys=("summary", *keys))
    if not isinstance(m["summary"], dict):
        raise InputError(f"{path}: 'summary' is {type(m['summary']).__name__}, not a mapping (written by the "
                         f"{producer} stage); rerun {producer}")
    return m


def _rho(windows: Sequence[int]) -> float:
    return spearman(range(len(windows)), windows) if len(windows) > 1 else float("nan")


def headline(root: Path, scores: Sequence[SystemScores]) -> dict[str, float | str]:
    """The per-pair headline keys of metrics/summary.json beyond :func:`summary`: local − baseline BLEU
    (paired by seed) and the half-width of its 95 % t-interval, the ST encoder's C_ii, Algorithm 1's windows
    in the local layers and their Spearman ρ with depth (from health_st)."""
    by = {(s.pair, s.system): s for s in scores}
    out: dict[str, float | str] = {}
    for pair in dict.fromkeys(s.pair for s in scores):
        base, local = by.get((pair, "baseline")), by.get((pair, "local"))
        if base is None or local is None:
            continue
        gap = local_minus_baseline(base, local)
        out[f"{pair}/local_minus_baseline/bleu"] = round(gap.mean, 2)
        if gap.defined:
            out[f"{pair}/local_minus_baseline/bleu_ci95"] = round(gap.half, 2)
        health = st_health(root, pair)
        windows = _windows(health["algorithm1_windows"])
        out[f"{pair}/st_c_ii"] = round(float(health["summary"]["c_ii_mean"]), 3)
        out[f"{pair}/windows"] = " ".join(map(str, windows))
        out[f"{pair}/windows_rho"] = round(_rho(windows), 2)
    return out
