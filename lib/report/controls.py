"""The report's parts on the controls for Algorithm 1 (params.yaml ``controls``; docs/results.md):

- the retrained controls (stage train_control): their BLEU next to the baseline and `local` of the
  same seeds, sacreBLEU's paired bootstrap per seed against both, and the mean Δ BLEU over seeds with a
  95 % t-interval (paired by seed) for each comparison, with a plain verdict per control;
- the inference band test of every configuration on the ST baseline of each seed in
  ``controls.band_seeds`` (stage band_test): token accuracy, NLL and the share of the w = 1 -> full
  gap recovered, mean ± std over seeds, and the figures.

Reads only small outputs (metrics, decoded test sets). No torch. Both parts are empty, and the report
is what it was without them, when their lists are empty.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lib import layout
from lib.stats import spearman
from lib.decode.metrics import paired_bootstrap
from lib.layout import TEST_SPLIT, RunPaths
from lib.params import Params
from lib.report.figures import Figures
from lib.stats import ci_cell, mean_ci
from lib.io import read_json
from lib.report.tables import SystemScores, read_lines
from lib.stats import mean_std

__all__ = ["ControlRun", "band_section", "ci_text", "collect_controls", "control_scores", "controls_section",
           "table2_p_cell"]


# ----------------------------------------------------------------------------------------------
# Retrained controls (stage train_control)

@dataclass
class ControlRun:
    """One control on one pair: its scores, its windows (layers k+1..L) and per seed the paired
    bootstrap p-values against the baseline and against `local` of that seed."""

    scores: SystemScores
    windows: list[int]
    algorithm1: list[int]
    p_vs_baseline: list[float]
    p_vs_local: list[float]


def _hyps(run: RunPaths, refs: list[str], ref_path: Path) -> list[str]:
    if read_lines(run.refs(TEST_SPLIT)) != refs:
        raise ValueError(f"{run.refs(TEST_SPLIT)} differs from {ref_path}: the systems were not decoded on the same "
                         f"test set")
    hyps = read_lines(run.hyps(TEST_SPLIT))
    if len(hyps) != len(refs):
        raise ValueError(f"{run.hyps(TEST_SPLIT)}: {len(hyps)} hypotheses for {len(refs)} references")
    return hyps


def collect_controls(root: Path, systems: Sequence[str], pair: str, seeds: Sequence[int], full_layers: int,
                     n_samples: int = 1000) -> list[ControlRun]:
    """Every control of ``systems`` on ``pair``. FileNotFoundError / ValueError name the file."""
    out = []
    for name in systems:
        bleu, chrf, p_base, p_local, windows, alg1 = [], [], [], [], None, None
        for seed in seeds:
            run = RunPaths(root, "controls", pair, seed, variant=name)
            m = read_json(run.metrics, f"train_control@{name}-{pair}-{seed}")
            bleu.append(float(m["bleu"]))
            chrf.append(float(m["chrf"]))
            if windows is None:
                windows, alg1 = [int(w) for w in m["windows"]][full_layers:], [int(w) for w in m["algorithm1_windows"]][full_layers:]
            base, local = RunPaths(root, "baseline", pair, seed), RunPaths(root, "local", pair, seed)
            refs = read_lines(base.refs(TEST_SPLIT))
            ours = _hyps(run, refs, base.refs(TEST_SPLIT))
            p_base.append(paired_bootstrap(_hyps(base, refs, base.refs(TEST_SPLIT)), ours, refs,
                                           n_samples=n_samples)["p_value"])
            p_local.append(paired_bootstrap(_hyps(local, refs, base.refs(TEST_SPLIT)), ours, refs,
                                            n_samples=n_samples)["p_value"])
        out.append(ControlRun(SystemScores(pair, name, list(seeds), bleu, chrf), windows or [], alg1 or [],
                              p_base, p_local))
    return out


def table2_p_cell(run: ControlRun) -> str:
    """The paired-bootstrap cell of a control's Table 2 row."""
    return ("vs baseline: " + ", ".join(f"{p:.3f}" for p in run.p_vs_baseline)
            + "; vs local: " + ", ".join(f"{p:.3f}" for p in run.p_vs_local))


def _windows_cell(windows: Sequence[int]) -> str:
    """The windows and Spearman's ρ of them with depth (the shuffle may keep some of the order). One width in
    every layer (the uniform control) has no ρ: a constant side leaves it undefined, not 0."""
    if len(set(windows)) == 1 and len(windows) > 1:
        return " ".join(map(str, windows)) + " (one width: ρ undefined)"
    rho = f" (ρ {spearman(range(len(windows)), windows):+.2f})" if len(windows) > 1 else ""
    return " ".join(map(str, windows)) + rho


