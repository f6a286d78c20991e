"""The paper's Table 2 (BLEU of the baseline vs local attention over seeds) and the final report.

Numbers come only from files the pipeline wrote (per-run metrics JSON and hypotheses); nothing is
typed in by hand except the paper's published values, which are labelled as such.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lib import layout
from lib.analysis.rank import spearman
from lib.decode.metrics import paired_bootstrap
from lib.layout import ST_SYSTEMS, TEST_SPLIT, RunPaths
from lib.paper import EN_DE_WINDOWS as PAPER_EN_DE_WINDOWS
from lib.paper import MAIN_DIAGONAL as PAPER_MAIN_DIAGONAL
from lib.paper import TABLE2 as PAPER_TABLE2


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1) over seeds; 0 for a single seed."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def read_json(path: Path, producer: str) -> dict:
    """A pipeline output's JSON; FileNotFoundError naming the file and the stage that writes it."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (written by the {producer} stage)")
    return json.loads(path.read_text(encoding="utf-8"))


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
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (written by the train_{system}@{pair}-{seed} stage)")
        m = json.loads(path.read_text(encoding="utf-8"))
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
    """Flat ``{"<pair>/<system>/<metric>": value}`` for ``dvc metrics diff`` / ``dvc exp show``."""
    out: dict[str, float] = {}
    for s in scores:
        (bm, bs), (cm, cs) = s.bleu_mean_std, s.chrf_mean_std
        out[f"{s.pair}/{s.system}/bleu"] = round(bm, 2)
        out[f"{s.pair}/{s.system}/bleu_std"] = round(bs, 2)
        out[f"{s.pair}/{s.system}/chrf"] = round(cm, 2)
    return out


def table2_markdown(scores: Sequence[SystemScores], sig: dict[str, list[dict]],
                    p_cells: dict[tuple[str, str], str] | None = None) -> str:
    """Table 2: BLEU and chrF mean ± std over seeds, with the paper's BLEU alongside. The p column holds
    local's p-values against the baseline (``sig``), or ``p_cells[(pair, system)]`` for another system
    (the controls: against the baseline and against local)."""
    lines = ["| pair | system | BLEU (mean ± std) | chrF (mean ± std) | seeds | paper BLEU (MuST-C) | paired bootstrap p (per seed) |",
             "|---|---|---|---|---|---|---|"]
    for s in scores:
        (bm, bs), (cm, cs) = s.bleu_mean_std, s.chrf_mean_std
        paper = PAPER_TABLE2.get(s.pair, {}).get(s.system)
        ps = ", ".join(f"{x['p_value']:.3f}" for x in sig.get(s.pair, [])) if s.system == "local" else \
            (p_cells or {}).get((s.pair, s.system), "")
        lines.append(f"| {s.pair} | {s.system} | {bm:.2f} ± {bs:.2f} | {cm:.2f} ± {cs:.2f} | {len(s.seeds)} | "
                     f"{'' if paper is None else f'{paper:.2f}'} | {ps} |")
    return "\n".join(lines) + "\n"


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
            path = layout.health_metrics(root, pair, model)
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing (written by the health_{model} stage)")
            m = json.loads(path.read_text(encoding="utf-8"))
            s = m["summary"]
            cells = [("–" if s.get(key) is None else fmt.format(s[key])) for key, _, fmt in HEALTH_COLUMNS]
            lines.append(f"| {pair} | {model.upper()} | " + " | ".join(cells) + f" | {m.get('algorithm1_windows', '–')} |")
    return "\n".join(lines) + "\n"


def _windows(value) -> list[int]:
    return [int(w) for w in (value.split() if isinstance(value, str) else value)]


def paper_comparison_markdown(root: Path, scores: Sequence[SystemScores], sig: dict[str, list[dict]]) -> str:
    """What this run shows next to the paper, per pair: the local - baseline BLEU gap and its
    significance, the ST encoder's main-diagonal share C_ii, and Algorithm 1's windows in the local
    layers (how many are >= 3, and whether they grow with depth: Spearman's rho of w vs layer).
    Reads metrics/health/<pair>/st.json (stage health_st)."""
    by = {(s.pair, s.system): s for s in scores}
    pairs = list(dict.fromkeys(s.pair for s in scores))
    paper_rho = spearman(range(len(PAPER_EN_DE_WINDOWS)), PAPER_EN_DE_WINDOWS)
    lines = [f"| pair | local − baseline BLEU (paper) | seeds with p < 0.05 | ST C_ii (paper ≈ {PAPER_MAIN_DIAGONAL}) | "
             "windows ≥ 3 (paper en-de: 9 of 9) | windows vs depth, Spearman ρ (paper en-de: "
             f"{paper_rho:.2f}) | ST Alg. 1 windows |", "|---|---|---|---|---|---|---|"]
    for pair in pairs:
        base, local = by.get((pair, "baseline")), by.get((pair, "local"))
        if base is None or local is None:
            continue
        path = layout.health_metrics(root, pair, "st")
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (written by the health_st stage)")
        health = json.loads(path.read_text(encoding="utf-8"))
        windows = _windows(health["algorithm1_windows"])
        gap = local.bleu_mean_std[0] - base.bleu_mean_std[0]
        paper = PAPER_TABLE2.get(pair)
        paper_gap = f" ({paper['local'] - paper['baseline']:+.2f})" if paper else ""
        n_sig = sum(x["p_value"] < 0.05 for x in sig.get(pair, []))
        ge3 = sum(w >= 3 for w in windows)
        rho = spearman(range(len(windows)), windows) if len(windows) > 1 else float("nan")
        lines.append(f"| {pair} | {gap:+.2f}{paper_gap} | {n_sig} of {len(sig.get(pair, []))} | "
                     f"{health['summary']['c_ii_mean']:.2f} | {ge3} of {len(windows)} | {rho:+.2f} | "
                     f"{' '.join(map(str, windows))} |")
    return "\n".join(lines) + "\n"
