"""The `analyze` and `select_windows` stages as library functions (the stage scripts only parse
arguments and params and call :func:`analyze_pair` / :func:`select_windows_pair`).

``analyze`` (paper Sec. 3, Figs. 2-3): contribution matrices of every encoder layer of the ASR
model and of the ST baseline on ``analysis.samples`` randomly drawn (seeded) sentences of
``analysis.split``; per layer the CCD (mean ± std over sentences) and the main-diagonal share
D(1), for ASR and ST. Writes::

    metrics/analysis/<pair>.json                  CCD mean/std and D(1) per layer, per model
    data/analysis/<pair>/ccd.json                 per-sentence CCD and D(1) (ids, N, [sentence][layer])
    data/analysis/<pair>/figure_sample.npz        one sentence: features, C and D(w) of every layer, both models
    data/analysis/<pair>/transparency/<id>.<model>.npz   raw tensors + C (lib.analysis.extract.NPZ_README)
    plots/analysis/<pair>/fig2_diagonality.png    D(w, l) of the figure sentence, CCD shaded (ST)
    plots/analysis/<pair>/fig3_ccd_layers.png     CCD across layers, ASR dashed, ST solid, ± std band

``select_windows`` (paper Sec. 4, Alg. 1, Table 1, Figs. 1 and 4): Algorithm 1 on
``analysis.window_samples`` randomly drawn (seeded) sentences of ``analysis.window_split`` with
the ST baseline, streaming (per sentence and layer only the window and the D(w) curve are kept);
the per-layer windows w = ⌈μ+σ⌉ (odd), the contribution loss at w, full attention for layers
1..k and local attention after. Writes::

    data/windows/<pair>/windows.json              Table 1 + ``encoder_attention`` (per-layer specs for training)
    data/windows/<pair>/table1.md / table1.csv    Table 1 for people (Markdown with the paper's values / CSV)
    data/windows/<pair>/per_sentence.json         ids, N and the per-layer window of every sentence
    data/windows/<pair>/diagonal_profile.json     mean sub/super-diagonal contribution by offset (what t is compared with)
    metrics/windows/<pair>.json                   Table 1, flat per layer (for `dvc metrics show`)
    plots/analysis/<pair>/fig1_spectrogram_contributions.png   fbank over layer ``figure_layer`` with its window
    plots/analysis/<pair>/fig4_contributions.png  the figure sentence's C of every layer (ST), windows drawn

Figures 1 and 4 need the windows, so they belong to ``select_windows``; it recomputes the ST
matrices of the figure sentence (the ``figure_sample``-th of the analysis sentences, chosen by the
same seeded rule as in ``analyze``) instead of reading ``analyze``'s output, so the two stages are
independent. Everything is written through temporary names (lib.io), so a killed run leaves the
previous outputs intact.
"""
from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from tqdm import tqdm

from lib.analysis.contributions import VALUE_BIAS_MODES
from lib.analysis.extract import layer_contributions, layer_tensors, save_transparency_npz
from lib.model.checkpoint import load_model
from lib.analysis.windows import ccd, diagonal_means, diagonality_curve, select_window, window_table
from lib.data.dataset import SpeechDataset
from lib.data.store import read_features
from lib.io import atomic_dir, atomic_write_json, atomic_write_text
from lib import layout
from lib.layout import RunPaths
from lib.paper import WINDOW_TABLES
from lib.params import AnalysisParams

__all__ = [
    "PairPaths",
    "analyze_pair",
    "choose_samples",
    "encoder_attention_specs",
    "figure_sentence",
    "select_windows_pair",
    "table_csv",
    "table_markdown",
]

PROFILE_OFFSETS = 32  # offsets kept in select_windows' diagonal_profile.json


# ----------------------------------------------------------------------------------------------- params


# ----------------------------------------------------------------------------------------------- paths


@dataclass(frozen=True)
class PairPaths:
    """Where one pair's inputs and outputs live (all derived from the repository root)."""

    root: Path
    pair: str
    prepared: Path
    asr_model: Path
    st_model: Path

    @classmethod
    def build(cls, root: Path, pair: str, prepared_dir: str | Path, st_seed: int, *,
              asr_model: Path | None = None, st_model: Path | None = None) -> PairPaths:
        root = Path(root)
        return cls(root=root, pair=pair, prepared=root / prepared_dir / pair,
                   asr_model=Path(asr_model) if asr_model else RunPaths(root, "asr", pair).model,
                   st_model=Path(st_model) if st_model else RunPaths(root, "baseline", pair, st_seed).model)

    @property
    def analysis_dir(self) -> Path:
        return layout.analysis_dir(self.root, self.pair)

    @property
    def analysis_metrics(self) -> Path:
        return layout.analysis_metrics(self.root, self.pair)

    @property
    def windows_dir(self) -> Path:
        return layout.windows_dir(self.root, self.pair)

    @property
    def windows_metrics(self) -> Path:
        return layout.windows_metrics(self.root, self.pair)

    @property
    def plots_dir(self) -> Path:
        return layout.analysis_plots(self.root, self.pair)

    def rel(self, path: Path) -> str:
        """``path`` relative to the root when inside it (stable bytes across checkouts)."""
        p, root = Path(path).resolve(), self.root.resolve()
        return p.relative_to(root).as_posix() if p.is_relative_to(root) else str(path)


