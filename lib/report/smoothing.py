"""The report's section on attention smoothing with priors (Maekaku et al.; docs/variants.md): per pair,
BLEU/chrF of every system in ``smoothing.systems`` against the baseline of the same seeds, the paired
bootstrap per seed, and the effect the paper describes on the encoder self-attention (mean diagonal
weight and row entropy, smoothed vs baseline), with a figure. Reads only small outputs:
metrics/variants/smoothing/<system>/<pair>/seed<k>.json, the decoded test sets and the baseline's
metrics. No torch (matplotlib only when there is something to plot)."""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from lib.decode.metrics import paired_bootstrap
from lib.layout import TEST_SPLIT, RunPaths, variant_figure
from lib.model.config import BAND_INIT_LOGIT, DEFAULT_BAND_K, DEFAULT_GAMMA, smoothing_layers
from lib.params.smoothing import SmoothingParams
from lib.report.figures import Figures
from lib.stats import Interval, ci_cell, mean_ci, paired_interval
from lib.io import read_json
from lib.report.tables import read_lines
from lib.stats import mean_std

# The paper's qualitative claims (docs/variants.md); its only numbers are relative WER gains.
SEED_CLAIMS = {
    "Q1": "recursive smoothing beats non-recursive smoothing (`rec` > `prev`)",
    "Q2": "recursive smoothing helps on source-target (cross) attention as well as on self-attention",
    "Q3": "predicted γ on all attentions (`rec_pred_all`) is the best system (WSJ)",
    "Q4": "the truncated band prior beats vanilla and relaxed attention only in some cases, by small margins",
    "Q5": "relaxed attention (uniform prior) in training only; the other priors in training and inference",
    "Q6": "vanilla self-attention is sharply peaked on the diagonal; recursive smoothing makes it less peaky",
}
SEED_NUMBERS = "relative WER gains of up to 2.9 % (LibriSpeech 100 h) and 7.9 % (WSJ) over a vanilla Transformer"


def smoothed_layers(definition: dict, n_layers: int) -> list[int]:
    """1-based encoder layers a definition smooths (all layers when it smooths none of the encoder's:
    then the encoder statistics are compared over the whole encoder)."""
    if "encoder" not in definition.get("where", ["encoder"]):
        return list(range(1, n_layers + 1))
    return smoothing_layers(definition.get("layers"), definition["prior"], n_layers, key="smoothing")


def band_in_band_mass(b: Sequence[float], n: int, band_outside: str = "literal") -> float:
    """The band prior's mass on its k-band for a query row whose k band keys all lie inside a sequence
    of ``n`` >= k keys: Σ_band e^b / (Σ_band e^b + (n − k) e^0) (off-band logits 0, reading A3); 1 with
    ``band_outside: masked``. Uniform (b = 0) gives k / n."""
    if band_outside == "masked":
        return 1.0
    inside = sum(math.exp(x) for x in b)
    return inside / (inside + max(n - len(b), 0))


def band_start_logits(definition: dict) -> list[float] | None:
    """The band logits a definition starts from (lib.model.attention.band_logits_init): ln 100 on the
    centred ``band_init_width`` entries of k, 0 elsewhere. None when the start width is per layer (a
    definition over the local model without ``band_init_width``: each layer's window)."""
    k = definition.get("k", DEFAULT_BAND_K)
    width = definition.get("band_init_width")
    if width is None:
        if definition.get("base", "full") == "local":
            return None
        width = k
    lo = (k - width) // 2
    return [BAND_INIT_LOGIT if lo <= j < lo + width else 0.0 for j in range(k)]


