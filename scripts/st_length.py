"""local − baseline against the length of ST training, on this checkout's draw: the ST baseline and the
local system of every pair and seed, trained for ``--max-updates`` with a dev evaluation every
``--eval-every`` updates, from the ASR models and Algorithm 1's windows that this checkout's `make repro`
wrote. Then per pair and evaluation step: dev NLL (teacher-forced, per target token) and dev BLEU (greedy,
``decode.dev_sentences`` sentences) of both systems, local − baseline with its 95 % t-interval over seeds
(paired by seed), and how much the baseline's dev NLL still falls over the last 10 % of a run of that
length; test BLEU at ``--max-updates``. Written to reports/st_length.{md,json} with a figure.

    python scripts/st_length.py --max-updates 1440 --eval-every 60

Why one long run per seed stands for every shorter length: ``inverse_sqrt`` (the pipeline's scheduler)
sets the lr of an update from its number alone, and the data order from (seed, epoch), so a run's first k
updates are those of a k-update run (dev evaluations run in eval mode and draw nothing from the training
RNG). What a shorter run adds at its end, the average of its last ``train_st.average_last`` snapshots, is
left out of the curve: the dev points are the running model's. The scheduler is checked.

How: a scratch copy of the repository (``--workdir``, default runs/st_length/<max-updates>/: lib/ and
stages/ copied, params.yaml with ``train_st.max_updates`` and ``train_st.eval_every`` changed, links to the
prepared data, and copies of runs/asr/<pair>/model.pt, runs/asr_local/<pair>/model.pt and
data/windows/<pair>/). The runs go ``parallel.jobs`` at a time, each resumable; finished runs are not
redone (scripts/asr_draws.py's markers). Cost: 30 ST runs of ``--max-updates`` updates.

``--extend-from K`` continues the finished runs of an earlier ``--max-updates K`` call instead of starting
over: each run's ``last.pt`` (update K) and live logs are copied and the copy is restamped with the longer
run's config fingerprint. By the same argument (the lr and the data order depend on the update alone), the
continued run is the longer run: the loop's resume is exact on the same host. Runs the earlier call lacks
start from scratch. Cost: 30 ST runs of ``--max-updates`` − K updates.

    python scripts/st_length.py --max-updates 2160 --eval-every 60 --extend-from 1080

``--systems baseline`` trains the baselines only, at half the cost, for the question of how long the
baseline's dev loss keeps falling (written to reports/st_length_baseline.*). Each report also fits the
baseline's mean dev NLL from 0.4 × the length on with ``floor + b · t^(−a)`` and says at which length its
last tenth would gain under 1 % (:func:`projected_flat_length`): an extrapolation, which a longer call
can check.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Sequence

import yaml

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import asr_draws  # noqa: E402
from lib.params import ParamError, load_params  # noqa: E402
from lib.stats import interval, paired_interval  # noqa: E402

SYSTEMS = ("baseline", "local")


def inputs(root: Path, pair: str) -> list[Path]:
    """What the ST stages read from the workspace's pipeline besides the prepared data."""
    return [root / "runs" / "asr" / pair / "model.pt", root / "runs" / "asr_local" / pair / "model.pt",
            root / "data" / "windows" / pair]


def prepare(folder: Path, params: dict, root: Path, pairs: Sequence[str], prepared: Path, prepared_dir: str) -> None:
    """The scratch repository (asr_draws.prepare_draw) plus the workspace's ASR models and windows."""
    asr_draws.prepare_draw(folder, params, prepared, prepared_dir)
    for pair in pairs:
        for src in inputs(root, pair):
            if not src.exists():
                raise FileNotFoundError(f"{src}: missing (run `make repro` in this checkout first)")
            dst = folder / src.relative_to(root)
            if dst.exists():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copyfile)(src, dst)


