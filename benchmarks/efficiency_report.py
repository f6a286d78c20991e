"""Efficiency of local attention: FLOP-count bounds, flat metrics, Markdown table and plot.

The paper (Alastruey et al., 2022, Sec. 4) only argues that local attention lowers the
complexity of a layer from O(n^2) to O(n * w); ``benchmarks/encoder_efficiency.py``
measures it.  This module, next to it, holds everything of that benchmark that is not
timing: the FLOP model the measured speedups are compared with, the flat
``metrics/efficiency.json``, the Markdown table ``metrics/efficiency.md`` and the plot.
The benchmark's ``efficiency`` params are typed in ``lib/params/`` (``EfficiencyParams``).
Not a pipeline dependency: import it as ``from benchmarks import efficiency_report``
(with the repository root on ``sys.path``).

FLOP model (multiply-adds, per sequence; batch size and heads cancel in every ratio)
------------------------------------------------------------------------------------
One pre-LN encoder layer of width d, FFN width f, sequence length N::

    projections   q, k, v, out      4 * N * d^2
    FFN           fc1, fc2          2 * N * d * f
    attention     q k^T and P v     2 * N * N_eff * d      (summed over heads: H * dh = d)

with ``N_eff = N`` for full attention and, for local attention with window w,

* ``N_eff = min(w, N)``     -- the *ideal* count (only the band is computed), used for
  ``bound`` and ``fraction_of_bound``;
* ``N_eff = blk + w - 1``   -- what ``lib.model.local_attention`` actually computes
  (every query of a block of ``blk`` rows against its block's window of ``blk + w - 1``
  keys; ``blk = choose_block_size(N, w)``; ``w >= 2N - 1`` dispatches to SDPA, N_eff = N),
  used for the second, "implementation" bound.

Backward: every matmul of the layer costs two matmuls of the same size in the backward
(linear layers: grad input + grad weight; attention: dP = dO V^T, dV = P^T dO,
dQ = dS K, dK = dS^T Q against q k^T and P v), so the fwd+bwd count is 3x the forward
one for every term and the bound is the same for the forward and for forward+backward.

Not counted: layer norms, softmax, ReLU, biases, residual adds (O(N d + H N N_eff)
element-wise operations, 1-2 % of the multiply-adds at d = 256, f = 2048, N <= 1052 -- see
:func:`elementwise_ops`, reported next to the bound).  They are memory-bound on a CPU,
so their *time* share is larger than their FLOP share; that is one reason why a measured
speedup can fall short of the FLOP bound (and the conv subsampler, identical for both
models, is left out of both counts and of the measurement).

    speedup_bound(specs, N) = MACs(12 x full, N) / MACs(specs, N)       (Amdahl)
    op bound (attention op alone) = N / w       (score work fraction w / N)
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = [
    "PAPER_EN_DE_WINDOWS",
    "OP_METHODS",
    "EncoderDims",
    "attention_keys",
    "elementwise_ops",
    "encoder_macs",
    "encoder_speedup_bound",
    "evaluate_targets",
    "flat_metrics",
    "full_spec",
    "layer_macs",
    "load_warnings",
    "load_windows_json",
    "markdown_report",
    "op_score_fraction",
    "op_score_fraction_impl",
    "paper_spec",
    "plot_time_vs_n",
    "spec_summary",
    "write_outputs",
]

if __name__ == "__main__":  # run directly, the import below would fail with a bare ModuleNotFoundError
    raise SystemExit("benchmarks/efficiency_report.py is the report half of benchmarks/encoder_efficiency.py, "
                     "not a script: run `python benchmarks/encoder_efficiency.py --help`")

from lib.paper import EN_DE_WINDOWS as PAPER_EN_DE_WINDOWS  # noqa: E402 (the paper's Table 1, layers 4-12)
from lib.paper import FULL_LAYERS as PAPER_FULL_LAYERS  # noqa: E402
#: Attention-op methods of benchmarks/local_attention.py, in table order.
OP_METHODS = ("sdpa", "sdpa_band", "material", "local")
OP_LABELS = {"sdpa": "full SDPA", "sdpa_band": "band-masked SDPA", "material": "materialised scores",
             "local": "local (ours)"}
MIB = 2**20

# The efficiency targets local attention is held to (printed with the measurements).
TARGET_OP_SPEEDUP = 6.0  # op fwd+bwd at N = 1052, w = 13 vs full SDPA
TARGET_OP_SHORT = 1.0  # op at N = 166 no slower than SDPA
TARGET_MEM_VS_SDPA = 2.0  # local peak <= 2 x SDPA's
TARGET_MEM_VS_MATERIAL = 3.0  # materialised peak >= 3 x local's
TARGET_FRACTION = 0.95  # whole encoder >= 95 % of its FLOP bound
HEAD_N, HEAD_W, SHORT_N = 1052, 13, 166
LOAD_WARN = 1.0  # 1-min load average at start from which the timings are flagged
CPU_SHARE_WARN = 0.85  # CPU share of the encoder timing loops below which they are flagged


# ----------------------------------------------------------------------------------------------- specs


def full_spec(n_layers: int = 12) -> list[dict]:
    return [{"type": "full"} for _ in range(n_layers)]


def paper_spec() -> list[dict]:
    """The paper's En-De encoder: layers 1-3 full, 4-12 local with :data:`PAPER_EN_DE_WINDOWS`."""
    from lib.model.spec import local_attention_spec

    return local_attention_spec(PAPER_FULL_LAYERS + len(PAPER_EN_DE_WINDOWS), PAPER_FULL_LAYERS,
                                list(PAPER_EN_DE_WINDOWS))