def _verdict(name: str, m: float, h: float) -> str:
    if math.isnan(h):
        return f"`{name}` − local = {m:+.2f} BLEU on one seed: no interval, no verdict"
    if m - h > 0:
        return f"`{name}` beats Algorithm 1's windows: {ci_cell(m, h)} BLEU"
    if m + h < 0:
        return f"Algorithm 1's windows beat `{name}`: {ci_cell(m, h)} BLEU"
    return f"`{name}` matches Algorithm 1's windows within the seed spread: {ci_cell(m, h)} BLEU, an interval that holds 0"


def _asr_sentence(p: Params) -> str:
    """Which ASR model the controls start from (``controls.asr_systems``)."""
    own = [name for name in p.controls.systems if name in p.controls.asr_systems]
    if not own:
        return "Same ASR model as `local` (runs/asr_local/<pair>, no fork of its own)"
    others = [name for name in p.controls.systems if name not in own]
    text = (", ".join(f"`{n}`" for n in own) + ": an ASR fork of its own (stage train_asr_control: the shared ASR "
            f"training finished over its last {p.asr.fork_updates} updates with the control's windows, as `local`'s "
            "is with Algorithm 1's)")
    if others:
        text += "; " + ", ".join(f"`{n}`" for n in others) + ": `local`'s ASR model (runs/asr_local/<pair>)"
    return text


def controls_section(root: Path, p: Params, scores: Sequence[SystemScores],
                     runs: dict[str, list[ControlRun]], sig: dict[str, list[dict]]) -> tuple[str, dict[str, float]]:
    """The section on the retrained controls (Markdown) and its flat keys; ("", {}) without controls.
    ``scores``: the baseline and local scores of Table 2; ``sig``: local vs baseline p-values per pair."""
    if not p.controls.systems:
        return "", {}
    by = {(s.pair, s.system): s for s in scores}
    full = p.analysis.full_layers
    parts = ["\n## Controls for Algorithm 1 (retrained)\n",
             "Does Algorithm 1's per-layer assignment of windows matter, or only their mean width? Each control "
             f"retrains the local system with other windows in layers {full + 1}-L: `local_uniform` puts every such "
             "layer at one window, the mean of Algorithm 1's windows rounded to the nearest odd width (ties up); "
             "`local_shuffled` permutes Algorithm 1's windows across those layers (`controls.shuffle_seed` = "
             f"{p.controls.shuffle_seed}). {_asr_sentence(p)}, same "
             f"`train_st` settings and seeds {p.seeds}. Δ: mean over seeds of the per-seed difference, with its 95 % "
             "t-interval over seeds (the verdicts below read only this); p < 0.05: seeds where sacreBLEU's paired "
             "bootstrap over the test sentences (1000 resamples) finds a difference, a secondary column that sees "
             "test-set sampling, not training variance.\n"]
    flat: dict[str, float] = {}
    for pair in p.pairs:
        base, local = by[(pair, "baseline")], by[(pair, "local")]
        lines = ["| system | windows (layers k+1..L; ρ with depth) | BLEU (mean ± std) | Δ vs baseline [95 % CI over seeds] | "
                 "test-set bootstrap p < 0.05 vs baseline | Δ vs local [95 % CI over seeds] | test-set bootstrap p < 0.05 "
                 "vs local |", "|---|---|---|---|---|---|---|"]
        lm, lh = mean_ci([a - b for a, b in zip(local.bleu, base.bleu)])
        alg1 = runs[pair][0].algorithm1 if runs[pair] else []
        n_sig = sum(x["p_value"] < 0.05 for x in sig.get(pair, []))
        lines.append(f"| local (Algorithm 1) | {_windows_cell(alg1)} | {local.bleu_mean_std[0]:.2f} ± "
                     f"{local.bleu_mean_std[1]:.2f} | {ci_cell(lm, lh)} | {n_sig} of {len(sig.get(pair, []))} | | |")
        verdicts = []
        for run in runs[pair]:
            s = run.scores
            bm, bh = mean_ci([a - b for a, b in zip(s.bleu, base.bleu)])
            vm, vh = mean_ci([a - b for a, b in zip(s.bleu, local.bleu)])
            nb = sum(x < 0.05 for x in run.p_vs_baseline)
            nl = sum(x < 0.05 for x in run.p_vs_local)
            lines.append(f"| {s.system} | {_windows_cell(run.windows)} | {s.bleu_mean_std[0]:.2f} ± "
                         f"{s.bleu_mean_std[1]:.2f} | {ci_cell(bm, bh)} | {nb} of {len(s.seeds)} | {ci_cell(vm, vh)} | "
                         f"{nl} of {len(s.seeds)} |")
            verdicts.append(f"- {pair}: {_verdict(s.system, vm, vh)}.")
            key = f"{pair}/{s.system}"
            flat.update({f"{key}/delta_vs_baseline": round(bm, 2), f"{key}/delta_vs_local": round(vm, 2)})
            if not math.isnan(bh):
                flat[f"{key}/delta_vs_baseline_ci95"] = round(bh, 2)
                flat[f"{key}/delta_vs_local_ci95"] = round(vh, 2)
        parts += [f"\n### {pair}\n", "\n".join(lines) + "\n", "\n" + "\n".join(verdicts) + "\n"]
    return "\n".join(parts), flat