# ----------------------------------------------------------------------------------------------- helpers


def choose_samples(n_total: int, k: int, seed: int) -> list[int]:
    """``k`` distinct indices of ``range(n_total)`` drawn with ``numpy.random.default_rng(seed)``,
    sorted; all indices when ``k >= n_total``."""
    if n_total < 1:
        raise ValueError("no sentences to choose from")
    if k >= n_total:
        return list(range(n_total))
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(n_total, size=k, replace=False))


def _dataset(prepared: Path, split: str, producer: str = "prepare") -> SpeechDataset:
    if not (prepared / f"{split}.tsv").is_file():
        raise FileNotFoundError(f"{prepared / f'{split}.tsv'}: prepared manifest not found "
                                f"(produced by the `{producer}` stage: run `dvc repro {producer}` first)")
    return SpeechDataset(prepared, split, "asr")  # the task only picks the target texts; features are shared


def figure_sentence(ds: SpeechDataset, ap: AnalysisParams) -> int:
    """Dataset index of the figure sentence: the ``figure_sample``-th of the analysis sentences
    (clamped to the last one when the split has fewer sentences)."""
    idx = choose_samples(len(ds), ap.samples, ap.seed)
    return idx[min(ap.figure_sample, len(idx) - 1)]


def _figure_layer(ap: AnalysisParams, n_layers: int) -> int:
    """0-based figure layer, clamped to the model's depth (with a note)."""
    if ap.figure_layer > n_layers:
        print(f"note: analysis.figure_layer={ap.figure_layer} > {n_layers} encoder layers; using layer {n_layers}")
        return n_layers - 1
    return ap.figure_layer - 1


def _mean_std(vals: Sequence[float], ddof: int = 0) -> tuple[float, float]:
    a = np.asarray(vals, dtype=np.float64)
    if a.size == 0:
        return float("nan"), float("nan")
    std = float(a.std(ddof=ddof)) if a.size > ddof else float("nan")
    return float(a.mean()), std


def _r(v: float, nd: int = 6) -> float | None:
    return None if v is None or not math.isfinite(v) else round(float(v), nd)


def _progress(it, *, total: int, desc: str, enabled: bool):
    return tqdm(it, total=total, desc=desc, unit="sent", disable=not enabled, mininterval=1.0, dynamic_ncols=True)


def encoder_attention_specs(table: Sequence[dict]) -> list[dict]:
    """Per-layer attention specs for ``ModelConfig.encoder_attention``: ``{"type": "full"}`` for
    the full layers, ``{"type": "local", "window": w}`` for the others."""
    return [{"type": "full"} if row["attention"] == "full" else {"type": "local", "window": int(row["window"])}
            for row in table]


# ----------------------------------------------------------------------------------------------- analyze


