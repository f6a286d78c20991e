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
"""
from __future__ import annotations

import argparse
import json
import math
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
    shutil.copytree(src.checkpoints, dst.checkpoints, dirs_exist_ok=True)
    if src.live.exists():
        shutil.copytree(src.live, dst.live, dirs_exist_ok=True)
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


def summarize(folder: Path, pairs: Sequence[str], seeds: Sequence[int]) -> dict:
    from lib.layout import RunPaths

    out: dict = {}
    for pair in pairs:
        c = {system: curves(folder, system, pair, seeds) for system in SYSTEMS}
        steps = [s for s in c["baseline"]["steps"] if s in set(c["local"]["steps"])]
        rows = []
        for step in steps:
            i, j = c["baseline"]["steps"].index(step), c["local"]["steps"].index(step)
            row = {"step": step}
            for metric in ("nll", "bleu"):
                base = [v[i] for v in c["baseline"][metric]]
                local = [v[j] for v in c["local"][metric]]
                row[metric] = {"baseline": interval(base).as_dict(4), "local": interval(local).as_dict(4),
                               "local_minus_baseline": paired_interval(local, base).as_dict(4)}
            mean_nll = [statistics.fmean(v[k] for v in c["baseline"]["nll"]) for k in range(len(c["baseline"]["steps"]))]
            gain = last_tenth_gain(c["baseline"]["steps"], mean_nll, step)
            row["baseline_nll_last_tenth_gain"] = None if gain is None else round(gain, 4)
            rows.append(row)
        test = {system: [json.loads(RunPaths(folder, system, pair, s).metrics.read_text(encoding="utf-8"))["bleu"]
                         for s in seeds] for system in SYSTEMS}
        out[pair] = {"curve": rows, "test_bleu": {
            "baseline": interval(test["baseline"]).as_dict(), "local": interval(test["local"]).as_dict(),
            "local_minus_baseline": paired_interval(test["local"], test["baseline"]).as_dict()}}
    return out


def _cell(d: dict, digits: int = 2) -> str:
    f = f"{{:+.{digits}f}}"
    return f.format(d["mean"]) + ("" if d["ci95_lo"] is None else f" [{f.format(d['ci95_lo'])}, {f.format(d['ci95_hi'])}]")


def markdown(result: dict) -> str:
    lines = [f"# local − baseline against the length of ST training\n",
             f"Command: `{result['command']}`. {len(result['seeds'])} seeds per pair and system, on this checkout's "
             f"draw (its ASR models and Algorithm 1's windows); CPU: {result['cpu']} ({result['cores']} cores). "
             "Dev points are the running model's (no snapshot averaging); the intervals are 95 % t-intervals over "
             "seeds, paired by seed. Last column: how much the baseline's mean dev NLL falls over the last 10 % of "
             "a run that stops at that update (under 1 %: flat).\n"]
    for pair, r in result["pairs"].items():
        lines += [f"\n## {pair}\n", "| update | baseline dev NLL | local − baseline dev NLL | baseline dev BLEU | "
                  "local − baseline dev BLEU | baseline NLL gain over the last 10 % |", "|---|---|---|---|---|---|"]
        for row in r["curve"]:
            gain = row["baseline_nll_last_tenth_gain"]
            lines.append(f"| {row['step']} | {row['nll']['baseline']['mean']:.4f} | "
                         f"{_cell(row['nll']['local_minus_baseline'], 4)} | {row['bleu']['baseline']['mean']:.2f} | "
                         f"{_cell(row['bleu']['local_minus_baseline'])} | {'–' if gain is None else f'{gain:.1%}'} |")
        t = r["test_bleu"]
        lines.append(f"\nTest BLEU at {result['max_updates']} updates (average of the last snapshots, beam): baseline "
                     f"{t['baseline']['mean']:.2f}, local {t['local']['mean']:.2f}, local − baseline "
                     f"{_cell(t['local_minus_baseline'])}.")
    if result.get("figure"):
        lines.append(f"\n![local − baseline against ST updates]({Path(result['figure']).name})\n")
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
                ax.plot(steps, [r[metric][system]["mean"] for r in rows], style, label=system)
            twin = ax.twinx()
            d = [r[metric]["local_minus_baseline"] for r in rows]
            twin.plot(steps, [x["mean"] for x in d], "C2--", lw=1, label="local − baseline")
            lo = [x["ci95_lo"] if x["ci95_lo"] is not None else math.nan for x in d]
            hi = [x["ci95_hi"] if x["ci95_hi"] is not None else math.nan for x in d]
            twin.fill_between(steps, lo, hi, color="C2", alpha=0.15)
            twin.axhline(0, color="C2", lw=0.5)
            twin.set_ylabel("local − baseline (95 % CI)", color="C2", fontsize=8)
            ax.set_title(f"{pair}: {label}", fontsize=9)
            ax.set_xlabel("ST updates")
            if col == 0:
                ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None, runner: asr_draws.Runner = asr_draws.subprocess_runner) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-updates", type=int, required=True)
    ap.add_argument("--eval-every", type=int, required=True)
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--source", type=Path, default=ROOT,
                    help="the workspace whose ASR models and windows the runs start from (default: this checkout)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "runs" / "st_length")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "st_length", help="output stem: .md, .json, .png")
    ap.add_argument("--jobs", type=int, help="runs side by side (default: parallel.jobs resolved)")
    ap.add_argument("--pairs", nargs="+", help="language pairs (default: the params' pairs)")
    ap.add_argument("--seeds", type=int, nargs="+", help="ST seeds (default: the params' seeds)")
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
    if len(seeds) < 2:
        sys.exit("error: --seeds: need at least 2 seeds for an interval over seeds")
    if p.train_st.lr_scheduler != "inverse_sqrt":
        sys.exit(f"error: train_st.lr_scheduler is {p.train_st.lr_scheduler!r}: a long run's first k updates are a "
                 "k-update run's only under inverse_sqrt (module docstring)")
    raw = yaml.safe_load(args.params.read_text(encoding="utf-8"))
    raw["train_st"].update(max_updates=args.max_updates, eval_every=args.eval_every)
    folder = args.workdir / str(args.max_updates)
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.workdir / ".gitignore").write_text("*\n", encoding="utf-8")
    try:
        prepare(folder, raw, args.source, pairs, args.source / p.data.prepared_dir, p.data.prepared_dir)
    except FileNotFoundError as e:
        sys.exit(f"error: {e}")
    if args.extend_from is not None:
        source = args.workdir / str(args.extend_from)
        if args.extend_from >= args.max_updates or not source.is_dir():
            sys.exit(f"error: --extend-from {args.extend_from}: need an earlier, shorter call's folder {source}")
        n = sum(extend(source, folder, system, pair, seed, args.max_updates, args.eval_every)
                for seed in seeds for pair in pairs for system in SYSTEMS)
        print(f"extending {n} runs from {source}", flush=True)
    if args.jobs is None:
        from lib.parallel import resolve_jobs

        jobs = resolve_jobs(p.parallel.jobs)
    else:
        jobs = args.jobs
    steps = [asr_draws.Step(f"{system}@{pair}-{seed}", [f"stages/train_{system}.py", pair, str(seed)])
             for seed in seeds for pair in pairs for system in SYSTEMS]
    asr_draws.run_steps(folder, steps, jobs, runner)
    cmd = f"python scripts/st_length.py --max-updates {args.max_updates} --eval-every {args.eval_every}"
    if args.pairs:
        cmd += " --pairs " + " ".join(pairs)
    if args.seeds:
        cmd += " --seeds " + " ".join(map(str, seeds))
    if args.extend_from is not None:
        cmd += f" --extend-from {args.extend_from}"
    result = {"command": cmd, "max_updates": args.max_updates, "eval_every": args.eval_every, "seeds": seeds,
              "cpu": asr_draws.cpu_name(), "cores": asr_draws.os.cpu_count(),
              "pairs": summarize(folder, pairs, seeds)}
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