def extend(source: Path, folder: Path, system: str, pair: str, seed: int, max_updates: int, eval_every: int) -> bool:
    """Seed ``folder``'s run from ``source``'s finished shorter run (module docstring): copy its checkpoints
    and live logs, restamp ``last.pt`` with the longer config's fingerprint. False when there is nothing
    to extend (no finished run in ``source``) or the run in ``folder`` has already started."""
    from lib.layout import RunPaths
    from lib.train import checkpoint as ckpt

    src, dst = RunPaths(source, system, pair, seed), RunPaths(folder, system, pair, seed)
    last = src.checkpoints / "last.pt"
    if not (src.model.exists() and last.exists()) or (dst.checkpoints / "last.pt").exists() or dst.model.exists():
        return False
    state = ckpt.load(last)
    train = state["config"]["train"]
    if train["eval_every"] != eval_every:
        sys.exit(f"error: --extend-from: {last} was evaluated every {train['eval_every']} updates, not {eval_every}")
    if train["max_updates"] >= max_updates:
        sys.exit(f"error: --extend-from: {last} already ran {train['max_updates']} >= {max_updates} updates")
    train["max_updates"] = max_updates
    state["fingerprint"] = ckpt.fingerprint(state["config"])
    # the run's own state only: not a state set aside by a change of params, nor a move's temporaries
    shutil.copytree(src.checkpoints, dst.checkpoints, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("stale-*", ".*.tmp", "last.corrupt.pt"))
    if src.live.exists():
        shutil.copytree(src.live, dst.live, dirs_exist_ok=True)
    # the copied snapshots are the longer run's weights at those updates: stamped as its own, so that
    # its average accepts them (lib.train.checkpoint.average_state_dicts)
    for snap in sorted((dst.checkpoints / "snapshots").glob("update_*.pt")):
        s = ckpt.load(snap)
        if "fingerprint" in s:
            s["fingerprint"] = state["fingerprint"]
            ckpt.save(snap, s)
    ckpt.save(dst.checkpoints / "last.pt", state)
    return True


def curves(folder: Path, system: str, pair: str, seeds: Sequence[int]) -> dict[str, list[list[float]]]:
    """Per dev metric (nll, bleu) the per-seed values at the common evaluation steps: {"steps": [...], ...}."""
    from lib.layout import RunPaths

    out: dict = {}
    for metric in ("nll", "bleu"):
        per_seed = [dict(asr_draws.read_curve(RunPaths(folder, system, pair, s).curves / "dev" / f"{metric}.tsv", metric))
                    for s in seeds]
        steps = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
        out["steps"] = steps
        out[metric] = [[c[k] for k in steps] for c in per_seed]
    return out


def last_tenth_gain(steps: Sequence[int], values: Sequence[float], length: int) -> float | None:
    """How much a run of ``length`` updates improves its dev NLL over its last 10 %: (nll(0.9 L) − nll(L))
    / nll(0.9 L), with nll(0.9 L) at the latest evaluation at or before 0.9 L; None when either is absent."""
    by = dict(zip(steps, values))
    before = [s for s in steps if s <= 0.9 * length]
    if length not in by or not before:
        return None
    a = by[before[-1]]
    return (a - by[length]) / a


