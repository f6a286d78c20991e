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

from lib.data.prepare import read_manifest
from lib.decode.metrics import paired_bootstrap

# Table 2 of the paper (MuST-C tst-COMMON BLEU), for reading our numbers next to theirs.
PAPER_TABLE2 = {"en-de": {"baseline": 22.53, "local": 22.49},
                "en-es": {"baseline": 27.49, "local": 27.46},
                "en-it": {"baseline": 22.98, "local": 22.97}}
SYSTEMS = {"baseline": "st", "local": "local"}  # system name -> metrics/runs folder


@dataclass
class SystemScores:
    pair: str
    system: str
    seeds: list[int]
    bleu: list[float]
    chrf: list[float]

    @staticmethod
    def _mean_std(values: Sequence[float]) -> tuple[float, float]:
        # Sample standard deviation (n - 1) over seeds; 0 for a single seed.
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    @property
    def bleu_mean_std(self) -> tuple[float, float]:
        return self._mean_std(self.bleu)

    @property
    def chrf_mean_std(self) -> tuple[float, float]:
        return self._mean_std(self.chrf)


def load_scores(root: Path, pair: str, system: str, seeds: Sequence[int]) -> SystemScores:
    """Per-seed BLEU/chrF of one system from ``metrics/<folder>/<pair>/seed<k>.json``."""
    folder = SYSTEMS[system]
    bleu, chrf = [], []
    for seed in seeds:
        path = root / "metrics" / folder / pair / f"seed{seed}.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (written by the train_{'st' if folder == 'st' else 'local'} stage)")
        m = json.loads(path.read_text(encoding="utf-8"))
        bleu.append(float(m["bleu"]))
        chrf.append(float(m["chrf"]))
    return SystemScores(pair, system, list(seeds), bleu, chrf)


def significance(root: Path, pair: str, seeds: Sequence[int], prepared_dir: Path, split: str = "tst-COMMON",
                 n_samples: int = 1000) -> list[dict]:
    """sacreBLEU's paired bootstrap (baseline vs local) for each seed's pair of runs."""
    refs = [r["tgt_text"] for r in read_manifest(prepared_dir / f"{split}.tsv")]
    out = []
    for seed in seeds:
        hyps = {}
        for system, folder in SYSTEMS.items():
            path = root / "runs" / folder / pair / f"seed{seed}" / f"hyps.{split}.txt"
            hyps[system] = path.read_text(encoding="utf-8").splitlines()
            if len(hyps[system]) != len(refs):
                raise ValueError(f"{path}: {len(hyps[system])} hypotheses for {len(refs)} references")
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


def table2_markdown(scores: Sequence[SystemScores], sig: dict[str, list[dict]]) -> str:
    """Table 2: BLEU and chrF mean ± std over seeds, with the paper's BLEU alongside."""
    lines = ["| pair | system | BLEU (mean ± std) | chrF (mean ± std) | seeds | paper BLEU (MuST-C) | paired bootstrap p (per seed) |",
             "|---|---|---|---|---|---|---|"]
    for s in scores:
        (bm, bs), (cm, cs) = s.bleu_mean_std, s.chrf_mean_std
        paper = PAPER_TABLE2.get(s.pair, {}).get(s.system)
        ps = ", ".join(f"{x['p_value']:.3f}" for x in sig.get(s.pair, [])) if s.system == "local" else ""
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
            path = root / "metrics" / "health" / pair / f"{model}.json"
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing (written by the health_{model} stage)")
            m = json.loads(path.read_text(encoding="utf-8"))
            s = m["summary"]
            cells = [("–" if s.get(key) is None else fmt.format(s[key])) for key, _, fmt in HEALTH_COLUMNS]
            lines.append(f"| {pair} | {model.upper()} | " + " | ".join(cells) + f" | {m.get('algorithm1_windows', '–')} |")
    return "\n".join(lines) + "\n"