def learned_movement(definition: dict, rows: Sequence[dict]) -> tuple[str, dict[str, float]]:
    """What the prior's own parameters learned, from the runs' metrics (lib/analysis/peakiness.py):
    the band prior's in-band mass at the end vs at its start and vs uniform, at the typical encoder
    length N = exp(uniform entropy) of the measured sentences; the predicted gate's mean g over the
    encoder's gated layers vs its start ``gate_init``. Returns (table cell, flat values)."""
    cells, flat = [], {}
    gates = [g for r in rows for g in (r["metrics"].get("gate_mean") or []) if g is not None]
    if gates:
        start = float(definition.get("gate_init", DEFAULT_GAMMA))
        g = statistics.fmean(gates)
        cells.append(f"encoder g = {g:.3f} (start {start:.3f})")
        flat.update({"gate_mean": round(g, 4), "gate_start": start})
    bands = [b for r in rows for b in (r["metrics"].get("band_logits") or []) if b is not None]
    uniform = [r["metrics"].get("uniform_entropy") for r in rows]
    if bands and not isinstance(bands[0][0], list) and all(u is not None for u in uniform):
        n = round(math.exp(statistics.fmean(uniform)))
        outside = definition.get("band_outside", "literal")
        mass = statistics.fmean(band_in_band_mass(b, n, outside) for b in bands)
        k = len(bands[0])
        start = band_start_logits(definition)
        start_s = "" if start is None else f", start {band_in_band_mass(start, n, outside):.1%}"
        cells.append(f"in-band mass {mass:.1%}{start_s}, uniform {min(k / n, 1.0):.1%} (k = {k}, N = {n}); "
                     f"logit centre {statistics.fmean(b[k // 2] for b in bands):+.2f}, "
                     f"edges {statistics.fmean(statistics.fmean([b[0], b[-1]]) for b in bands):+.2f}")
        flat["band_in_band_mass"] = round(mass, 4)
        if start is not None:
            flat["band_in_band_mass_start"] = round(band_in_band_mass(start, n, outside), 4)
    return "; ".join(cells), flat


def _layer_mean(values: Sequence[float], layers: Sequence[int]) -> float:
    return statistics.fmean(values[li - 1] for li in layers)


def collect(root: Path, sp: SmoothingParams, pair: str) -> dict[str, Any]:
    """Per system (and the baseline), per seed: BLEU, chrF, p-value vs the baseline of that seed, and
    the per-layer attention statistics. FileNotFoundError / ValueError name the file."""
    base_bleu, base_chrf = [], []
    for seed in sp.seeds:
        m = read_json(RunPaths(root, "baseline", pair, seed).metrics, f"train_baseline@{pair}-{seed}")
        base_bleu.append(float(m["bleu"]))
        base_chrf.append(float(m["chrf"]))
    systems: dict[str, dict[str, Any]] = {}
    for name in sp.systems:
        rows = []
        for seed in sp.seeds:
            run = RunPaths(root, "smoothing", pair, seed, variant=name)
            m = read_json(run.metrics, f"train_smoothing@{name}-{pair}-{seed}")
            base = RunPaths(root, "baseline", pair, seed)
            refs = read_lines(base.refs(TEST_SPLIT))
            if read_lines(run.refs(TEST_SPLIT)) != refs:
                raise ValueError(f"{run.refs(TEST_SPLIT)} differs from {base.refs(TEST_SPLIT)}: not the same test set")
            hyps, base_hyps = read_lines(run.hyps(TEST_SPLIT)), read_lines(base.hyps(TEST_SPLIT))
            for path, h in ((run.hyps(TEST_SPLIT), hyps), (base.hyps(TEST_SPLIT), base_hyps)):
                if len(h) != len(refs):
                    raise ValueError(f"{path}: {len(h)} hypotheses for {len(refs)} references")
            p_value = paired_bootstrap(base_hyps, hyps, refs, n_samples=1000)["p_value"]
            rows.append({"seed": seed, "metrics": m, "p_value": p_value})
        systems[name] = {"runs": rows, "definition": rows[0]["metrics"].get("definition", sp.defs[name])}
    return {"pair": pair, "baseline_bleu": base_bleu, "baseline_chrf": base_chrf, "systems": systems}


def _per_layer_mean(rows: Sequence[dict], key: str) -> list[float]:
    per_seed = [r["metrics"][key] for r in rows]
    return [statistics.fmean(v[li] for v in per_seed) for li in range(len(per_seed[0]))]