def summarize(folder: Path, pairs: Sequence[str], seeds: Sequence[int], systems: Sequence[str] = SYSTEMS) -> dict:
    """Per pair: the dev curve (per step, each system's interval over seeds and, with both systems, local −
    baseline paired by seed; the baseline's last-tenth gain), its power-law projection
    (:func:`projected_flat_length`) and the test BLEU at the end. With ``systems`` = (baseline,) only the
    baseline's columns."""
    from lib.layout import RunPaths

    both = "local" in systems
    out: dict = {}
    for pair in pairs:
        c = {system: curves(folder, system, pair, seeds) for system in systems}
        steps = [s for s in c["baseline"]["steps"] if not both or s in set(c["local"]["steps"])]
        mean_nll = [statistics.fmean(v[k] for v in c["baseline"]["nll"]) for k in range(len(c["baseline"]["steps"]))]
        rows = []
        for step in steps:
            i = c["baseline"]["steps"].index(step)
            row = {"step": step}
            for metric in ("nll", "bleu"):
                base = [v[i] for v in c["baseline"][metric]]
                row[metric] = {"baseline": interval(base).as_dict(4)}
                if both:
                    j = c["local"]["steps"].index(step)
                    local = [v[j] for v in c["local"][metric]]
                    row[metric].update(local=interval(local).as_dict(4),
                                       local_minus_baseline=paired_interval(local, base).as_dict(4))
            gain = last_tenth_gain(c["baseline"]["steps"], mean_nll, step)
            row["baseline_nll_last_tenth_gain"] = None if gain is None else round(gain, 4)
            rows.append(row)
        test = {system: [json.loads(RunPaths(folder, system, pair, s).metrics.read_text(encoding="utf-8"))["bleu"]
                         for s in seeds] for system in systems}
        test_bleu = {"baseline": interval(test["baseline"]).as_dict()}
        if both:
            test_bleu.update(local=interval(test["local"]).as_dict(),
                             local_minus_baseline=paired_interval(test["local"], test["baseline"]).as_dict())
        out[pair] = {"curve": rows, "test_bleu": test_bleu,
                     "projection": projected_flat_length(c["baseline"]["steps"], mean_nll),
                     "projection_check": projection_check(c["baseline"]["steps"], mean_nll),
                     "trend_gain": _round(trend_gain(c["baseline"]["steps"], mean_nll), 4)}
    return out


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def fit_power_law(steps: Sequence[int], values: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares fit of ``nll(t) = floor + b · t^(−a)`` (floor ≥ 0): for each floor on a grid below the
    smallest value, ``log(nll − floor)`` is linear in ``log t``; the floor with the smallest squared error in
    ``nll`` wins. Returns (floor, b, a)."""
    import numpy as np

    t, y = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    design = np.vstack([np.ones_like(t), np.log(t)]).T
    best: tuple[float, float, float, float] | None = None
    for floor in np.linspace(0.0, 0.995 * y.min(), 800):
        (log_b, slope), *_ = np.linalg.lstsq(design, np.log(y - floor), rcond=None)
        sse = float(((floor + np.exp(design @ [log_b, slope]) - y) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, float(floor), float(np.exp(log_b)), float(-slope))
    assert best is not None
    return best[1], best[2], best[3]


def projected_flat_length(steps: Sequence[int], values: Sequence[float], fit_from: float = 0.4,
                          horizon: int = 200_000) -> dict | None:
    """Where the baseline's mean dev NLL would flatten if it kept to the power law it follows: the fit
    (:func:`fit_power_law`) over the evaluations at or after ``fit_from`` × the last step (the early,
    steep part follows another curve), and the first length L (in steps of 60, up to ``horizon``) whose last
    10 % improve the fitted NLL by under 1 %: None there when the fitted floor is 0 (a pure power law: every
    tenth gains 1 − 0.9^a). An extrapolation, reported as one; None with fewer than 4 points."""
    pts = [(s, v) for s, v in zip(steps, values) if s >= fit_from * steps[-1]] if steps else []
    if len(pts) < 4:
        return None
    floor, b, a = fit_power_law([s for s, _ in pts], [v for _, v in pts])
    nll = lambda t: floor + b * t ** (-a)  # noqa: E731
    flat = next((length for length in range(60, horizon + 1, 60)
                 if (nll(0.9 * length) - nll(length)) / nll(0.9 * length) < 0.01), None)
    return {"fit_from": pts[0][0], "floor": round(floor, 4), "b": round(b, 4), "a": round(a, 3),
            "flat_at": flat, "last_tenth_gain_at_end": round((nll(0.9 * steps[-1]) - nll(steps[-1])) / nll(0.9 * steps[-1]), 4)}


def trend_gain(steps: Sequence[int], values: Sequence[float], span: float = 0.2) -> float | None:
    """The baseline's dev NLL gain per tenth of the run from a least-squares line through the evaluations of
    its last ``span`` (0.2: the last fifth): −slope · 0.1 L / nll(0.9 L) on that line. Less noisy than
    :func:`last_tenth_gain`, which reads two single evaluations (each moves by a percent or so between
    neighbouring evaluations). None with fewer than 3 points in the span."""
    import numpy as np

    if not steps:
        return None
    last = steps[-1]
    pts = [(s, v) for s, v in zip(steps, values) if s >= (1 - span) * last]
    if len(pts) < 3:
        return None
    t, y = np.array([s for s, _ in pts], dtype=float), np.array([v for _, v in pts], dtype=float)
    (intercept, slope), *_ = np.linalg.lstsq(np.vstack([np.ones_like(t), t]).T, y, rcond=None)
    return float(-slope * 0.1 * last / (intercept + slope * 0.9 * last))


def projection_check(steps: Sequence[int], values: Sequence[float]) -> dict | None:
    """How far the power law carries: fitted on the evaluations from 0.2 × to 0.5 × the last step alone
    (as :func:`projected_flat_length` fits a run half as long), its prediction of the last step's mean dev
    NLL against the measured one. None with fewer than 4 points in that span."""
    if not steps:
        return None
    last = steps[-1]
    pts = [(s, v) for s, v in zip(steps, values) if 0.2 * last <= s <= 0.5 * last]
    if len(pts) < 4:
        return None
    floor, b, a = fit_power_law([s for s, _ in pts], [v for _, v in pts])
    return {"fit_from": pts[0][0], "fit_to": pts[-1][0], "at": last, "predicted": round(floor + b * last ** (-a), 4),
            "measured": round(values[-1], 4)}


def _cell(d: dict, digits: int = 2) -> str:
    f = f"{{:+.{digits}f}}"
    return f.format(d["mean"]) + ("" if d["ci95_lo"] is None else f" [{f.format(d['ci95_lo'])}, {f.format(d['ci95_hi'])}]")


def markdown(result: dict) -> str:
    both = "local" in result.get("systems", SYSTEMS)
    who = "pair and system" if both else "pair (the baseline only)"
    lines = ["# local − baseline against the length of ST training\n",
             f"Command: `{result['command']}`. {len(result['seeds'])} seeds per {who}, on this checkout's "
             f"draw (its ASR models and Algorithm 1's windows); CPU: {result['cpu']} ({result['cores']} cores). "
             "Dev points are the running model's (no snapshot averaging); the intervals are 95 % t-intervals over "
             "seeds, paired by seed. Last column: how much the baseline's mean dev NLL falls over the last 10 % of "
             "a run that stops at that update (under 1 %: flat).\n"]
    for pair, r in result["pairs"].items():
        if both:
            lines += [f"\n## {pair}\n", "| update | baseline dev NLL | local − baseline dev NLL | baseline dev BLEU | "
                      "local − baseline dev BLEU | baseline NLL gain over the last 10 % |", "|---|---|---|---|---|---|"]
        else:
            lines += [f"\n## {pair}\n", "| update | baseline dev NLL | baseline dev BLEU | "
                      "baseline NLL gain over the last 10 % |", "|---|---|---|---|"]
        for row in r["curve"]:
            gain = row["baseline_nll_last_tenth_gain"]
            cells = [str(row["step"]), f"{row['nll']['baseline']['mean']:.4f}"]
            if both:
                cells.append(_cell(row["nll"]["local_minus_baseline"], 4))
            cells.append(f"{row['bleu']['baseline']['mean']:.2f}")
            if both:
                cells.append(_cell(row["bleu"]["local_minus_baseline"]))
            cells.append("–" if gain is None else f"{gain:.1%}")
            lines.append("| " + " | ".join(cells) + " |")
        t = r["test_bleu"]
        test = f"\nTest BLEU at {result['max_updates']} updates (average of the last snapshots, beam): baseline " \
               f"{t['baseline']['mean']:.2f}"
        if both:
            test += f", local {t['local']['mean']:.2f}, local − baseline {_cell(t['local_minus_baseline'])}"
        lines.append(test + ".")
        if r.get("trend_gain") is not None:
            lines.append(f"\nTrend over the last fifth (least squares through its evaluations): the baseline's mean dev "
                         f"NLL falls {r['trend_gain']:.1%} per tenth of the run (under 1 %: flat).")
        proj = r.get("projection")
        if proj:
            where = (f"its last 10 % would gain under 1 % from {proj['flat_at']} updates on" if proj["flat_at"]
                     else f"with no floor, every tenth of a run gains 1 − 0.9^a = {1 - 0.9 ** proj['a']:.1%}: "
                          "it never flattens by this measure")
            lines.append(f"\nPower-law fit of the baseline's mean dev NLL from update {proj['fit_from']} on "
                         f"(an extrapolation): NLL ≈ {proj['floor']:.4f} + {proj['b']:.4g} · t^−{proj['a']:.2f}; "
                         f"{where}.")
        check = r.get("projection_check")
        if check:
            lines.append(f"The same fit on updates {check['fit_from']}-{check['fit_to']} alone predicts "
                         f"{check['predicted']:.4f} at update {check['at']}; measured {check['measured']:.4f}.")
    if result.get("figure"):
        alt = "local − baseline against ST updates" if both else "the baseline's dev curves against ST updates"
        lines.append(f"\n![{alt}]({Path(result['figure']).name})\n")
    return "\n".join(lines) + "\n"


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(result["pairs"])
    fig, axes = plt.subplots(2, len(pairs), figsize=(4.2 * len(pairs), 6.4), squeeze=False)
    for col, pair in enumerate(pairs):
        rows = result["pairs"][pair]["curve"]
        steps = [r["step"] for r in rows]
        for ax, metric, label in ((axes[0][col], "nll", "dev NLL"), (axes[1][col], "bleu", "dev BLEU (greedy)")):
            for system, style in (("baseline", "k-"), ("local", "C1-")):
                if system in rows[0][metric]:
                    ax.plot(steps, [r[metric][system]["mean"] for r in rows], style, label=system)
            if metric == "nll":  # the late tail, where flatness is decided, is invisible on a linear axis
                ax.set_yscale("log")
            ax.set_title(f"{pair}: {label}", fontsize=9)
            ax.set_xlabel("ST updates")
            if col == 0:
                ax.legend(fontsize=7, loc="center right")
            if "local_minus_baseline" not in rows[0][metric]:
                continue
            twin = ax.twinx()
            d = [r[metric]["local_minus_baseline"] for r in rows]
            twin.plot(steps, [x["mean"] for x in d], "C2--", lw=1, label="local − baseline")
            lo = [x["ci95_lo"] if x["ci95_lo"] is not None else math.nan for x in d]
            hi = [x["ci95_hi"] if x["ci95_hi"] is not None else math.nan for x in d]
            twin.fill_between(steps, lo, hi, color="C2", alpha=0.15)
            twin.axhline(0, color="C2", lw=0.5)
            twin.set_ylabel("local − baseline (95 % CI)", color="C2", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")  # a complete figure or the old one, never half of one
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None, runner: asr_draws.Runner = asr_draws.subprocess_runner) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-updates", type=int, required=True)
    ap.add_argument("--eval-every", type=int, required=True)
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--source", type=Path, default=ROOT,
                    help="the workspace whose ASR models and windows the runs start from (default: this checkout)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "runs" / "st_length")
    ap.add_argument("--out", type=Path, help="output stem: .md, .json, .png (default: reports/st_length, "
                                             "reports/st_length_baseline with --systems baseline)")
    ap.add_argument("--jobs", type=int, help="runs side by side (default: parallel.jobs resolved)")
    ap.add_argument("--pairs", nargs="+", help="language pairs (default: the params' pairs)")
    ap.add_argument("--seeds", type=int, nargs="+", help="ST seeds (default: the params' seeds)")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                    help="systems to train (default: both; `baseline` alone traces how long the baseline's dev "
                         "loss keeps falling, at half the cost)")
    ap.add_argument("--extend-from", type=int, metavar="K",
                    help="continue the finished runs of an earlier --max-updates K call (module docstring)")
    args = ap.parse_args(argv)
    if args.eval_every < 1 or args.max_updates < args.eval_every:
        ap.error("need 1 <= --eval-every <= --max-updates")
    try:
        p = load_params(args.params)
    except ParamError as e:
        sys.exit(f"error: {e}")
    pairs = list(args.pairs or p.pairs)
    seeds = list(args.seeds or p.seeds)
    unknown = sorted(set(pairs) - set(p.pairs))
    if unknown:
        sys.exit(f"error: --pairs {' '.join(unknown)}: not in {args.params}'s pairs ({' '.join(p.pairs)})")
    if "baseline" not in args.systems:
        sys.exit("error: --systems: the baseline is always needed (the curve and the gain are the baseline's)")
    systems = [s for s in SYSTEMS if s in args.systems]
    default_out = ROOT / "reports" / ("st_length" if systems == list(SYSTEMS) else "st_length_baseline")
    out_given = args.out is not None and args.out.resolve() != default_out
    if args.out is None:
        args.out = default_out
    if len(seeds) < 2:
        sys.exit("error: --seeds: need at least 2 seeds for an interval over seeds")
    if p.train_st.lr_scheduler != "inverse_sqrt":
        sys.exit(f"error: train_st.lr_scheduler is {p.train_st.lr_scheduler!r}: a long run's first k updates are a "
                 "k-update run's only under inverse_sqrt (module docstring)")
    raw = yaml.safe_load(args.params.read_text(encoding="utf-8"))
    raw["train_st"].update(max_updates=args.max_updates, eval_every=args.eval_every)
    folder = args.workdir / str(args.max_updates)
    # checked before the scratch folder is made: a folder left by a call that stopped here would refuse
    # the next call's other --eval-every ("made with other params")
    if args.extend_from is not None:
        source = args.workdir / str(args.extend_from)
        if args.extend_from >= args.max_updates or not source.is_dir():
            sys.exit(f"error: --extend-from {args.extend_from}: need an earlier, shorter call's folder {source}")
    missing = [src for pair in pairs for src in inputs(args.source, pair) if not src.exists()]
    if missing:
        sys.exit(f"error: {missing[0]}: missing (run `make repro` in {args.source} first)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.workdir / ".gitignore").write_text("*\n", encoding="utf-8")
    try:
        prepare(folder, raw, args.source, pairs, args.source / p.data.prepared_dir, p.data.prepared_dir)
    except FileNotFoundError as e:
        sys.exit(f"error: {e}")
    if args.extend_from is not None:
        n = sum(extend(source, folder, system, pair, seed, args.max_updates, args.eval_every)
                for seed in seeds for pair in pairs for system in systems)
        print(f"extending {n} runs from {source}", flush=True)
    if args.jobs is None:
        from lib.parallel import resolve_jobs

        jobs = resolve_jobs(p.parallel.jobs)
    else:
        jobs = args.jobs
    steps = [asr_draws.Step(f"{system}@{pair}-{seed}", [f"stages/train_{system}.py", pair, str(seed)])
             for seed in seeds for pair in pairs for system in systems]
    asr_draws.run_steps(folder, steps, jobs, runner)
    cmd = f"python scripts/st_length.py --max-updates {args.max_updates} --eval-every {args.eval_every}"
    if args.pairs:
        cmd += " --pairs " + " ".join(pairs)
    if args.seeds:
        cmd += " --seeds " + " ".join(map(str, seeds))
    if systems != list(SYSTEMS):
        cmd += " --systems " + " ".join(systems)
    if args.extend_from is not None:
        cmd += f" --extend-from {args.extend_from}"
    if out_given:  # the command as given reproduces this very report
        out = args.out.resolve()
        cmd += f" --out {out.relative_to(ROOT) if out.is_relative_to(ROOT) else args.out}"
    result = {"command": cmd, "max_updates": args.max_updates, "eval_every": args.eval_every, "seeds": seeds,
              "systems": systems, "cpu": asr_draws.cpu_name(), "cores": asr_draws.os.cpu_count(),
              "pairs": summarize(folder, pairs, seeds, systems)}
    from lib.io import atomic_write_json, atomic_write_text

    fig = args.out.with_suffix(".png")
    figure(result, fig)
    result["figure"] = fig.name
    atomic_write_json(args.out.with_suffix(".json"), result)
    atomic_write_text(args.out.with_suffix(".md"), markdown(result))
    print(markdown(result), end="")
    return result


if __name__ == "__main__":
    main()