def load_windows_json(path: str | Path, n_layers: int = 12) -> list[dict] | None:
    """The ``encoder_attention`` list of a select_windows ``windows.json``; None if the file is absent.

    Raises ValueError if the file exists but holds no valid per-layer spec for ``n_layers`` layers.
    """
    import json

    from lib.model.spec import validate_spec

    path = Path(path)
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "encoder_attention" not in data:
        raise ValueError(f"{path}: no 'encoder_attention' list")
    return validate_spec(data["encoder_attention"], n_layers, key=f"{path}: encoder_attention")


def spec_summary(specs: Sequence[Mapping]) -> str:
    """Compact one-line description: ``F F F 5 5 9 ...`` (F = full, number = local window)."""
    return " ".join("F" if s["type"] == "full" else str(s["window"]) if s["type"] == "local" else s["type"]
                    for s in specs)


# ----------------------------------------------------------------------------------------------- FLOPs


@dataclass(frozen=True)
class EncoderDims:
    """Width of the encoder layers (paper size ``s``: d = 256, FFN 2048, 4 heads)."""

    d_model: int = 256
    ffn_dim: int = 2048
    n_heads: int = 4


def attention_keys(spec: Mapping, n: int, *, implementation: bool = False) -> int:
    """Keys each query is scored against (``N_eff``) for one layer's attention spec."""
    kind = spec["type"]
    if kind == "full":
        return n
    if kind != "local":
        raise ValueError(f"no FLOP model for attention type {kind!r}")
    w = int(spec["window"])
    if not implementation:
        return min(w, n)
    if w >= 2 * n - 1:  # local_attention dispatches to SDPA: full cost
        return n
    from lib.model.local_attention import choose_block_size

    return choose_block_size(n, w) + w - 1


def layer_macs(spec: Mapping, n: int, dims: EncoderDims = EncoderDims(), *,
               implementation: bool = False) -> dict[str, int]:
    """Forward multiply-adds of one encoder layer on one sequence of length ``n``."""
    d, f = dims.d_model, dims.ffn_dim
    parts = {"proj": 4 * n * d * d, "ffn": 2 * n * d * f,
             "attn": 2 * n * attention_keys(spec, n, implementation=implementation) * d}
    parts["total"] = parts["proj"] + parts["ffn"] + parts["attn"]
    return parts


def encoder_macs(specs: Sequence[Mapping], n: int, dims: EncoderDims = EncoderDims(), *,
                 implementation: bool = False) -> dict[str, int]:
    """Forward multiply-adds of a stack of layers (sum of :func:`layer_macs`)."""
    tot = {"proj": 0, "ffn": 0, "attn": 0, "total": 0}
    for s in specs:
        for k, v in layer_macs(s, n, dims, implementation=implementation).items():
            tot[k] += v
    return tot