def analyze_pair(paths: PairPaths, ap: AnalysisParams, *, progress: bool = True) -> dict:
    """Run the analysis of one pair (see the module docstring); returns the metrics dict."""
    from lib.analysis import plots  # matplotlib only when plotting

    ds = _dataset(paths.prepared, ap.split)
    idx = choose_samples(len(ds), ap.samples, ap.seed)
    if len(idx) < ap.samples:
        print(f"note: {ap.split} has {len(ds)} sentences < analysis.samples={ap.samples}; using all of them")
    fig_i = figure_sentence(ds, ap)
    ids = [ds.rows[i]["id"] for i in idx]
    transparency = set(idx[: ap.transparency_samples])
    models = {"asr": (paths.asr_model, "train_asr"), "st": (paths.st_model, "train_baseline")}
    for model_path, producer in models.values():  # fail before any work when a model is missing
        if not Path(model_path).is_file():
            raise FileNotFoundError(f"{model_path}: model checkpoint not found (produced by the `{producer}` "
                                    f"stage: run `dvc repro {producer}` first)")

    per_model: dict[str, dict[str, Any]] = {}
    figure: dict[str, np.ndarray] = {}
    n_tokens: list[int] = []
    t0 = time.perf_counter()
    with atomic_dir(paths.analysis_dir) as out:
        (out / "transparency").mkdir()
        for role, (model_path, producer) in models.items():
            model, meta = load_model(model_path, producer=producer)
            n_layers = len(model.encoder.layers)
            ccds: list[list[float]] = []
            diag: list[list[float]] = []
            lengths = []
            for i in _progress(idx, total=len(idx), desc=f"analyze {paths.pair} {role}", enabled=progress):
                ut = layer_tensors(model, ds.features(i))
                mats = [layer_contributions(t, value_bias=ap.value_bias, residual=ap.residual) for t in ut.layers]
                curves = [diagonality_curve(c) for c in mats]
                ccds.append([ccd(c, method=ap.ccd_method) for c in mats])
                diag.append([float(cur[0]) for cur in curves])
                lengths.append(ut.n_tokens)
                rid = ds.rows[i]["id"]
                if i in transparency:
                    save_transparency_npz(out / "transparency" / f"{rid}.{role}.npz", ut, mats, {
                        "id": rid, "model": role, "model_path": paths.rel(model_path), "split": ap.split,
                        "value_bias": ap.value_bias, "residual": ap.residual, "normalize": True,
                        "n_heads": int(ut.layers[0].attn.shape[0]), "layers": n_layers,
                    })
                if i == fig_i:
                    figure[f"C_{role}"] = torch.stack(mats).to(torch.float32).numpy()
                    figure[f"curves_{role}"] = torch.stack(curves).numpy()
                    figure["feats"] = ut.feats.numpy()
                    figure["fbank"] = np.array(read_features(paths.prepared, ds.rows[i]["audio"]), dtype=np.float32)
                    figure["id"] = np.array(rid)
                del ut, mats, curves
            n_tokens = lengths
            per_model[role] = {"ccd": ccds, "diag": diag, "model_path": paths.rel(model_path),
                               "task": meta.get("task"), "layers": n_layers}
            del model

        atomic_write_json(out / "ccd.json", {
            "split": ap.split, "ids": ids, "n_tokens": n_tokens, "ccd_method": ap.ccd_method,
            **{role: {"model": v["model_path"], "ccd": [[_r(x) for x in row] for row in v["ccd"]],
                      "diag_share": [[_r(x) for x in row] for row in v["diag"]]} for role, v in per_model.items()},
        })
        buf = io.BytesIO()
        np.savez(buf, **figure)
        (out / "figure_sample.npz").write_bytes(buf.getvalue())
        (out / "README.md").write_text(_ANALYSIS_README.format(pair=paths.pair), encoding="utf-8")
    seconds = time.perf_counter() - t0

    metrics: dict[str, Any] = {"split": ap.split, "samples": len(idx), "st_seed": ap.st_seed,
                               "value_bias": ap.value_bias, "ccd_method": ap.ccd_method,
                               "tokens_mean": _r(float(np.mean(n_tokens)), 2), "tokens_max": int(max(n_tokens))}
    for role, v in per_model.items():
        ccd_arr = np.asarray(v["ccd"])  # (S, L)
        diag_arr = np.asarray(v["diag"])
        layers = {}
        for li in range(ccd_arr.shape[1]):
            m, s = _mean_std(ccd_arr[:, li], ap.ddof)
            layers[f"l{li + 1:02d}"] = {"ccd_mean": _r(m), "ccd_std": _r(s), "diag_share": _r(float(diag_arr[:, li].mean()))}
        metrics[role] = {"model": v["model_path"], "ccd_mean": _r(float(ccd_arr.mean())),
                         "diag_share": _r(float(diag_arr.mean())), "layers": layers}
    atomic_write_json(paths.analysis_metrics, metrics)

    # Figures (regenerated every run).
    fl = _figure_layer(ap, per_model["st"]["layers"])
    pos = idx.index(fig_i)
    plots.plot_diagonality(figure["curves_st"][fl], per_model["st"]["ccd"][pos][fl], paths.plots_dir / "fig2_diagonality.png",
                           title=f"{paths.pair} ST, layer {fl + 1}, sentence {figure['id']} (N={figure['C_st'].shape[1]})")
    stats = {role: np.asarray(v["ccd"]) for role, v in per_model.items()}
    plots.plot_ccd_layers(
        {role: (a.mean(0), a.std(0, ddof=ap.ddof) if a.shape[0] > ap.ddof else np.zeros(a.shape[1])) for role, a in stats.items()},
        paths.plots_dir / "fig3_ccd_layers.png",
        title=f"{paths.pair}: CCD per layer, mean ± std over {len(idx)} {ap.split} sentences")
    print(f"analyze {paths.pair}: {len(idx)} sentences x {len(models)} models in {seconds:.1f} s")
    return metrics