# ----------------------------------------------------------------------------------------------
# Inference band test on every seed's baseline (stage band_test)

BAND_LABELS = {"full": "full attention", "alg1": "Algorithm 1", "uniform": "uniform (rounded mean)",
               "shuffled": "shuffled Algorithm 1"}


def _label(name: str) -> str:
    return BAND_LABELS.get(name, f"w = {name[1:]}" if name.startswith("w") else name)


def band_section(root: Path, pairs: Sequence[str], seeds: Sequence[int],
                 figures: Figures | None = None) -> tuple[str, dict[str, float]]:
    """The band-test tables (one per pair, mean ± std over ``seeds``) with the figures, and flat keys;
    ("", {}) when ``seeds`` is empty. FileNotFoundError names the missing file and its stage."""
    if not seeds:
        return "", {}
    parts = ["\n## Inference band test on every seed's ST baseline (stage band_test)\n",
             "Layers k+1..L of the ST baseline switched to local attention at inference, no retraining: one "
             "window w in every layer, Algorithm 1's windows (the ones `local` trains with), the uniform control "
             "(their mean rounded to the nearest odd width) and the shuffled control (the same windows in another "
             "layer order), next to full attention. Teacher-forced token accuracy (%) and NLL per target token on "
             "the band-test split; gap recovered = (acc − acc(w = 1)) / (acc(full) − acc(w = 1)). Mean ± std over "
             f"the baselines of seeds {list(seeds)}.\n"]
    flat: dict[str, float] = {}
    for pair in pairs:
        results = [read_json(layout.band_test_metrics(root, pair, seed), f"band_test@{pair}-{seed}") for seed in seeds]
        names = results[0].get("order") or list(results[0]["rows"])
        lines = ["| configuration | windows (layers k+1..L) | mean width | token accuracy | NLL | gap recovered "
                 "(mean ± std) | gap recovered per seed |", "|---|---|---|---|---|---|---|"]
        for name in names:
            rows = [r["rows"][name] for r in results]
            am, asd = mean_std([r["acc"] for r in rows])
            nm, nsd = mean_std([r["nll"] for r in rows])
            gaps = [r["gap_recovered"] for r in rows]
            ws = rows[0]["windows"]
            if ws is None:
                wtxt, mean_w = "all", "–"
            else:
                wtxt = f"{ws[0]} in every layer" if len(set(ws)) == 1 else " ".join(map(str, ws))
                mean_w = f"{rows[0]['mean_window']:.2f}"
            if any(g is None for g in gaps):
                gtxt, per_seed = "–", "–"
            else:
                gm, gs = mean_std(gaps)
                gtxt, per_seed = f"{gm:.0%} ± {gs:.0%}", ", ".join(f"{g:.0%}" for g in gaps)
                if name in ("alg1", "uniform", "shuffled"):  # the headline: Algorithm 1 against its controls
                    flat[f"{pair}/band_test/{name}/gap_recovered"] = round(gm, 4)
            lines.append(f"| {_label(name)} | {wtxt} | {mean_w} | {am:.2f} ± {asd:.2f} | {nm:.3f} ± {nsd:.3f} | "
                         f"{gtxt} | {per_seed} |")
        compare = []
        for control in ("uniform", "shuffled"):
            if all(r["rows"][control]["gap_recovered"] is not None and r["rows"]["alg1"]["gap_recovered"] is not None
                   for r in results):
                more = sum(r["rows"][control]["acc"] > r["rows"]["alg1"]["acc"] for r in results)
                compare.append(f"the {_label(control)} control is more accurate than Algorithm 1's windows on "
                               f"{more} of {len(results)} baselines")
        links = "".join((figures or Figures(root)).link(layout.band_test_plot(root, pair, seed), f"band test {pair} seed {seed}")
                        for seed in seeds)
        text = "; ".join(compare)
        parts += [f"\n### {pair}\n", "\n".join(lines) + "\n",
                  f"\n{text[:1].upper()}{text[1:]}.\n" if compare else "", "\n" + links]
    return "\n".join(parts), flat


def control_scores(runs: dict[str, list[ControlRun]]) -> list[SystemScores]:
    return [r.scores for pair_runs in runs.values() for r in pair_runs]


def ci_text(values: Sequence[float]) -> str:
    """``+m [lo, hi]`` of :func:`mean_ci` (for docs and tests)."""
    return ci_cell(*mean_ci(values))
