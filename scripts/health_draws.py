"""Algorithm 1's windows, the band and C_ii per layer over several draws (seeds) of one model: how
much of a window profile is the setting and how much the draw (do the windows grow with depth in every draw?).

    python scripts/health_draws.py workspace asr-seed2 asr-seed3 asr-seed4 asr-seed5
    python scripts/health_draws.py "seed 1=workspace" "seed 2=asr-seed2" --model asr --pair en-de --md out.md

Each draw is ``[label=]source``; the source is ``workspace`` (this checkout's ``metrics/health/<pair>/<model>.json``), the name of a
DVC experiment (``dvc exp run -n NAME``, ``--temp`` included: its commit under ``refs/exps``), or a
path to a health metrics file. Printed per draw: the layers' windows (k+1..L, as in the health
metrics), how many are >= 3, Spearman's rho with depth, and the means of C_ii and of the ±2 band
mass over uniform; then per layer over the draws: the mean and median window, the share of draws
with w >= 3, the mean band mass, C_ii and ‖attention output‖ / ‖x‖ (``attn_ratio``), and the depth
rho of the mean window profile, of the mean band profile and of the mean C_ii. Per draw also the
Spearman rho, across layers, of the windows with ``attn_ratio``: whether a layer's window follows
how much its attention adds to the residual stream ("–" for health metrics without ``attn_ratio``).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lib.stats import spearman  # noqa: E402


def experiment_ref(name: str) -> str:
    """The git ref of DVC experiment ``name`` (``refs/exps/<xx>/<baseline>/<name>``); exits when
    none or several match."""
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.split()
    hits = [r for r in refs if r.rsplit("/", 1)[-1] == name]
    if len(hits) != 1:
        sys.exit(f"error: {len(hits)} DVC experiments named {name!r} (refs/exps); "
                 f"known: {sorted({r.rsplit('/', 1)[-1] for r in refs})}")
    return hits[0]


def load_draw(source: str, model: str, pair: str) -> dict:
    """The health metrics of one draw (see the module docstring for ``source``)."""
    rel = f"metrics/health/{pair}/{model}.json"
    if source == "workspace":
        path = ROOT / rel
    elif source.endswith(".json"):
        path = Path(source)
    else:
        ref = experiment_ref(source)
        shown = subprocess.run(["git", "show", f"{ref}:{rel}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode != 0:
            sys.exit(f"error: experiment {source!r} has no {rel}: {shown.stderr.strip()}")
        return json.loads(shown.stdout)
    if not path.is_file():
        sys.exit(f"error: {path}: no such health metrics file")
    return json.loads(path.read_text(encoding="utf-8"))


def _windows(health: dict) -> list[int]:
    w = health["algorithm1_windows"]
    return [int(x) for x in (w.split() if isinstance(w, str) else w)]


def summarize_draws(draws: dict[str, dict]) -> dict:
    """Per draw and per layer over the draws (layers: the health metrics' Algorithm 1 layers, the
    last ``len(windows)`` of ``layers``)."""
    if not draws:
        raise ValueError("summarize_draws: no draws")
    per_draw, profiles, bands, ciis, ratios = {}, [], [], [], []
    n_layers = None
    for name, h in draws.items():
        w = _windows(h)
        if n_layers is None:
            n_layers = len(w)
        elif len(w) != n_layers:
            raise ValueError(f"draw {name!r} has {len(w)} windows, the first draw {n_layers}")
        keys = sorted(h["layers"])[-n_layers:]
        band = [float(h["layers"][k]["band2"]) for k in keys]
        cii = [float(h["layers"][k]["c_ii"]) for k in keys]
        ratio = [float(h["layers"][k].get("attn_ratio", "nan")) for k in keys]
        depth = list(range(len(w)))
        per_draw[name] = {"windows": w, "ge3": sum(x >= 3 for x in w), "rho": spearman(depth, w),
                          "c_ii_mean": statistics.fmean(cii), "band2_mean": statistics.fmean(band),
                          # do the windows follow how much each layer's attention adds to the residual?
                          "rho_attn": math.nan if any(math.isnan(r) for r in ratio) else spearman(ratio, w)}
        profiles.append(w)
        bands.append(band)
        ciis.append(cii)
        ratios.append(ratio)
    first_layer = int(sorted(next(iter(draws.values()))["layers"])[-n_layers][1:])
    layers = list(range(first_layer, first_layer + n_layers))
    mean_w = [statistics.fmean(p[i] for p in profiles) for i in range(n_layers)]
    mean_band = [statistics.fmean(b[i] for b in bands) for i in range(n_layers)]
    mean_cii = [statistics.fmean(c[i] for c in ciis) for i in range(n_layers)]
    return {
        "draws": per_draw,
        "layers": layers,
        "mean_window": mean_w,
        "median_window": [statistics.median(p[i] for p in profiles) for i in range(n_layers)],
        "share_ge3": [sum(p[i] >= 3 for p in profiles) / len(profiles) for i in range(n_layers)],
        "mean_band2": mean_band,
        "mean_c_ii": mean_cii,
        "mean_attn_ratio": [statistics.fmean(r[i] for r in ratios) for i in range(n_layers)],
        "rho_mean_window": spearman(list(range(n_layers)), mean_w),
        "rho_mean_band2": spearman(list(range(n_layers)), mean_band),
        "rho_mean_c_ii": spearman(list(range(n_layers)), mean_cii),
        "rho_per_draw_mean": statistics.fmean(d["rho"] for d in per_draw.values()),
    }


def markdown(s: dict, per_draw_only: bool = False) -> str:
    """The table; ``per_draw_only``: only the draws' rows (for models of different settings, whose
    means and medians mean nothing)."""
    layers = s["layers"]
    head = ("| draw | " + " | ".join(f"L{i}" for i in layers)
            + " | w ≥ 3 | ρ with depth | C_ii | ±2 mass / uniform | ρ with ‖attention output‖ / ‖x‖ |")
    lines = [head, "|" + "---|" * (len(layers) + 6)]
    for name, d in s["draws"].items():
        lines.append(f"| {name} | " + " | ".join(str(x) for x in d["windows"])
                     + f" | {d['ge3']} | {d['rho']:+.2f} | {d['c_ii_mean']:.3f} | {d['band2_mean']:.2f} | "
                     + ("–" if math.isnan(d["rho_attn"]) else f"{d['rho_attn']:+.2f}") + " |")
    if per_draw_only:
        return "\n".join(lines) + "\n"
    n = len(s["draws"])
    lines.append(f"| mean window ({n} draws) | " + " | ".join(f"{x:.1f}" for x in s["mean_window"])
                 + f" | | {s['rho_mean_window']:+.2f} (of the mean profile) | | | |")
    lines.append("| median window | " + " | ".join(f"{x:g}" for x in s["median_window"]) + " | | | | | |")
    lines.append("| share of draws with w ≥ 3 | " + " | ".join(f"{x:.0%}" for x in s["share_ge3"]) + " | | | | | |")
    lines.append("| mean ±2 mass / uniform | " + " | ".join(f"{x:.2f}" for x in s["mean_band2"])
                 + f" | | {s['rho_mean_band2']:+.2f} (of the mean band) | | | |")
    lines.append("| mean C_ii | " + " | ".join(f"{x:.3f}" for x in s["mean_c_ii"])
                 + f" | | {s['rho_mean_c_ii']:+.2f} (of the mean C_ii) | | | |")
    lines.append("| mean ‖attention output‖ / ‖x‖ | " + " | ".join(f"{x:.3f}" for x in s["mean_attn_ratio"])
                 + " | | | | | |")
    return "\n".join(lines) + (f"\n\nMean of the per-draw ρ: {s['rho_per_draw_mean']:+.2f}.\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("draws", nargs="+",
                    help="[label=]source, source: workspace | DVC experiment name | path to a health metrics .json")
    ap.add_argument("--model", default="asr", choices=["asr", "st"])
    ap.add_argument("--pair", default="en-de")
    ap.add_argument("--md", type=Path, help="also write the table here")
    ap.add_argument("--per-draw-only", action="store_true",
                    help="only the draws' rows: models of different settings side by side, no means")
    args = ap.parse_args()
    draws = {}
    for arg in args.draws:
        label, _, source = arg.rpartition("=")
        draws[label or source] = load_draw(source, args.model, args.pair)
    try:
        md = markdown(summarize_draws(draws), per_draw_only=args.per_draw_only)
    except (KeyError, ValueError) as e:
        sys.exit(f"error: {e}")
    if args.md:
        from lib.io import atomic_write_text

        atomic_write_text(args.md, md)
    print(md, end="")


if __name__ == "__main__":
    main()
