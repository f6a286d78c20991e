"""Attention health of a trained encoder: does its self-attention learn anything, and is it local?

The cheap check of the demo diagnosis (docs/locality-study.md), run on a
trained model before paying for ST or local-attention runs. Per model, on ``samples`` sentences:

1. **Input health** (:func:`input_health`): ``position_share`` = rms(sinusoidal positions) /
   rms(content), where content = embed_scale * [LN](subsampler output), over valid tokens of the
   first layer's input. Position is drowned when this is small (the √d-scaled demo model: 0.06).
2. **Attention output scale**: ``attn_ratio[l]`` = ‖MHA(LN(x))‖ / ‖x‖ (Frobenius over the valid
   tokens of all sentences) at layer l: how much the attention block adds to the residual stream.
3. **Raw locality** (:func:`band_mass`): the attention mass of each head within ±k tokens of the
   query, Σ_i Σ_{|j−i|≤k} A_ij, divided by what uniform attention over the N valid keys would put
   there, Σ_i |{j : |j−i| ≤ k}| / N (so uniform attention gives exactly 1, a head that attends
   only within ±k gives N-ish). Summed over sentences before dividing (a ratio of totals).
4. **Contributions** (Eq. 3-5, :mod:`lib.analysis.contributions`): the main-diagonal share C_ii
   per layer, and the mean contribution at offsets 1..8 off the diagonal (both sides averaged),
   the profile Algorithm 1 compares with t; ``falloff[l]`` = mean(offsets 1-2) / mean(offsets 6-8)
   (> 1: a band, ≈ 1: a flat floor).
5. **Inference band test** (:func:`band_test`): teacher-forced NLL per target token and token
   accuracy on ``band_split`` with layers ``full_layers+1..L`` switched to local attention of
   width w (no retraining; same weights, :class:`lib.model.attention.LocalAttention`) for w in
   ``band_windows`` and for Algorithm 1's windows, next to full attention. A model that needs only
   local context loses little at small w; one whose useful context is long-range loses a lot.
   With w ≥ 2N − 1 every key is in the window, so the result equals full attention exactly.

All sentences are drawn with the same seeded rule as the analysis stages
(:func:`lib.analysis.pipeline.choose_samples`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from lib.io import InputError, read_json
from lib.analysis.extract import layer_contributions, layer_tensors
from lib.stats import spearman
from lib.params import AnalysisParams, HealthParams
from lib.analysis.windows import diagonal_means, select_window, window_from_lengths
from lib.model import checkpoint as model_file
from lib.model.s2t_transformer import S2TTransformer
from lib.model.spec import local_attention_spec

__all__ = [
    "BAND_TEST_WINDOWS",
    "HealthAccumulator",
    "band_mass",
    "band_test",
    "band_test_configs",
    "band_test_stage",
    "band_test_table",
    "input_health",
    "uniform_band_expectation",
    "with_local_layers",
]

BANDS = (1, 2, 4)
BAND_TEST_WINDOWS = (1, 3, 5, 9, 21)
PROFILE_OFFSETS = 8


def uniform_band_expectation(n: int, k: int) -> float:
    """Σ_i |{j : |i − j| ≤ k, 0 ≤ j < n}| / n: the mass uniform attention puts within ±k, summed
    over the n queries (closed form of the band's entry count divided by n)."""
    if n < 1 or k < 0:
        raise ValueError(f"need n >= 1 and k >= 0, got n={n}, k={k}")
    h = min(k, n - 1)
    return (n * (2 * h + 1) - h * (h + 1)) / n


def band_mass(attn: Tensor, k: int) -> Tensor:
    """(H, N, N) attention of one sentence -> (H,) mass within ±k of the diagonal, summed over queries."""
    if attn.dim() != 3 or attn.shape[1] != attn.shape[2]:
        raise ValueError(f"attn must be (H, N, N), got {tuple(attn.shape)}")
    n = attn.shape[-1]
    idx = torch.arange(n, device=attn.device)
    band = (idx[None, :] - idx[:, None]).abs() <= k  # (N, N)
    return (attn.to(torch.float64) * band).sum(dim=(1, 2))


@torch.no_grad()
def input_health(model: S2TTransformer, feats: Tensor) -> tuple[float, float]:
    """Sums of squares over the valid tokens of one utterance (feats (T, n_mels)) of the first
    layer's two inputs: (Σ content², Σ positions²)."""
    was = model.training
    model.eval()
    try:
        lengths = torch.tensor([feats.shape[0]])
        content, pos, pad, _ = model.encoder.embed(feats[None].to(torch.float32), lengths)
    finally:
        model.train(was)
    keep = ~pad[0]
    return float(content[0][keep].double().pow(2).sum()), float(pos[0][keep].double().pow(2).sum())


@dataclass
class HealthAccumulator:
    """Sums over sentences of everything in points 1-4 of the module docstring; :meth:`result`
    turns them into the per-layer / per-head figures."""

    n_layers: int
    n_heads: int
    bands: Sequence[int] = BANDS
    content_sq: float = 0.0
    pos_sq: float = 0.0
    sentences: int = 0
    tokens: int = 0
    x_sq: np.ndarray = field(init=False)
    attn_sq: np.ndarray = field(init=False)
    mass: dict[int, np.ndarray] = field(init=False)  # band -> (L, H) summed mass
    uniform: dict[int, float] = field(init=False)  # band -> summed uniform expectation
    c_ii: np.ndarray = field(init=False)  # (L,) summed over tokens
    prof_sum: np.ndarray = field(init=False)  # (L, K) per offset: summed mean contribution
    prof_cnt: np.ndarray = field(init=False)
    # Algorithm 1 (lib.analysis.windows.select_window) per sentence and layer, when select_kwargs is set.
    select_kwargs: dict[str, Any] | None = None
    threshold: float = 0.01
    ddof: int = 0
    windows: list[list[int]] = field(init=False)

    def __post_init__(self) -> None:
        L, H = self.n_layers, self.n_heads
        self.x_sq, self.attn_sq, self.c_ii = np.zeros(L), np.zeros(L), np.zeros(L)
        self.mass = {k: np.zeros((L, H)) for k in self.bands}
        self.uniform = {k: 0.0 for k in self.bands}
        self.prof_sum = np.zeros((L, PROFILE_OFFSETS))
        self.prof_cnt = np.zeros((L, PROFILE_OFFSETS))
        self.windows = [[] for _ in range(L)]

    def add(self, model: S2TTransformer, feats: Tensor, *, value_bias: str = "bias", residual: bool = True) -> None:
        """One sentence (feats (T, n_mels), CMVN'd as in training)."""
        c_sq, p_sq = input_health(model, feats)
        self.content_sq += c_sq
        self.pos_sq += p_sq
        ut = layer_tensors(model, feats)
        n = ut.n_tokens
        self.sentences += 1
        self.tokens += n
        for k in self.bands:
            self.uniform[k] += uniform_band_expectation(n, k)
        for li, t in enumerate(ut.layers):
            self.x_sq[li] += float(t.x.double().pow(2).sum())
            self.attn_sq[li] += float(t.attn_out.double().pow(2).sum())
            for k in self.bands:
                self.mass[k][li] += band_mass(t.attn, k).numpy()
            c = layer_contributions(t, value_bias=value_bias, residual=residual)
            if self.select_kwargs is not None:
                self.windows[li].append(select_window(c, self.threshold, **self.select_kwargs))
            self.c_ii[li] += float(torch.diagonal(c).sum())
            upper, lower = diagonal_means(c)
            kmax = min(PROFILE_OFFSETS, n - 1)
            if kmax > 0:
                self.prof_sum[li, :kmax] += ((upper[1:kmax + 1] + lower[1:kmax + 1]) / 2).numpy()
                self.prof_cnt[li, :kmax] += 1

    def algorithm1_windows(self, full_layers: int) -> list[int] | None:
        """Algorithm 1's windows w = ⌈μ + σ⌉ (odd) of layers full_layers+1..L, or None if not collected."""
        if not all(self.windows):
            return None
        return [window_from_lengths(ws, ddof=self.ddof)["window"] for ws in self.windows[full_layers:]]

    def result(self, *, head_threshold: float = 2.0) -> dict[str, Any]:
        """Per-layer figures (flat enough for ``dvc metrics``): see the module docstring."""
        if self.sentences == 0:
            raise ValueError("no sentences added")
        layers: dict[str, dict[str, Any]] = {}
        heads: dict[str, list[float]] = {}
        prof = np.divide(self.prof_sum, self.prof_cnt, out=np.full_like(self.prof_sum, np.nan),
                         where=self.prof_cnt > 0)
        for li in range(self.n_layers):
            row: dict[str, Any] = {
                "attn_ratio": _r(math.sqrt(self.attn_sq[li] / self.x_sq[li])) if self.x_sq[li] > 0 else None,
                "c_ii": _r(self.c_ii[li] / self.tokens),
            }
            for k in self.bands:
                ratio = self.mass[k][li] / self.uniform[k]  # (H,)
                row[f"band{k}"] = _r(float(ratio.mean()))
                if k == 2:
                    heads[f"l{li + 1:02d}"] = [_r(float(v)) for v in ratio]
                    row[f"heads_band2_ge{head_threshold:g}x"] = int((ratio >= head_threshold).sum())
            row["profile"] = [_r(float(v)) for v in prof[li]]
            near, far = float(np.nanmean(prof[li, 0:2])), float(np.nanmean(prof[li, 5:8]))
            row["falloff"] = _r(near / far) if np.isfinite(far) and far > 0 else None
            if self.windows[li]:
                stats = window_from_lengths(self.windows[li], ddof=self.ddof)
                row.update(alg1_mu=_r(stats["mu"]), alg1_sigma=_r(stats["sigma"]), alg1_window=stats["window"])
            layers[f"l{li + 1:02d}"] = row
        return {
            "sentences": self.sentences,
            "tokens_mean": _r(self.tokens / self.sentences, 2),
            "position_share": _r(math.sqrt(self.pos_sq / self.content_sq)) if self.content_sq > 0 else None,
            "layers": layers,
            "heads_band2": heads,
        }


def with_local_layers(model: S2TTransformer, windows: Sequence[int], full_layers: int) -> S2TTransformer:
    """A copy of ``model`` (same weights, eval mode) whose encoder layers full_layers+1..L use
    local attention with ``windows`` (one odd window per local layer); for a model with the
    relative-position-bias control, the equivalent dense ``banded`` attention."""
    spec = local_attention_spec(model.cfg.encoder_layers, full_layers, list(windows), key="band test windows")
    if model.cfg.rel_pos_bias:  # the blocked local kernel has no relative-position bias: dense band mask
        spec = [{"type": "banded", "window": s["window"]} if s["type"] == "local" else s for s in spec]
    return model_file.rebuilt_with(model, encoder_attention=spec)


@torch.no_grad()
def teacher_forced(model: S2TTransformer, batches: Sequence[Any], pad_idx: int) -> dict[str, float]:
    """Teacher-forced NLL per target token (nats) and token accuracy (%) over ``batches``."""
    nll = correct = tokens = 0.0
    for b in batches:
        logits = model(b.feats, b.feat_lengths, b.prev_tokens).float()
        lprobs = torch.log_softmax(logits, dim=-1)
        mask = b.target.ne(pad_idx)
        nll += float(-lprobs.gather(-1, b.target[..., None])[..., 0][mask].double().sum())
        correct += float((lprobs.argmax(-1).eq(b.target) & mask).sum())
        tokens += float(mask.sum())
    return {"nll": _r(nll / tokens), "acc": _r(100.0 * correct / tokens, 3)}


def band_test(model: S2TTransformer, batches: Sequence[Any], *, full_layers: int,
              windows: Sequence[int] = BAND_TEST_WINDOWS, algorithm1: Sequence[int] | None = None,
              pad_idx: int = 1, extra: Mapping[str, Sequence[int]] | None = None) -> dict[str, dict[str, float]]:
    """Point 5 of the module docstring: ``{"full": {...}, "w1": {...}, ..., "alg1": {...}}``, then one
    entry per name of ``extra`` (name -> one window per local layer, e.g. the controls of
    :func:`band_test_table`). A configuration whose windows were already evaluated is not run again."""
    n_local = model.cfg.encoder_layers - full_layers
    done: dict[tuple[int, ...], dict[str, float]] = {}

    def local(ws: Sequence[int]) -> dict[str, float]:
        key = tuple(int(w) for w in ws)
        if key not in done:
            done[key] = teacher_forced(with_local_layers(model, list(key), full_layers), batches, pad_idx)
        return dict(done[key])

    out = {"full": teacher_forced(model.eval(), batches, pad_idx)}
    for w in windows:
        out[f"w{w}"] = local([w] * n_local)
    if algorithm1 is not None:
        out["alg1"] = local(algorithm1)
    for name, ws in (extra or {}).items():
        if name in out:
            raise ValueError(f"band test: configuration {name!r} given twice")
        out[name] = local(ws)
    return out


def band_test_configs(algorithm1: Sequence[int], *, windows: Sequence[int] = BAND_TEST_WINDOWS,
                      shuffle_seed: int = 1) -> dict[str, list[int] | None]:
    """The configurations of the band-test table (stage band_test), name -> one window per local layer
    (None: full attention): ``full``, ``w<w>`` for w = 1 and every w of ``windows`` (ascending),
    ``alg1`` (Algorithm 1's windows), ``uniform`` (one window, their mean rounded to the nearest odd
    width, ties up) and ``shuffled`` (them permuted with ``shuffle_seed``): the controls of
    lib.model.spec, the windows the systems of stage train_control train with."""
    from lib.model.spec import control_windows

    alg1 = [int(w) for w in algorithm1]
    n = len(alg1)
    out: dict[str, list[int] | None] = {"full": None}
    for w in sorted({1, *(int(w) for w in windows)}):
        out[f"w{w}"] = [w] * n
    out["alg1"] = alg1
    out["uniform"] = control_windows("local_uniform", alg1, shuffle_seed=shuffle_seed, key="Algorithm 1's windows")
    out["shuffled"] = control_windows("local_shuffled", alg1, shuffle_seed=shuffle_seed, key="Algorithm 1's windows")
    return out


def band_test_table(model: S2TTransformer, batches: Sequence[Any], *, full_layers: int, algorithm1: Sequence[int],
                    windows: Sequence[int] = BAND_TEST_WINDOWS, shuffle_seed: int = 1,
                    pad_idx: int = 1) -> dict[str, dict[str, Any]]:
    """The band test of every configuration of :func:`band_test_configs` (no retraining): per name the
    windows of layers full_layers+1..L, their mean width, teacher-forced NLL and token accuracy, and
    ``gap_recovered`` = (acc − acc(w = 1)) / (acc(full) − acc(w = 1)), the share of the w = 1 -> full
    accuracy gap the configuration recovers (None when full attention is not better than w = 1)."""
    configs = band_test_configs(algorithm1, windows=windows, shuffle_seed=shuffle_seed)
    n_local = model.cfg.encoder_layers - full_layers
    if len(configs["alg1"]) != n_local:
        raise ValueError(f"band test: {len(configs['alg1'])} Algorithm 1 windows for {n_local} local layers "
                         f"(layers {full_layers + 1}..{model.cfg.encoder_layers})")
    res = band_test(model, batches, full_layers=full_layers, windows=[], pad_idx=pad_idx,
                    extra={k: v for k, v in configs.items() if v is not None})
    gap = res["full"]["acc"] - res["w1"]["acc"]
    rows: dict[str, dict[str, Any]] = {}
    for name, ws in configs.items():
        rows[name] = {"windows": ws, "mean_window": None if ws is None else _r(sum(ws) / len(ws), 4),
                      **res[name],
                      "gap_recovered": _r((res[name]["acc"] - res["w1"]["acc"]) / gap) if gap > 0 else None}
    return rows


def model_health(model: S2TTransformer, window_ds: Any, indices: Sequence[int], band_ds: Any, *, ap: AnalysisParams,
                 hp: HealthParams, windows: Sequence[int] | None = None, max_frames: int = 20000,
                 progress: bool = False) -> dict[str, Any]:
    """Points 1-5 of the module docstring for one model: ``indices`` of ``window_ds`` and every
    sentence of ``band_ds`` for the band test. Algorithm 1's windows for the band test are
    ``windows`` when given (select_windows' for the ST model), else computed here on ``indices``
    with the ``analysis`` settings. """
    from tqdm import tqdm

    from lib.data.dataset import PAD_ID, batch_by_frames, collate

    model.eval()
    acc = HealthAccumulator(len(model.encoder.layers), model.cfg.n_heads,
                            select_kwargs=ap.select_kwargs() if windows is None else None,
                            threshold=ap.threshold, ddof=ap.ddof)
    for i in tqdm(indices, desc="health", unit="sent", disable=not progress, mininterval=1.0):
        acc.add(model, window_ds.features(i), value_bias=ap.value_bias, residual=ap.residual)
    result = acc.result(head_threshold=hp.head_threshold)
    alg1 = acc.algorithm1_windows(ap.full_layers) if windows is None else list(windows)
    batches = [collate(band_ds, b) for b in batch_by_frames(band_ds.n_frames, max_frames, shuffle=False)]
    result["band_test"] = band_test(model, batches, full_layers=ap.full_layers, windows=hp.band_windows,
                                    algorithm1=alg1, pad_idx=PAD_ID)
    result["algorithm1_windows"] = alg1
    result["summary"] = summarize(result, ap.full_layers, hp.head_threshold)
    return result


def summarize(result: dict[str, Any], full_layers: int, head_threshold: float = 2.0) -> dict[str, Any]:
    """The few numbers to compare runs by (layers full_layers+1..L = the local layers):
    mean C_ii, mean ±2 raw mass / uniform, local heads, layers with Algorithm 1 window >= 3 and
    Spearman's ρ of those windows against depth, the share of the w = 1 -> full token-accuracy gap
    that Algorithm 1's windows recover."""
    rows = [v for k, v in sorted(result["layers"].items()) if int(k[1:]) > full_layers]
    key = f"heads_band2_ge{head_threshold:g}x"
    bt = result.get("band_test", {})
    out: dict[str, Any] = {
        "position_share": result["position_share"],
        "c_ii_mean": _r(float(np.mean([r["c_ii"] for r in rows]))),
        "band2_mean": _r(float(np.mean([r["band2"] for r in rows]))),
        "local_heads": int(sum(r[key] for r in rows)),
        "heads": int(len(rows) * len(next(iter(result["heads_band2"].values())))),
        "attn_ratio_mean": _r(float(np.mean([r["attn_ratio"] for r in rows]))),
        "falloff_mean": _r(float(np.mean([r["falloff"] for r in rows if r["falloff"] is not None] or [float("nan")]))),
    }
    if result.get("algorithm1_windows"):
        windows = result["algorithm1_windows"]
        out["alg1_windows_ge3"] = int(sum(w >= 3 for w in windows))
        if len(windows) > 1:  # do the windows grow with depth (paper en-de, layers 4-12: +0.96)
            out["alg1_windows_rho"] = _r(spearman(range(len(windows)), windows))
    if "full" in bt and "w1" in bt:
        gap = bt["full"]["acc"] - bt["w1"]["acc"]
        out["acc_full"] = bt["full"]["acc"]
        out["acc_w1"] = bt["w1"]["acc"]
        if "alg1" in bt:
            out["acc_alg1"] = bt["alg1"]["acc"]
            out["alg1_gap_recovered"] = _r((bt["alg1"]["acc"] - bt["w1"]["acc"]) / gap) if gap > 0 else None
    return out


def _r(v: float | None, nd: int = 6) -> float | None:
    return None if v is None or not math.isfinite(v) else round(float(v), nd)


def flat_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The scalar part of a :func:`model_health` result for ``metrics/`` (``dvc metrics diff``):
    the summary, the band test and per layer the scalars (no lists)."""
    layers = {k: {kk: vv for kk, vv in v.items() if not isinstance(vv, list)} for k, v in result["layers"].items()}
    out = {"summary": result["summary"], "band_test": result["band_test"], "layers": layers,
           "sentences": result["sentences"], "tokens_mean": result["tokens_mean"]}
    if result.get("algorithm1_windows"):
        out["algorithm1_windows"] = " ".join(str(w) for w in result["algorithm1_windows"])
    return out


def health_stage(model_path: Any, prepared: Any, role: str, pair: str, *, ap: AnalysisParams, hp: HealthParams,
                 details_path: Any, metrics_path: Any, plot_path: Any, producer: str,
                 windows_path: Any = None, progress: bool = False) -> dict[str, Any]:
    """What the health_asr / health_st stages do for one pair and model: :func:`model_health` on
    ``health.samples`` sentences of ``analysis.window_split`` (seeded with ``analysis.seed``) and every
    sentence of ``health.band_split``; Algorithm 1's windows from ``windows_path`` (select_windows'
    windows.json, for the ST model) or computed on the health sentences (the ASR model). Writes the
    full result (``details_path``), the flat metrics and the figure. Returns the full result."""
    from pathlib import Path

    from lib.model.checkpoint import load_model
    from lib.analysis.pipeline import choose_samples
    from lib.data.dataset import SpeechDataset
    from lib.io import atomic_write_json
    from lib.analysis.health_plots import plot_health

    prepared = Path(prepared)
    for split in (ap.window_split, hp.band_split):
        if not (prepared / f"{split}.tsv").is_file():
            raise FileNotFoundError(f"{prepared / f'{split}.tsv'}: prepared manifest not found "
                                    f"(run `dvc repro prepare` first)")
    windows = None
    if windows_path is not None:
        table = read_json(windows_path, "select_windows", keys=("table",))["table"]
        try:
            if not isinstance(table, list):
                raise TypeError(type(table).__name__)
            windows = [int(row["window"]) for row in table[ap.full_layers:]]
        except (TypeError, KeyError, ValueError):
            raise InputError(f"{windows_path}: 'table' is not a list of per-layer rows with a 'window' each "
                             f"(written by the select_windows stage); rerun select_windows") from None
    model, meta = load_model(model_path, producer=producer)
    task = meta.get("task", "asr")
    window_ds = SpeechDataset(prepared, ap.window_split, "asr")
    # The model's own vocabulary: a shared English ASR model (asr.mode: shared) uses its training pair's.
    trained_on = meta.get("pair") or pair
    band_ds = SpeechDataset(prepared, hp.band_split, task, vocab_dir=prepared.parent / trained_on)
    idx = choose_samples(len(window_ds), hp.samples, ap.seed)
    result = model_health(model, window_ds, idx, band_ds, ap=ap, hp=hp, windows=windows, progress=progress)
    # the model's path relative to the working directory (a stage's: the repository) when inside it, so
    # the details file has the same bytes in every clone
    model_abs, here = Path(model_path).resolve(), Path.cwd().resolve()
    result.update(model=model_abs.relative_to(here).as_posix() if model_abs.is_relative_to(here) else str(model_path),
                  task=task, pair=pair,
                  windows_from="select_windows" if windows is not None else "health sentences")
    atomic_write_json(details_path, result)
    atomic_write_json(metrics_path, flat_metrics(result))
    plot_health(result, plot_path, threshold=ap.threshold, full_layers=ap.full_layers,
                title=f"{pair} {role.upper()} model: attention health ({result['sentences']} "
                      f"{ap.window_split} sentences, mean N = {result['tokens_mean']}; band test on {hp.band_split})")
    return result


def band_test_stage(model_path: Any, prepared: Any, pair: str, seed: int, *, algorithm1: Sequence[int],
                    full_layers: int, hp: HealthParams, shuffle_seed: int, metrics_path: Any,
                    producer: str, windows_from: str, max_frames: int = 20000) -> dict[str, Any]:
    """What the band_test stage does for one pair and seed: :func:`band_test_table` of the ST model at
    ``model_path`` on every sentence of ``health.band_split`` (teacher-forced, as health_st's band test),
    with ``algorithm1`` (the local system's windows, named by ``windows_from``) and the ``health.band_windows``.
    Writes the table (``metrics_path``; its figure is lib.analysis.band_plot's) and returns it."""
    from pathlib import Path

    from lib.model.checkpoint import load_model
    from lib.data.dataset import PAD_ID, SpeechDataset, batch_by_frames, collate
    from lib.io import atomic_write_json

    prepared = Path(prepared)
    if not (prepared / f"{hp.band_split}.tsv").is_file():
        raise FileNotFoundError(f"{prepared / f'{hp.band_split}.tsv'}: prepared manifest not found "
                                f"(run `dvc repro prepare` first)")
    model, meta = load_model(model_path, producer=producer)
    band_ds = SpeechDataset(prepared, hp.band_split, meta.get("task", "st"),
                            vocab_dir=prepared.parent / (meta.get("pair") or pair))
    batches = [collate(band_ds, b) for b in batch_by_frames(band_ds.n_frames, max_frames, shuffle=False)]
    rows = band_test_table(model, batches, full_layers=full_layers, algorithm1=algorithm1, windows=hp.band_windows,
                           shuffle_seed=shuffle_seed, pad_idx=PAD_ID)
    model_abs, here = Path(model_path).resolve(), Path.cwd().resolve()
    result = {"pair": pair, "seed": seed,
              "model": model_abs.relative_to(here).as_posix() if model_abs.is_relative_to(here) else str(model_path),
              "band_split": hp.band_split, "sentences": len(band_ds), "full_layers": full_layers,
              "windows_from": windows_from, "shuffle_seed": shuffle_seed, "rows": rows,
              "order": list(rows)}  # the file's keys are sorted: the table's order of configurations
    atomic_write_json(metrics_path, result)
    return result