def encoder_speedup_bound(specs: Sequence[Mapping], n: int, dims: EncoderDims = EncoderDims(), *,
                          implementation: bool = False) -> float:
    """Amdahl bound MACs(all-full) / MACs(specs) for the same number of layers (fwd = fwd+bwd)."""
    full = encoder_macs(full_spec(len(specs)), n, dims)["total"]
    return full / encoder_macs(specs, n, dims, implementation=implementation)["total"]


def elementwise_ops(specs: Sequence[Mapping], n: int, dims: EncoderDims = EncoderDims()) -> int:
    """Rough count of the element-wise operations the MAC model leaves out (forward).

    Per layer: 2 layer norms (~8 ops per element of N x d), softmax (~5 per score: scale, max,
    exp, sum, divide, H x N x N_eff scores), ReLU (N x f), biases (N x (4d + f + d)),
    2 residual adds (N x d).
    """
    d, f, h = dims.d_model, dims.ffn_dim, dims.n_heads
    total = 0
    for s in specs:
        total += 16 * n * d + 5 * h * n * attention_keys(s, n) + n * f + n * (5 * d + f) + 2 * n * d
    return total


def op_score_fraction(n: int, w: int) -> float:
    """Fraction of the N x N scores inside the band (ideal local work / full work)."""
    return min(1.0, w / n)


def op_score_fraction_impl(n: int, w: int) -> float:
    """Fraction actually computed by the blocked kernel: (blk + w - 1) / N (1 when it uses SDPA)."""
    return min(1.0, attention_keys({"type": "local", "window": w}, n, implementation=True) / n)


# ----------------------------------------------------------------------------------------------- metrics
#
# ``result`` is what benchmarks/encoder_efficiency.py returns:
#   {"meta": {...},
#    "op": [row of benchmarks/local_attention.run: {"N", "w", "blk", "score_bound", "score_actual",
#           "<method>": {"fwd": {"median_ms", ...}, "fwdbwd": {...}, "mem": {"fwd_bytes", "fwdbwd_bytes"}}}],
#    "encoder": {"configs": {name: [spec, ...]}, "notes": [str],
#                "rows": [{"N", "config", "fwd": {"median_ms", ...}, "fwdbwd": {...},
#                          "mem": {"fwd_bytes", "fwdbwd_bytes"}}]}}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def _op_index(result: Mapping) -> dict[tuple[int, int], Mapping]:
    return {(r["N"], r["w"]): r for r in result.get("op", [])}


def _enc_index(result: Mapping) -> dict[tuple[str, int], Mapping]:
    return {(r["config"], r["N"]): r for r in result.get("encoder", {}).get("rows", [])}


def _enc_dims(result: Mapping) -> EncoderDims:
    m = result.get("meta", {})
    return EncoderDims(m.get("d_model", 256), m.get("ffn_dim", 2048), m.get("heads", 4))