def table_markdown(data: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """(Markdown table, flat summary keys ``<pair>/smooth_<system>/<metric>``) of one pair."""
    pair = data["pair"]
    bm, bs = mean_std(data["baseline_bleu"])
    cm, cs = mean_std(data["baseline_chrf"])
    lines = ["| system | definition | BLEU (mean ± std) | chrF | Δ BLEU vs baseline [95 % CI over seeds] | "
             "test-set bootstrap p per seed (test-set sampling only) | "
             "diag weight: system / baseline | row entropy (nats): system / baseline | learned |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| baseline | full attention | {bm:.2f} ± {bs:.2f} | {cm:.2f} ± {cs:.2f} | | | | | |"]
    flat: dict[str, float] = {}
    for name, sysd in data["systems"].items():
        rows = sysd["runs"]
        bleu = [float(r["metrics"]["bleu"]) for r in rows]
        chrf = [float(r["metrics"]["chrf"]) for r in rows]
        sm, ss = mean_std(bleu)
        sc, _ = mean_std(chrf)
        diag, bdiag = _per_layer_mean(rows, "attn_diag"), _per_layer_mean(rows, "baseline_attn_diag")
        ent, bent = _per_layer_mean(rows, "attn_entropy"), _per_layer_mean(rows, "baseline_attn_entropy")
        layers = smoothed_layers(sysd["definition"], len(diag))
        # rounded once, so that the table, the claims and summary.json show the same numbers
        d, bd = round(_layer_mean(diag, layers), 4), round(_layer_mean(bdiag, layers), 4)
        e, be = round(_layer_mean(ent, layers), 3), round(_layer_mean(bent, layers), 3)
        learned, moved = learned_movement(sysd["definition"], rows)
        flat.update({f"{pair}/smooth_{name}/{k}": v for k, v in moved.items()})
        definition = ", ".join(f"{k}: {v}" for k, v in sysd["definition"].items())
        ps = ", ".join(f"{r['p_value']:.3f}" for r in rows)
        # the same seeds in the same order (collect): the per-seed difference, its mean and t-interval
        dm, dh = mean_ci([a - b for a, b in zip(bleu, data["baseline_bleu"])])
        if not math.isnan(dh):
            flat[f"{pair}/smooth_{name}/delta_bleu_ci95"] = round(dh, 2)
        lines.append(f"| {name} | {definition} | {sm:.2f} ± {ss:.2f} | {sc:.2f} | {ci_cell(dm, dh)} | {ps} | "
                     f"{d:.4f} / {bd:.4f} | {e:.3f} / {be:.3f} | {learned} |")
        flat.update({f"{pair}/smooth_{name}/bleu": round(sm, 2), f"{pair}/smooth_{name}/bleu_std": round(ss, 2),
                     f"{pair}/smooth_{name}/chrf": round(sc, 2), f"{pair}/smooth_{name}/delta_bleu": round(sm - bm, 2),
                     f"{pair}/smooth_{name}/attn_diag": d, f"{pair}/smooth_{name}/baseline_attn_diag": bd,
                     f"{pair}/smooth_{name}/attn_entropy": e, f"{pair}/smooth_{name}/baseline_attn_entropy": be})
    return "\n".join(lines) + "\n", flat


def claims_markdown(data: dict[str, Any], flat: dict[str, float]) -> str:
    """The paper's claims next to what this run measured, for the claims the run's systems can test."""
    pair, have = data["pair"], data["systems"]

    def bleu(name: str) -> float:
        return flat[f"{pair}/smooth_{name}/bleu"]

    base = statistics.fmean(data["baseline_bleu"])

    def per_seed(name: str) -> list[float]:
        return [float(r["metrics"]["bleu"]) for r in data["systems"][name]["runs"]]

    def verdict(ci: Interval) -> str:
        """The paper's direction is +: it holds only when the interval over seeds lies above 0."""
        return {1: "agrees", -1: "disagrees"}.get(ci.sign(), "not shown: the interval over seeds holds 0")

    out = []
    for q, claim in SEED_CLAIMS.items():
        measured = "not tested by the systems run"
        if q == "Q1" and {"rec", "prev"} <= set(have):
            ci = paired_interval(per_seed("rec"), per_seed("prev"))
            measured = f"`rec` − `prev` = {ci.cell()} BLEU (95 % CI over seeds): {verdict(ci)}"
        elif q == "Q2" and any(n in have for n in ("rec_all", "relaxed_cross")):
            parts = []
            if "rec_all" in have and "rec" in have:
                parts.append(f"`rec_all` − `rec` = {paired_interval(per_seed('rec_all'), per_seed('rec')).cell()} BLEU")
            if "relaxed_cross" in have:
                parts.append(f"`relaxed_cross` − baseline = "
                             f"{paired_interval(per_seed('relaxed_cross'), data['baseline_bleu']).cell()} BLEU")
            measured = "; ".join(parts) if parts else \
                f"`rec_all` − baseline = {paired_interval(per_seed('rec_all'), data['baseline_bleu']).cell()} BLEU"
        elif q == "Q3" and "rec_pred_all" in have and len(have) > 1:
            best_other = max((n for n in have if n != "rec_pred_all"), key=bleu)
            ci = paired_interval(per_seed("rec_pred_all"), per_seed(best_other))
            measured = (f"best other system here: `{best_other}` ({bleu(best_other):.2f}); `rec_pred_all` − "
                        f"`{best_other}` = {ci.cell()} BLEU: {verdict(ci)}")
        elif q == "Q4" and "band" in have:
            rel = f"; `relaxed_enc` {bleu('relaxed_enc'):.2f}" if "relaxed_enc" in have else ""
            measured = f"`band` − baseline = {paired_interval(per_seed('band'), data['baseline_bleu']).cell()} BLEU{rel}"
        elif q == "Q5":
            measured = "built so: `train_only` relaxed attention is the plain layer at inference (tested)"
        elif q == "Q6" and any(n in have for n in ("rec", "rec_all", "rec_pred_all")):
            parts = []
            for n in ("rec", "rec_all", "rec_pred_all"):
                if n in have:
                    d, bd = flat[f"{pair}/smooth_{n}/attn_diag"], flat[f"{pair}/smooth_{n}/baseline_attn_diag"]
                    e, be = flat[f"{pair}/smooth_{n}/attn_entropy"], flat[f"{pair}/smooth_{n}/baseline_attn_entropy"]
                    verdict = "agrees" if d < bd and e > be else "disagrees"
                    parts.append(f"`{n}` diag {d:.4f} vs {bd:.4f}, entropy {e:.3f} vs {be:.3f} ({verdict})")
            measured = "; ".join(parts)
        out.append(f"| {q} | {claim} | {measured} |")
    return "| | the paper says | this run measured |\n|---|---|---|\n" + "\n".join(out) + "\n"


def figure(data: dict[str, Any], path: Path) -> Path:
    """Per-layer diagonal weight and row entropy (baseline vs each system, means over seeds), the
    learned band logits (one row per layer) and the predicted g per layer, where present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = data["systems"]
    first = next(iter(systems.values()))["runs"]
    n_layers = len(first[0]["metrics"]["attn_diag"])
    x = list(range(1, n_layers + 1))
    def flat_band(s: dict) -> bool:  # band logits shared by the heads (per_head ones are not drawn)
        return any(b is not None and not isinstance(b[0], list) for b in s["runs"][0]["metrics"].get("band_logits", []))

    band = next((s for s in systems.values() if flat_band(s)), None)
    gate = {n: s for n, s in systems.items() if any(g is not None for g in s["runs"][0]["metrics"].get("gate_mean", []))}
    n_panels = 2 + (band is not None) + bool(gate)
    fig, axes = plt.subplots(1, n_panels, figsize=(4.2 * n_panels, 3.6))
    for ax, key, label in ((axes[0], "attn_diag", "mean diagonal weight"), (axes[1], "attn_entropy", "row entropy (nats)")):
        ax.plot(x, _per_layer_mean(first, f"baseline_{key}"), "k-o", ms=3, label="baseline")
        for name, s in systems.items():
            ax.plot(x, _per_layer_mean(s["runs"], key), "-o", ms=3, label=name)
        ax.set_xlabel("encoder layer")
        ax.set_title(label)
        ax.set_xticks(x)
    uniform = first[0]["metrics"].get("uniform_entropy")
    if uniform is not None:
        axes[1].axhline(uniform, color="grey", ls=":", lw=1, label="uniform attention")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    i = 2
    if band is not None:
        rows = [[statistics.fmean(r["metrics"]["band_logits"][li][j] for r in band["runs"])
                 for j in range(len(band["runs"][0]["metrics"]["band_logits"][li]))]
                if band["runs"][0]["metrics"]["band_logits"][li] is not None else None
                for li in range(n_layers)]
        k = next(len(r) for r in rows if r is not None)
        grid = [r if r is not None else [float("nan")] * k for r in rows]
        vmax = max((abs(v) for r in rows if r is not None for v in r), default=0.0) or 1e-6
        im = axes[i].imshow(grid, aspect="auto", cmap="coolwarm", origin="lower", vmin=-vmax, vmax=vmax,
                            extent=(-(k // 2) - 0.5, k // 2 + 0.5, 0.5, n_layers + 0.5))
        fig.colorbar(im, ax=axes[i])
        axes[i].set_title("learned band logits b")
        axes[i].set_xlabel("key offset j − i")
        axes[i].set_ylabel("encoder layer")
        axes[i].set_yticks(x)
        i += 1
    if gate:
        for name, s in gate.items():
            means = [statistics.fmean(r["metrics"]["gate_mean"][li] for r in s["runs"])
                     if s["runs"][0]["metrics"]["gate_mean"][li] is not None else float("nan") for li in range(n_layers)]
            stds = [statistics.fmean(r["metrics"]["gate_std"][li] for r in s["runs"])
                    if s["runs"][0]["metrics"]["gate_std"][li] is not None else float("nan") for li in range(n_layers)]
            axes[i].errorbar(x, means, yerr=stds, fmt="-o", ms=3, capsize=2, label=name)
        axes[i].set_title("predicted g (mean ± std)")
        axes[i].set_xlabel("encoder layer")
        axes[i].set_ylim(0, 1)
        axes[i].legend(fontsize=7)
    fig.suptitle(f"{data['pair']}: encoder self-attention, smoothed vs baseline (first 100 tst-COMMON sentences)",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def smoothing_section(root: Path, sp: SmoothingParams, figures: Figures | None = None) -> tuple[str, dict[str, float]]:
    """The report section (Markdown, with figures under plots/variants/smoothing/) and its flat keys;
    ("", {}) when ``smoothing.systems`` is empty."""
    if not sp.systems:
        return "", {}
    parts = ["\n## Attention smoothing with priors (Maekaku et al.)\n",
             "`A' = (1 − γ)·A + γ·P` in the attentions each definition names (`smoothing.defs`, "
             "docs/variants.md), fine-tuned from the same ASR model with the same `train_st` settings as the "
             f"baseline of the same seeds {sp.seeds}. Δ: the mean over seeds of the per-seed difference with its 95 % "
             "t-interval over seeds; the claims below read only it. Test-set bootstrap: sacreBLEU's paired test "
             "(1000 resamples of the test sentences) against the baseline of the same seed, which sees test-set "
             "sampling, not training variance. Diagonal weight and row entropy: encoder self-attention A' in eval mode "
             "on the first 100 tst-COMMON sentences, averaged over the layers the definition smooths (all layers "
             "for decoder-only definitions) and over seeds.\n"]
    flat: dict[str, float] = {}
    for pair in sp.pairs:
        data = collect(root, sp, pair)
        table, f = table_markdown(data)
        flat.update(f)
        fig = figure(data, variant_figure(root, "smoothing", pair))
        parts += [f"\n### {pair}\n", table,
                  f"\nThe paper's published numbers are {SEED_NUMBERS}: gains of the order of the demo's "
                  "seed-to-seed BLEU std, so the robust expectation here is Q6 (lower diagonal weight, higher "
                  "entropy in smoothed layers) with a BLEU interval over seeds that holds 0 or lies above it.\n",
                  claims_markdown(data, f),
                  "\n" + (figures or Figures(root)).link(fig, f"smoothing {pair}")]
    return "\n".join(parts), flat