_ANALYSIS_README = """\
# Contribution analysis of {pair} (stage `analyze`)

- `ccd.json`: per sentence (`ids`, `n_tokens` = encoder length N) and per layer the CCD and the
  main-diagonal share D(1), for the ASR model (`asr`) and the ST baseline (`st`).
- `figure_sample.npz`: the figure sentence: `feats` (CMVN'd input), `fbank` (raw log-mel),
  `C_asr`/`C_st` (L, N, N) contribution matrices, `curves_asr`/`curves_st` (L, 2N) D(w), w = 1..2N.
- `transparency/<id>.<model>.npz`: every tensor of Eq. 3-5 (layer inputs, LN(x), per-head
  attention, W_V, b_V, W_O, b_O, LN parameters) and the resulting C, to recompute C
  independently; the array `README` inside each file gives the formula.
"""


# ----------------------------------------------------------------------------------------------- select_windows


def _window_settings(ap: AnalysisParams) -> dict[str, Any]:
    return {"threshold": ap.threshold, "full_layers": ap.full_layers, "width_rule": ap.width_rule,
            "include_main_diagonal": ap.include_main_diagonal, "patience_fraction": ap.patience_fraction,
            "patience_rounding": ap.patience_rounding, "min_patience": ap.min_patience, "ddof": ap.ddof,
            "value_bias": ap.value_bias, "residual": ap.residual, "split": ap.window_split, "seed": ap.seed}


def select_windows_pair(paths: PairPaths, ap: AnalysisParams, *, progress: bool = True) -> dict:
    """Algorithm 1 over ``window_samples`` sentences with the ST baseline; returns windows.json's dict."""
    from lib.analysis import plots

    ds = _dataset(paths.prepared, ap.window_split)
    idx = choose_samples(len(ds), ap.window_samples, ap.seed)
    if len(idx) < ap.window_samples:
        print(f"note: {ap.window_split} has {len(ds)} sentences < analysis.window_samples={ap.window_samples}; using all")
    model, _ = load_model(paths.st_model, producer="train_baseline")
    n_layers = len(model.encoder.layers)
    sel = ap.select_kwargs()

    # Streaming: per sentence and layer only Algorithm 1's window and the D(w) curve (2N floats) stay.
    windows: list[list[int]] = [[] for _ in range(n_layers)]
    curves: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
    n_tokens: list[int] = []
    # Diagnostic: mean over sentences of max(mean C_diag[i], mean C_diag[-i]) (what Alg. 1 compares with t).
    prof_sum = np.zeros((n_layers, PROFILE_OFFSETS))
    prof_cnt = np.zeros((n_layers, PROFILE_OFFSETS))
    t0 = time.perf_counter()
    for i in _progress(idx, total=len(idx), desc=f"select_windows {paths.pair}", enabled=progress):
        ut = layer_tensors(model, ds.features(i))
        n_tokens.append(ut.n_tokens)
        tensors, ut.layers = ut.layers, []
        for li in range(n_layers):
            c = layer_contributions(tensors[li], value_bias=ap.value_bias, residual=ap.residual)
            tensors[li] = None  # free this layer's tensors
            windows[li].append(select_window(c, ap.threshold, **sel))
            curves[li].append(diagonality_curve(c))
            up, lo = diagonal_means(c)
            k = min(PROFILE_OFFSETS, c.shape[0])
            prof_sum[li, :k] += torch.maximum(up, lo)[:k].numpy()
            prof_cnt[li, :k] += 1
            del c
    seconds = time.perf_counter() - t0

    table = window_table(windows, curves, full_layers=ap.full_layers, ddof=ap.ddof)
    specs = encoder_attention_specs(table)
    ids = [ds.rows[i]["id"] for i in idx]
    result = {
        "pair": paths.pair,
        "model": paths.rel(paths.st_model),
        "n_sentences": len(idx),
        "tokens_mean": _r(float(np.mean(n_tokens)), 2),
        "tokens_max": int(max(n_tokens)),
        "settings": _window_settings(ap),
        "encoder_layers": n_layers,
        "table": [{k: (_r(v) if isinstance(v, float) else v) for k, v in row.items()} for row in table],
        "encoder_attention": specs,
    }
    with atomic_dir(paths.windows_dir) as out:
        atomic_write_json(out / "windows.json", result)
        atomic_write_json(out / "per_sentence.json", {
            "split": ap.window_split, "ids": ids, "n_tokens": n_tokens,
            "windows": [[windows[li][s] for li in range(n_layers)] for s in range(len(idx))],
        })
        atomic_write_text(out / "table1.md", table_markdown(table, paths.pair, result))
        atomic_write_text(out / "table1.csv", table_csv(table))
        prof = np.divide(prof_sum, prof_cnt, out=np.full_like(prof_sum, np.nan), where=prof_cnt > 0)
        atomic_write_json(out / "diagonal_profile.json", {
            "description": "per layer, offsets i = 0..K-1: mean over sentences (with N > i) of "
                           "max(mean(C_diag[i]), mean(C_diag[-i])), the quantity Algorithm 1 compares with t",
            "threshold": ap.threshold, "offsets": PROFILE_OFFSETS,
            "layers": {f"l{li + 1:02d}": [_r(float(v)) for v in prof[li]] for li in range(n_layers)},
        })
    flat = {"n_sentences": len(idx), "full_layers": ap.full_layers,
            "layers": {f"l{row['layer']:02d}": {k: result["table"][row["layer"] - 1][k]
                                               for k in ("mu", "sigma", "window", "cl_mean", "cl_std", "attention")}
                       for row in table}}
    atomic_write_json(paths.windows_metrics, flat)

    # Figures 1 and 4: the analysis' figure sentence, ST model, with the chosen windows.
    ads = ds if ap.split == ap.window_split else _dataset(paths.prepared, ap.split)
    fi = figure_sentence(ads, ap)
    ut = layer_tensors(model, ads.features(fi))
    mats = [layer_contributions(t, value_bias=ap.value_bias, residual=ap.residual).to(torch.float32).numpy()
            for t in ut.layers]
    wins = [None if s["type"] == "full" else s["window"] for s in specs]
    rid = ads.rows[fi]["id"]
    plots.plot_contribution_grid(mats, wins, paths.plots_dir / "fig4_contributions.png",
                                 title=f"{paths.pair} ST, sentence {rid} (N={mats[0].shape[0]}): contributions, "
                                       f"main diagonal hidden, local windows in red")
    fl = _figure_layer(ap, n_layers)
    fbank = np.array(read_features(paths.prepared, ads.rows[fi]["audio"]), dtype=np.float32)
    plots.plot_spectrogram_contributions(fbank, mats[fl], table[fl]["window"], paths.plots_dir / "fig1_spectrogram_contributions.png",
                                         title=f"{paths.pair} ST, layer {fl + 1} (w={table[fl]['window']}), sentence {rid}")
    print(f"select_windows {paths.pair}: {len(idx)} sentences x {n_layers} layers in {seconds:.1f} s")
    return result