def flat_metrics(result: Mapping) -> dict[str, Any]:
    """The flat ``metrics/efficiency.json``: times (ms, medians), speedups, bounds, memory (MiB)."""
    out: dict[str, Any] = {}
    for r in result.get("op", []):
        n, w = r["N"], r["w"]
        tag = f"N{n}_w{w}"
        for m in OP_METHODS:
            if m not in r:
                continue
            out[f"op_fwd_ms_{m}_{tag}"] = round(r[m]["fwd"]["median_ms"], 3)
            out[f"op_fwdbwd_ms_{m}_{tag}"] = round(r[m]["fwdbwd"]["median_ms"], 3)
            out[f"op_mem_fwd_mib_{m}_{tag}"] = round(r[m]["mem"]["fwd_bytes"] / MIB, 2)
            out[f"op_mem_fwdbwd_mib_{m}_{tag}"] = round(r[m]["mem"]["fwdbwd_bytes"] / MIB, 2)
        loc = r["local"]
        for mode in ("fwd", "fwdbwd"):
            out[f"op_{mode}_speedup_{tag}"] = round(_ratio(r["sdpa"][mode]["median_ms"], loc[mode]["median_ms"]), 3)
            if "sdpa_band" in r:
                out[f"op_{mode}_speedup_vs_band_{tag}"] = round(
                    _ratio(r["sdpa_band"][mode]["median_ms"], loc[mode]["median_ms"]), 3)
        out[f"op_bound_{tag}"] = round(1.0 / op_score_fraction(n, w), 3)
        out[f"op_impl_bound_{tag}"] = round(1.0 / op_score_fraction_impl(n, w), 3)
        out[f"op_score_fraction_{tag}"] = round(op_score_fraction(n, w), 5)
        out[f"op_score_fraction_impl_{tag}"] = round(op_score_fraction_impl(n, w), 5)
        for mode in ("fwd", "fwdbwd"):
            lm = loc["mem"][f"{mode}_bytes"]
            out[f"op_mem_{mode}_local_over_sdpa_{tag}"] = round(_ratio(lm, r["sdpa"]["mem"][f"{mode}_bytes"]), 3)
            if "material" in r:
                out[f"op_mem_{mode}_material_over_local_{tag}"] = round(
                    _ratio(r["material"]["mem"][f"{mode}_bytes"], lm), 3)

    enc = result.get("encoder", {})
    configs = enc.get("configs", {})
    idx = _enc_index(result)
    dims = _enc_dims(result)
    for (cfg, n), r in sorted(idx.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        tag = f"{cfg}_N{n}"
        for mode in ("fwd", "fwdbwd"):
            out[f"encoder_{mode}_ms_{tag}"] = round(r[mode]["median_ms"], 3)
            if r.get("mem"):
                out[f"encoder_mem_{mode}_mib_{tag}"] = round(r["mem"][f"{mode}_bytes"] / MIB, 2)
        if cfg == "full" or ("full", n) not in idx:
            continue
        full = idx[("full", n)]
        bound = encoder_speedup_bound(configs[cfg], n, dims)
        impl = encoder_speedup_bound(configs[cfg], n, dims, implementation=True)
        for mode in ("fwd", "fwdbwd"):
            sp = _ratio(full[mode]["median_ms"], r[mode]["median_ms"])
            out[f"encoder_{mode}_speedup_{tag}"] = round(sp, 3)
            out[f"encoder_{mode}_bound_{tag}"] = round(bound, 4)
            out[f"encoder_{mode}_impl_bound_{tag}"] = round(impl, 4)
            key = "encoder_fraction_of_bound" if mode == "fwdbwd" else "encoder_fwd_fraction_of_bound"
            out[f"{key}_{tag}"] = round(sp / bound, 3)
            if r.get("mem") and full.get("mem"):
                out[f"encoder_mem_{mode}_ratio_{tag}"] = round(
                    _ratio(r["mem"][f"{mode}_bytes"], full["mem"][f"{mode}_bytes"]), 3)

    for t in evaluate_targets(result):
        out[f"target_{t['key']}"] = t["met"]
    meta = result.get("meta", {})
    for k in ("threads", "batch", "op_reps", "encoder_reps", "seconds"):
        if k in meta:
            out[f"meta_{k}"] = meta[k]
    for k in ("loadavg_start", "loadavg_end"):
        if k in meta:
            out[f"meta_{k}_1min"] = round(meta[k][0], 2)
    for n, share in _cpu_shares(result).items():
        out[f"meta_encoder_cpu_share_N{n}"] = share
    return out


def _cpu_shares(result: Mapping) -> dict[int, float]:
    """N -> CPU share of the encoder timing loops (recorded per row; the same for every config)."""
    return {r["N"]: r["cpu_share"] for r in result.get("encoder", {}).get("rows", []) if "cpu_share" in r}


def load_warnings(result: Mapping) -> list[str]:
    """Reasons to distrust the timings: other processes running at start, or the encoder timing
    loops getting clearly less CPU than their threads could use."""
    meta = result.get("meta", {})
    warn = []
    la0 = meta.get("loadavg_start")
    if la0 and la0[0] >= LOAD_WARN:
        warn.append(f"1-min load average {la0[0]:.2f} at start (other processes running)")
    low = {n: s for n, s in _cpu_shares(result).items() if s < CPU_SHARE_WARN}
    if low:
        warn.append("encoder timing loops got " + ", ".join(f"{s:.0%} at N={n}" for n, s in sorted(low.items()))
                    + f" of {meta.get('threads', '?')} cores")
    return warn


def evaluate_targets(result: Mapping) -> list[dict[str, Any]]:
    """The efficiency targets: one dict each with key, text, measured value(s), threshold, met.

    ``met`` is True / False, or None when the configuration it refers to was not measured.
    """
    op = _op_index(result)
    enc = _enc_index(result)
    configs = result.get("encoder", {}).get("configs", {})
    dims = _enc_dims(result)
    targets: list[dict[str, Any]] = []

    r = op.get((HEAD_N, HEAD_W))
    sp = _ratio(r["sdpa"]["fwdbwd"]["median_ms"], r["local"]["fwdbwd"]["median_ms"]) if r else None
    targets.append({"key": f"op_fwdbwd_speedup_N{HEAD_N}_w{HEAD_W}",
                    "text": f"op fwd+bwd at N={HEAD_N}, w={HEAD_W} >= {TARGET_OP_SPEEDUP:g}x faster than full SDPA",
                    "value": f"{sp:.2f}x" if sp is not None else "not measured",
                    "met": None if sp is None else bool(sp >= TARGET_OP_SPEEDUP)})

    short = sorted((k, v) for k, v in op.items() if k[0] == SHORT_N)
    vals = []
    for (n, w), row in short:
        for mode in ("fwd", "fwdbwd"):
            vals.append((f"w={w} {mode}", _ratio(row["sdpa"][mode]["median_ms"], row["local"][mode]["median_ms"])))
    targets.append({"key": f"op_not_slower_N{SHORT_N}",
                    "text": f"op at N={SHORT_N} no slower than full SDPA (fwd and fwd+bwd, every w)",
                    "value": ", ".join(f"{k}: {v:.2f}x" for k, v in vals) if vals else "not measured",
                    "met": None if not vals else bool(all(v >= TARGET_OP_SHORT for _, v in vals))})

    if r:
        lm, sm, mm = (r[m]["mem"]["fwdbwd_bytes"] for m in ("local", "sdpa", "material"))
        a, b = _ratio(lm, sm), _ratio(mm, lm)
        targets.append({"key": f"op_mem_vs_sdpa_N{HEAD_N}_w{HEAD_W}",
                        "text": f"op fwd+bwd peak extra memory at N={HEAD_N}, w={HEAD_W} <= "
                                f"{TARGET_MEM_VS_SDPA:g}x full SDPA's",
                        "value": f"{lm / MIB:.1f} / {sm / MIB:.1f} MiB = {a:.2f}x", "met": bool(a <= TARGET_MEM_VS_SDPA)})
        targets.append({"key": f"op_mem_vs_material_N{HEAD_N}_w{HEAD_W}",
                        "text": f"op fwd+bwd peak extra memory at N={HEAD_N}, w={HEAD_W} >= "
                                f"{TARGET_MEM_VS_MATERIAL:g}x less than materialised scores",
                        "value": f"{mm / MIB:.1f} / {lm / MIB:.1f} MiB = {b:.2f}x",
                        "met": bool(b >= TARGET_MEM_VS_MATERIAL)})
    else:
        for key in (f"op_mem_vs_sdpa_N{HEAD_N}_w{HEAD_W}", f"op_mem_vs_material_N{HEAD_N}_w{HEAD_W}"):
            targets.append({"key": key, "text": key.replace("_", " "), "value": "not measured", "met": None})

    for cfg in [c for c in configs if c != "full"]:
        for n in (HEAD_N, SHORT_N):
            row, full = enc.get((cfg, n)), enc.get(("full", n))
            key = f"encoder_fraction_of_bound_{cfg}_N{n}"
            text = (f"whole encoder ({cfg} windows) fwd+bwd at N={n} >= {TARGET_FRACTION:.0%} of its FLOP bound")
            if row is None or full is None:
                targets.append({"key": key, "text": text, "value": "not measured", "met": None})
                continue
            sp = _ratio(full["fwdbwd"]["median_ms"], row["fwdbwd"]["median_ms"])
            bound = encoder_speedup_bound(configs[cfg], n, dims)
            targets.append({"key": key, "text": text,
                            "value": f"{sp:.3f}x of {bound:.3f}x = {sp / bound:.1%}",
                            "met": bool(sp / bound >= TARGET_FRACTION)})
    return targets


# ----------------------------------------------------------------------------------------------- markdown


def _fmt_met(met: bool | None) -> str:
    return "n/a" if met is None else ("**yes**" if met else "**no**")


def markdown_report(result: Mapping) -> str:
    """``metrics/efficiency.md``: settings, target check, op table, encoder table, notes."""
    meta = result.get("meta", {})
    dims = _enc_dims(result)
    lines: list[str] = ["# Efficiency of local attention (CPU)", ""]
    la0, la1 = meta.get("loadavg_start"), meta.get("loadavg_end")
    lines += [
        f"torch {meta.get('torch', '?')}, {meta.get('threads', '?')} threads, {meta.get('cpu', '?')}; "
        f"batch {meta.get('batch', '?')}, d = {dims.d_model}, {dims.n_heads} heads, FFN {dims.ffn_dim}, "
        f"fp32; medians of at least {meta.get('op_reps', '?')} (op) / {meta.get('encoder_reps', '?')} (encoder) "
        f"interleaved repetitions, more for fast steps (until 0.5 s of samples per op method and 2 s per "
        f"encoder configuration){' (quick mode)' if meta.get('quick') else ''}.",
        "",
        f"Machine load (os.getloadavg, 1/5/15 min): start {_fmt_load(la0)}, end {_fmt_load(la1)} "
        f"on {meta.get('cpu_count', '?')} CPUs; total {meta.get('seconds', 0):.0f} s."
        + ("" if not _cpu_shares(result) else " CPU share of the encoder timing loops (CPU time / "
           "(wall x threads)): " + ", ".join(f"N={n}: {s:.0%}" for n, s in sorted(_cpu_shares(result).items()))
           + "."),
        "",
    ]
    warn = load_warnings(result)
    if warn:
        lines += [f"**Warning: timings taken on a busy machine** ({'; '.join(warn)}). CPU contention slows "
                  "the local kernel (many small parallel regions) far more than SDPA or the large GEMMs, so "
                  "the ratios are biased against local attention; rerun on a quiet machine.", ""]
    lines += [
        "## Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    for t in evaluate_targets(result):
        lines.append(f"| {t['text']} | {t['value']} | {_fmt_met(t['met'])} |")

    lines += ["", "## Attention op (B x H x N x dh, H = 4, dh = 64)", "",
              "Time in ms (median); speedup = time(full SDPA) / time(local); bound = N / w "
              "(score work w / N), impl. bound = N / (blk + w - 1); memory = peak extra resident "
              "memory of one fwd+bwd step in MiB.", "",
              "| N | w | bound | impl. bound | fwd SDPA | fwd band | fwd local | fwd speedup "
              "| fwd+bwd SDPA | fwd+bwd band | fwd+bwd mat. | fwd+bwd local | fwd+bwd speedup | vs band "
              "| mem SDPA | mem band | mem mat. | mem local | local/SDPA | mat./local |",
              "|" + "---|" * 20]
    for r in result.get("op", []):
        n, w = r["N"], r["w"]
        f = {m: r[m]["fwd"]["median_ms"] for m in OP_METHODS if m in r}
        fb = {m: r[m]["fwdbwd"]["median_ms"] for m in OP_METHODS if m in r}
        mem = {m: r[m]["mem"]["fwdbwd_bytes"] / MIB for m in OP_METHODS if m in r}
        lines.append(
            f"| {n} | {w} | {1 / op_score_fraction(n, w):.1f}x | {1 / op_score_fraction_impl(n, w):.1f}x "
            f"| {f['sdpa']:.1f} | {f.get('sdpa_band', math.nan):.1f} | {f['local']:.1f} "
            f"| {_ratio(f['sdpa'], f['local']):.2f}x "
            f"| {fb['sdpa']:.1f} | {fb.get('sdpa_band', math.nan):.1f} | {fb.get('material', math.nan):.1f} "
            f"| {fb['local']:.1f} | {_ratio(fb['sdpa'], fb['local']):.2f}x "
            f"| {_ratio(fb.get('sdpa_band', math.nan), fb['local']):.2f}x "
            f"| {mem['sdpa']:.1f} | {mem.get('sdpa_band', math.nan):.1f} | {mem.get('material', math.nan):.1f} "
            f"| {mem['local']:.1f} | {_ratio(mem['local'], mem['sdpa']):.2f}x "
            f"| {_ratio(mem.get('material', math.nan), mem['local']):.1f}x |")

    enc = result.get("encoder", {})
    configs = enc.get("configs", {})
    idx = _enc_index(result)
    lines += ["", f"## Whole encoder: {len(next(iter(configs.values()), []))} encoder layers "
              "(input (B, N, d), after the conv subsampler)", "",
              "Configurations (F = full attention, number = local window of that layer):", ""]
    for name, specs in configs.items():
        lines.append(f"- `{name}`: {spec_summary(specs)}")
    for note in enc.get("notes", []):
        lines.append(f"- note: {note}")
    lines += ["", "Speedup = time(all-full) / time(config); bound = FLOP-count Amdahl bound (ideal band, "
              "N_eff = w); impl. bound = with the kernel's blk + w - 1 keys per query; fraction = "
              "fwd+bwd speedup / bound; memory = peak extra resident memory in MiB.", "",
              "| N | config | fwd ms | fwd speedup | fwd+bwd ms | fwd+bwd speedup | bound | impl. bound "
              "| fraction of bound | mem fwd | mem fwd+bwd | mem vs full |",
              "|" + "---|" * 12]
    for (cfg, n), r in sorted(idx.items(), key=lambda kv: (kv[0][1], list(configs).index(kv[0][0]))):
        full = idx.get(("full", n))
        fm, fbm = r["fwd"]["median_ms"], r["fwdbwd"]["median_ms"]
        has_mem = bool(r.get("mem"))
        mem_f = f"{r['mem']['fwd_bytes'] / MIB:.0f}" if has_mem else "-"
        mem_fb = f"{r['mem']['fwdbwd_bytes'] / MIB:.0f}" if has_mem else "-"
        if cfg == "full" or full is None:
            lines.append(f"| {n} | {cfg} | {fm:.0f} | - | {fbm:.0f} | - | - | - | - | {mem_f} | {mem_fb} | - |")
            continue
        mem_rel = (f"{_ratio(r['mem']['fwdbwd_bytes'], full['mem']['fwdbwd_bytes']):.2f}x"
                   if has_mem and full.get("mem") else "-")
        b = encoder_speedup_bound(configs[cfg], n, dims)
        bi = encoder_speedup_bound(configs[cfg], n, dims, implementation=True)
        sf, sfb = _ratio(full["fwd"]["median_ms"], fm), _ratio(full["fwdbwd"]["median_ms"], fbm)
        lines.append(f"| {n} | {cfg} | {fm:.0f} | {sf:.2f}x | {fbm:.0f} | {sfb:.2f}x | {b:.3f}x | {bi:.3f}x "
                     f"| {sfb / b:.1%} | {mem_f} | {mem_fb} | {mem_rel} |")

    # FLOP breakdown of the full encoder, to read the bounds.
    ns = sorted({n for _, n in idx} | {r["N"] for r in result.get("op", [])})
    if ns:
        lines += ["", "FLOP model (forward multiply-adds per sequence, all-full encoder; fwd+bwd = 3x for every "
                  "term, so the bound is the same): share of projections / FFN / attention, and the element-wise "
                  "operations left out (layer norm, softmax, ReLU, bias, residual) relative to the MACs:", ""]
        n_layers = len(next(iter(configs.values()), full_spec()))
        for n in ns:
            m = encoder_macs(full_spec(n_layers), n, dims)
            e = elementwise_ops(full_spec(n_layers), n, dims)
            lines.append(f"- N = {n}: {m['total'] / 1e9:.2f} GMAC; proj {m['proj'] / m['total']:.1%}, "
                         f"FFN {m['ffn'] / m['total']:.1%}, attention {m['attn'] / m['total']:.1%}; "
                         f"element-wise {e / m['total']:.2%} of the MACs")

    lines += ["", "## How it is measured", ""]
    for note in meta.get("method_notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def _fmt_load(la: Sequence[float] | None) -> str:
    return "?" if not la else "/".join(f"{x:.2f}" for x in la)


# ----------------------------------------------------------------------------------------------- plot


def plot_time_vs_n(result: Mapping, path: str | Path, *, op_window: int = HEAD_W) -> Path | None:
    """Log-log time against N: whole-encoder fwd+bwd (full vs each local config, with the FLOP
    bound t_full / bound dashed) and the attention op fwd+bwd at ``op_window``.

    Returns the path, or None when there is nothing to draw.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from lib.io import atomic_write_bytes

    enc = result.get("encoder", {})
    configs = enc.get("configs", {})
    idx = _enc_index(result)
    op_rows = sorted((r for r in result.get("op", []) if r["w"] == op_window), key=lambda r: r["N"])
    if not idx and not op_rows:
        return None
    dims = _enc_dims(result)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    ax = axes[0]
    for i, cfg in enumerate(configs):
        pts = sorted((n, r["fwdbwd"]["median_ms"]) for (c, n), r in idx.items() if c == cfg)
        if not pts:
            continue
        ns, ts = zip(*pts)
        line, = ax.plot(ns, ts, marker="o", label=f"{cfg}" + ("" if cfg == "full" else f" ({spec_summary(configs[cfg])})"))
        if cfg != "full":
            bpts = [(n, idx[("full", n)]["fwdbwd"]["median_ms"] / encoder_speedup_bound(configs[cfg], n, dims))
                    for n in ns if ("full", n) in idx]
            if bpts:
                bn, bt = zip(*bpts)
                ax.plot(bn, bt, ls="--", color=line.get_color(), alpha=0.7, label=f"{cfg}: FLOP bound")
    ax.set(xscale="log", yscale="log", xlabel="N (encoder tokens)", ylabel="fwd+bwd time (ms)",
           title="12 encoder layers, fwd+bwd")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[1]
    if op_rows:
        ns = [r["N"] for r in op_rows]
        for m in OP_METHODS:
            if m in op_rows[0]:
                ax.plot(ns, [r[m]["fwdbwd"]["median_ms"] for r in op_rows], marker="o", label=OP_LABELS[m])
    ax.set(xscale="log", yscale="log", xlabel="N", ylabel="fwd+bwd time (ms)",
           title=f"attention op, w = {op_window}, fwd+bwd")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[2]  # the encoder speedups on a linear scale, where the gap to the bound is visible
    for cfg in [c for c in configs if c != "full"]:
        pts = sorted((n, idx[("full", n)]["fwdbwd"]["median_ms"] / r["fwdbwd"]["median_ms"],
                      encoder_speedup_bound(configs[cfg], n, dims))
                     for (c, n), r in idx.items() if c == cfg and ("full", n) in idx)
        if pts:
            ns, sp, bd = zip(*pts)
            line, = ax.plot(ns, sp, marker="o", label=f"{cfg}: measured")
            ax.plot(ns, bd, ls="--", color=line.get_color(), alpha=0.7, label=f"{cfg}: FLOP bound")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="N (encoder tokens)", ylabel="speedup over all-full",
           title="12 encoder layers, fwd+bwd speedup")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    all_ns = sorted({n for _, n in idx} | {r["N"] for r in op_rows})
    for ax in axes:  # label the measured lengths themselves, not powers of ten
        ax.set_xticks(all_ns)
        ax.set_xticklabels([str(n) for n in all_ns])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    meta = result.get("meta", {})
    fig.suptitle(f"CPU, {meta.get('threads', '?')} threads, batch {meta.get('batch', '?')}, fp32 "
                 f"(load avg at start {_fmt_load(meta.get('loadavg_start'))})", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


# ----------------------------------------------------------------------------------------------- outputs


def write_outputs(result: Mapping, *, metrics: str | Path | None = None, md: str | Path | None = None,
                  plot: str | Path | None = None, raw: str | Path | None = None) -> list[Path]:
    """Write whichever of the outputs is given, each atomically; returns the written paths."""
    from lib.io import atomic_write_json, atomic_write_text

    written: list[Path] = []
    if metrics is not None:
        atomic_write_json(metrics, flat_metrics(result))
        written.append(Path(metrics))
    if md is not None:
        atomic_write_text(md, markdown_report(result))
        written.append(Path(md))
    if plot is not None and plot_time_vs_n(result, plot) is not None:
        written.append(Path(plot))
    if raw is not None:
        atomic_write_json(raw, result)
        written.append(Path(raw))
    return written