def table_markdown(table: Sequence[dict], pair: str, result: dict | None = None) -> str:
    """Table 1 as Markdown (with the paper's row for comparison when the pair is in the paper)."""
    paper = {r[0]: r for r in WINDOW_TABLES.get(pair, [])}
    head = "| layer | μ ± σ | w | CL | attention |"
    sep = "|---:|---:|---:|---:|:---|"
    if paper:
        head += " paper μ ± σ | paper w | paper CL |"
        sep += "---:|---:|---:|"
    lines = []
    if result is not None:
        s = result["settings"]
        lines += [f"{pair}: Algorithm 1 on {result['n_sentences']} `{s['split']}` sentences (mean N = {result['tokens_mean']}, "
                  f"max {result['tokens_max']}) with `{result['model']}`; t = {s['threshold']}, width rule "
                  f"`{s['width_rule']}`, w = ⌈μ+σ⌉ made odd, layers 1-{s['full_layers']} keep full attention (*).", ""]
    lines += [head, sep]
    for row in table:
        star = " *" if row["attention"] == "full" else ""
        line = (f"| {row['layer']}{star} | {row['mu']:.2f} ± {row['sigma']:.2f} | {row['window']} | "
                f"{row['cl_mean']:.2f} ± {row['cl_std']:.2f} | {row['attention']} |")
        if paper:
            p = paper.get(row["layer"])
            line += (f" {p[1]:.2f} ± {p[2]:.2f} | {p[3]} | {p[4]:.2f} ± {p[5]:.2f} |" if p else " | | |")
        lines.append(line)
    return "\n".join(lines) + "\n"


def table_csv(table: Sequence[dict]) -> str:
    """Table 1 as CSV: layer, mu, sigma, window, cl_mean, cl_std, attention, n_sentences."""
    cols = ["layer", "mu", "sigma", "window", "cl_mean", "cl_std", "attention", "n_sentences"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for row in table:
        w.writerow([f"{row[c]:.6f}" if isinstance(row[c], float) else row[c] for c in cols])
    return buf.getvalue()
