"""The demo's answer across ASR draws: train k draws of the default (``train_asr.seed`` = 1..k, optionally at
another ``train_asr.amp``) and, in each, what the pipeline trains after the ASR model: the ST baseline of
every pair and seed, Algorithm 1 (select_windows), the attention health of the ASR model and of the ST
baseline, the band test, and the local system of every pair and seed (optionally also a control). Then one
table: per draw and pair the ASR model's dev-WER curve, the windows and their Spearman ρ with depth, and
local − baseline BLEU and dev NLL with their 95 % t-interval over seeds (paired by seed); over the draws, ρ
per draw (the mean over its pairs) with its interval over the draws, and per pair how many draws lose, gain or hold 0. Written to reports/ as
Markdown and JSON.

    python scripts/asr_draws.py --draws 3                      # ASR seeds 1-3, baseline and local, every seed
    python scripts/asr_draws.py --draws 3 --workspace-draw     # draw 1 is this checkout's finished `make repro`
    python scripts/asr_draws.py --draws 3 --control local_uniform      # also the uniform-window control
    python scripts/asr_draws.py --asr-seeds 1 3 --workspace-draw --seeds 1 2 3   # two draws, three ST seeds
    python scripts/asr_draws.py --draws 3 --systems baseline --seeds 1 # windows only: one baseline per pair
    python scripts/asr_draws.py --merge reports/asr_draws.json reports/asr_draws_4.json --out reports/asr_draws_all

How: each draw runs the pipeline's own stage scripts, in DVC's dependency order, in a scratch copy of the
repository (``--workdir``, default runs/draws/<amp>/seed<k>/: this checkout's lib/ and stages/ copied when
the draw starts, a params.yaml that differs from ``--params`` in ``train_asr.seed``, ``train_asr.amp`` when
given, ``seeds`` (``--seeds``, default the params'), the controls, and a link to the prepared data). So a
draw is what `dvc repro` computes for that ASR seed, without DVC experiments, and this checkout's outputs
are never touched. Independent steps run ``parallel.jobs`` at a time, as under `make repro`, so the thread
counts, and the numbers, are the pipeline's. A finished step is not run again (a marker in the draw's
folder; the training stages also resume from their checkpoints): an interrupted command continues where it
stopped. ``--workspace-draw`` reads the draw whose ASR seed is the params' from this checkout instead of
training it again (after `make repro` on the same params; the command checks the seeds and windows exist).

``--merge`` trains nothing: it joins the JSON of earlier runs of this command (the same pairs, ST seeds,
systems, analysed seed and ``train_asr.amp``; no draw twice) into one table, so that a draw trained later,
or on another day, adds to the draws already measured. The per-layer tables need each draw's per-layer
figures, which the JSON keeps (``health_st``: the windows and per layer ±2 mass, C_ii and the attention
output ratio); a file written before it kept them gives the draw tables and not the per-layer ones.

Prerequisite: the prepared data (``dvc repro prepare``). Cost: about one `make repro` per draw with
``--systems baseline local``; the table states every draw's wall time and the CPU it ran on.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
SCRIPTS = Path(__file__).resolve().parent
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from health_draws import markdown as layer_markdown  # noqa: E402
from health_draws import summarize_draws  # noqa: E402
from lib.params import ParamError, load_params  # noqa: E402
from lib.stats import Interval, interval, paired_interval  # noqa: E402

#: ``runner(argv, cwd)`` runs one stage script (argv[0] = stages/<name>.py) in the draw folder ``cwd``.
Runner = Callable[[list[str], Path], None]
CODE = ("lib", "stages")
DONE = ".done"
SYSTEMS = ("baseline", "local")
CONTROLS = ("local_uniform", "local_shuffled")


def subprocess_runner(argv: list[str], cwd: Path) -> None:
    """The stage script in its own Python process, as DVC runs it; output in ``cwd``/logs/."""
    logs = cwd / "logs"
    logs.mkdir(exist_ok=True)
    name = "_".join(Path(argv[0]).stem if i == 0 else a.lstrip("-") for i, a in enumerate(argv))
    with open(logs / f"{name}.log", "w", encoding="utf-8") as log:
        # absolute: with a relative PATH entry (PATH=.venv/bin:...) sys.executable is relative to this checkout
        proc = subprocess.run([os.path.abspath(sys.executable), *argv], cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}) in {cwd}; see {logs / (name + '.log')}")


def draw_params(params: dict, seed: int, amp: str | None, seeds: Sequence[int] | None = None,
                control: str | None = None) -> dict:
    """The draw's params.yaml (see the module docstring): the ASR seed (and amp), the ST seeds (default: the
    analysed seed only), the band test on the analysed seed, and the control (with its own ASR fork when the
    local system has one, as `local`'s rule is)."""
    out = yaml.safe_load(yaml.safe_dump(params))  # a deep copy
    out["train_asr"]["seed"] = seed
    if amp is not None:
        out["train_asr"]["amp"] = amp
    st_seed = out["analysis"]["st_seed"]
    out["seeds"] = list(seeds) if seeds else [st_seed]
    fork = out.get("local", {}).get("asr_pretraining") == "fork"
    out.setdefault("controls", {}).update(systems=[control] if control else [], band_seeds=[st_seed],
                                          asr_systems=[control] if control and fork else [])
    return out


def setting_digest(params: dict) -> str:
    """A draw's params.yaml (:func:`draw_params`) without its ASR seed, hashed: the same for every draw of
    one setting, so ``--merge`` can refuse draws trained with other params."""
    q = yaml.safe_load(yaml.safe_dump(params))
    q.get("train_asr", {}).pop("seed", None)
    return hashlib.sha256(json.dumps(q, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def prepare_draw(folder: Path, params: dict, prepared: Path, prepared_dir: str) -> None:
    """The draw's scratch repository: code copied (once), params.yaml written, the prepared data linked."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in CODE:
        if not (folder / name).is_dir():
            shutil.copytree(ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    text = yaml.safe_dump(params, sort_keys=False)
    if not (folder / "params.yaml").is_file() or (folder / "params.yaml").read_text(encoding="utf-8") != text:
        if (folder / DONE).is_dir():
            raise SystemExit(f"error: {folder}: made with other params; remove the folder to redo this draw")
        (folder / "params.yaml").write_text(text, encoding="utf-8")
    link = folder / prepared_dir
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(prepared.resolve(), target_is_directory=True)
    (folder / DONE).mkdir(exist_ok=True)


def _marker(folder: Path, argv: list[str]) -> Path:
    return folder / DONE / ("_".join(a.strip("-").replace("/", "_") for a in argv) + ".json")


def _step(folder: Path, argv: list[str], runner: Runner) -> bool:
    """Run one step unless its marker says it finished; the marker keeps its wall seconds. Whether it ran."""
    marker = _marker(folder, argv)
    if marker.is_file():
        return False
    t0 = time.perf_counter()
    runner(argv, folder)
    marker.write_text(json.dumps({"seconds": round(time.perf_counter() - t0, 1)}) + "\n", encoding="utf-8")
    return True


@dataclass
class Step:
    name: str
    argv: list[str]
    after: set[str] = field(default_factory=set)


def draw_steps(pairs: Sequence[str], seeds: Sequence[int], st_seed: int, systems: Sequence[str],
               control: str | None = None, control_fork: bool = False) -> list[Step]:
    """The stages after the prepared data, with what each waits for, in the order DVC's graph allows (the
    analysed seed's baseline first: Algorithm 1 waits for it)."""
    order = [st_seed] + [s for s in seeds if s != st_seed]
    steps = [Step("asr", ["stages/train_asr.py", "--shared"])]
    for pair in pairs:
        steps.append(Step(f"asr@{pair}", ["stages/train_asr.py", pair], {"asr"}))
        steps += [Step(f"baseline@{pair}-{s}", ["stages/train_baseline.py", pair, str(s)], {f"asr@{pair}"})
                  for s in order]
        steps += [Step(f"windows@{pair}", ["stages/select_windows.py", pair, "--no-progress"], {f"baseline@{pair}-{st_seed}"}),
                  Step(f"health_asr@{pair}", ["stages/health.py", pair, "asr", "--no-progress"], {f"asr@{pair}"}),
                  Step(f"health_st@{pair}", ["stages/health.py", pair, "st", "--no-progress"], {f"windows@{pair}"}),
                  Step(f"band@{pair}", ["stages/band_test.py", pair, str(st_seed)], {f"windows@{pair}"})]
    every_window = {f"windows@{pair}" for pair in pairs}
    if "local" in systems:
        steps.append(Step("asr_local", ["stages/train_asr_local.py", "--shared"], {"asr"} | every_window))
        for pair in pairs:
            steps.append(Step(f"asr_local@{pair}", ["stages/train_asr_local.py", pair],
                              {"asr_local", f"asr@{pair}", f"windows@{pair}"}))
            steps += [Step(f"local@{pair}-{s}", ["stages/train_local.py", pair, str(s)],
                           {f"asr_local@{pair}", f"windows@{pair}"}) for s in order]
    if control:
        if control_fork:
            steps.append(Step("asr_control", ["stages/train_asr_control.py", control], {"asr"} | every_window))
        for pair in pairs:
            start = {f"asr_local@{pair}"} | ({"asr_control"} if control_fork else set())
            steps += [Step(f"control@{pair}-{s}", ["stages/train_control.py", control, pair, str(s)],
                           start | {f"windows@{pair}"}) for s in order]
    return steps


def run_steps(folder: Path, steps: Sequence[Step], jobs: int, runner: Runner) -> bool:
    """Every step, ``jobs`` at a time, each as soon as the steps it waits for finished (the first ready in
    list order). Whether any step ran. A failing step stops the draw after the running ones finish."""
    names = {s.name for s in steps}
    missing = {dep for s in steps for dep in s.after} - names
    if missing:
        raise ValueError(f"steps wait for unknown steps {sorted(missing)}")
    done: set[str] = set()
    pending = list(steps)
    ran = False
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        running: dict = {}
        while pending or running:
            ready = [s for s in pending if s.after <= done]
            while ready and len(running) < max(1, jobs):
                step = ready.pop(0)
                pending.remove(step)
                running[pool.submit(_step, folder, step.argv, runner)] = step
            if not running:
                raise RuntimeError(f"{folder}: steps {[s.name for s in pending]} can never start")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                step = running.pop(future)
                ran = future.result() or ran  # re-raises the step's error
                done.add(step.name)
    return ran


def run_draw(folder: Path, steps: Sequence[Step], jobs: int, runner: Runner) -> dict[str, float]:
    """Every step of one draw; returns its wall minutes (summed over the invocations that ran any of its
    steps, kept in the draw's folder) and the minutes of the shared ASR training step."""
    t0 = time.perf_counter()
    ran = run_steps(folder, steps, jobs, runner)
    wall_file = folder / DONE / "wall.json"
    wall = json.loads(wall_file.read_text(encoding="utf-8"))["seconds"] if wall_file.is_file() else 0.0
    if ran:
        # rounded before it is both stored and reported, so a no-op rerun reports the same minutes
        wall = round(wall + time.perf_counter() - t0, 1)
        wall_file.write_text(json.dumps({"seconds": wall}) + "\n", encoding="utf-8")
    asr = json.loads(_marker(folder, ["stages/train_asr.py", "--shared"]).read_text(encoding="utf-8"))["seconds"]
    return {"wall_minutes": round(wall / 60, 2), "asr_minutes": round(asr / 60, 2)}


def workspace_draw_minutes(root: Path) -> dict[str, float | None]:
    """A draw read from a finished `make repro`: its wall time from reports/repro_timing.json when that
    file holds one (``python scripts/time_repro.py``), else None."""
    out: dict[str, float | None] = {"wall_minutes": None, "asr_minutes": None}
    path = root / "reports" / "repro_timing.json"
    if path.is_file():
        timing = json.loads(path.read_text(encoding="utf-8"))
        total = timing.get("total_seconds")
        asr = (timing.get("by_stage") or {}).get("train_asr_shared")
        out["wall_minutes"] = None if total is None else round(total / 60, 2)
        out["asr_minutes"] = None if asr is None else round(float(asr) / 60, 2)
    return out


def _read(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (the draw did not finish; rerun the command)")
    return json.loads(path.read_text(encoding="utf-8"))


def _windows(value) -> list[int]:
    return [int(w) for w in (value.split() if isinstance(value, str) else value)]


def read_curve(path: Path, column: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of a dvclive TSV (plots/train/<run>/dev/<column>.tsv); [] when absent."""
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return [(int(float(row["step"])), float(row[column])) for row in csv.DictReader(f, delimiter="\t")]


def asr_wer_curve(folder: Path, pair: str) -> list[tuple[int, float]]:
    """The dev-WER curve of the ASR model the pair's ST starts from (the shared model's under asr.mode: shared)."""
    shared = folder / "plots" / "train" / "asr_shared" / "dev" / "wer.tsv"
    return read_curve(shared if shared.is_file() else folder / "plots" / "train" / "asr" / pair / "dev" / "wer.tsv", "wer")


def _system_dir(system: str) -> tuple[str, str | None]:
    """(metrics folder, variant) of a system: baseline / local, or a control under variants/controls/."""
    return ("controls", system) if system in CONTROLS else (system, None)


def collect_draw(folder: Path, pair: str, st_seed: int, seeds: Sequence[int], systems: Sequence[str]) -> dict:
    """One draw's figures for one pair, from the files its stages wrote."""
    from lib.layout import RunPaths

    st = _read(folder / "metrics" / "health" / pair / "st.json")
    asr = _read(folder / "metrics" / "health" / pair / "asr.json")
    band_file = folder / "metrics" / "variants" / "band_test" / pair / f"seed{st_seed}.json"
    if band_file.is_file():
        band = _read(band_file)["rows"]
    else:  # a workspace draw: `make repro` runs the band test inside health_st, on Algorithm 1's windows only
        band = {"full": {"acc": st["summary"].get("acc_full")}, "w1": {"acc": st["summary"].get("acc_w1")},
                "alg1": {"gap_recovered": st["summary"].get("alg1_gap_recovered")},
                "uniform": {"gap_recovered": None}, "shuffled": {"gap_recovered": None}}
    wer = _read(folder / "metrics" / "asr" / f"{pair}.json").get("wer")
    runs: dict[str, dict] = {}
    for system in systems:
        kind, variant = _system_dir(system)
        bleu, chrf, nll = [], [], []
        for seed in seeds:
            paths = RunPaths(folder, kind, pair, seed, variant=variant)
            m = _read(paths.metrics)
            bleu.append(float(m["bleu"]))
            chrf.append(float(m["chrf"]))
            curve = read_curve(paths.curves / "dev" / "nll.tsv", "nll")
            nll.append(curve[-1][1] if curve else float("nan"))
        runs[system] = {"bleu": bleu, "chrf": chrf, "dev_nll": nll}
    s = st["summary"]
    return {"windows": _windows(st["algorithm1_windows"]), "rho": s.get("alg1_windows_rho"),
            "asr_windows": _windows(asr["algorithm1_windows"]), "asr_rho": asr["summary"].get("alg1_windows_rho"),
            "c_ii": s["c_ii_mean"], "band2": s["band2_mean"], "asr_wer": wer, "asr_dev_wer": asr_wer_curve(folder, pair),
            "acc_full": band["full"]["acc"], "acc_w1": band["w1"]["acc"],
            "gap": {name: band[name]["gap_recovered"] for name in ("alg1", "uniform", "shuffled")},
            "seeds": list(seeds), "runs": runs, "health_st": st}


#: the per-layer figures of a draw's ST health that the per-layer tables read (scripts/health_draws.py)
LAYER_KEYS = ("band2", "c_ii", "attn_ratio")


def compact_health(st: dict) -> dict:
    """The part of an ST health file that :func:`health_draws.summarize_draws` reads, kept in the JSON so that
    ``--merge`` can rebuild the per-layer tables without the draw's folder."""
    return {"algorithm1_windows": st["algorithm1_windows"],
            "layers": {k: {key: v[key] for key in LAYER_KEYS if key in v} for k, v in st["layers"].items()}}


def deltas(row: dict, system: str) -> dict[str, Interval] | None:
    """``system`` − baseline per seed of one draw × pair: BLEU and dev NLL intervals; None without both."""
    runs = row["runs"]
    if system not in runs or "baseline" not in runs:
        return None
    out = {"bleu": paired_interval(runs[system]["bleu"], runs["baseline"]["bleu"])}
    nll_a, nll_b = runs[system]["dev_nll"], runs["baseline"]["dev_nll"]
    if not any(v != v for v in nll_a + nll_b):  # NaN: a run without a dev curve
        out["dev_nll"] = paired_interval(nll_a, nll_b)
    return out


def _ci_dict(values: Sequence[float]) -> dict:
    ci = interval(values)
    return {"mean": round(ci.mean, 4), "ci95": round(ci.half, 4) if ci.defined else None, "n": ci.n}


def _fmt_ci(d: dict) -> str:
    return f"{d['mean']:+.2f}" + ("" if d["ci95"] is None else f" ± {d['ci95']:.2f}") + f" (n = {d['n']})"


def _acc(v) -> str:
    return "–" if v is None else f"{v:.1f}"


def _pct(v) -> str:
    return "–" if v is None else f"{v:.0%}"


def summarize(draws: dict[int, dict], pairs: Sequence[str], systems: Sequence[str] = ("baseline",)) -> dict:
    """Per pair the mean ± 95 % CI of ρ over draws; ρ pooled over the draws (the per-draw mean over the pairs,
    with its interval over the draws, and every draw × pair, a mean without an interval: a draw's pairs share
    its ASR model, so their profiles are not independent and the draw is the unit); the spread of the
    per-draw means; and per system beyond the baseline, per pair, how many draws lose (interval below 0),
    gain (above 0) or hold 0 against the baseline."""
    out: dict = {"pairs": {}, "draw_mean": None, "pooled": None, "draw_mean_range": None, "outcomes": {}}
    for pair in pairs:
        rhos = [d["pairs"][pair]["rho"] for d in draws.values() if d["pairs"][pair]["rho"] is not None]
        gaps = [d["pairs"][pair]["gap"]["alg1"] for d in draws.values() if d["pairs"][pair]["gap"]["alg1"] is not None]
        out["pairs"][pair] = {"rho": _ci_dict(rhos) if rhos else None, "alg1_gap": _ci_dict(gaps) if gaps else None}
    per_draw = [statistics.fmean(d["pairs"][p]["rho"] for p in pairs) for d in draws.values()
                if all(d["pairs"][p]["rho"] is not None for p in pairs)]
    if per_draw:
        out["draw_mean"] = _ci_dict(per_draw)
        out["draw_mean_range"] = round(max(per_draw) - min(per_draw), 4)
    every = [d["pairs"][p]["rho"] for d in draws.values() for p in pairs if d["pairs"][p]["rho"] is not None]
    if every:
        # no interval: the n profiles of one draw are near copies (one ASR model), not n independent draws
        out["pooled"] = {"mean": round(statistics.fmean(every), 4), "ci95": None, "n": len(every),
                         "positive": sum(r > 0 for r in every)}
    for system in systems:
        if system == "baseline":
            continue
        per_pair = {}
        for pair in pairs:
            signs = [ds["bleu"].sign() for d in draws.values() if (ds := deltas(d["pairs"][pair], system))]
            per_pair[pair] = {"lose": signs.count(-1), "gain": signs.count(1), "hold_0": signs.count(0)}
        out["outcomes"][system] = per_pair
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _curve_cell(curve: Sequence[Sequence[float]]) -> str:
    return " · ".join(f"{int(s)}: {v:g}" for s, v in curve) if curve else "–"


def _minutes(v) -> str:
    return "–" if v is None else f"{v:.1f}"


def pooled_line(pooled: dict) -> str:
    """The report's line for ρ over every draw × pair: a mean and a count, no interval (:func:`summarize`)."""
    return (f"- pooled over every draw × pair: {_fmt_ci(pooled)}; ρ > 0 on {pooled['positive']} of {pooled['n']}. "
            "No interval of its own: a draw's pairs share its ASR model, so the draw is the unit and the per-draw "
            "mean's interval above is the one over the draws")


def markdown(result: dict) -> str:
    pairs, draws, s, systems = result["pairs"], result["draws"], result["summary"], result["systems"]
    others = [x for x in systems if x != "baseline"]
    cpu = result["cpu"] + (f" ({result['cores']} cores)" if result.get("cores") else "")
    lines = [f"# The demo across ASR draws ({result['amp_label']})\n",
             f"Command: `{result['command']}`"
             + (" (trains nothing; it joins " + "; ".join(result["sources"]) + ")" if result.get("sources") else "")
             + ". Each draw trains the shared ASR model with `train_asr.seed` = the "
             f"draw, then the pipeline's stages after it: ST {', '.join(systems)} for seeds {result['seeds']} of "
             f"every pair, Algorithm 1 on the baseline of seed {result['st_seed']} (select_windows), the attention "
             "health of both models and the band test (scripts/asr_draws.py). "
             f"CPU: {cpu}.\n",
             "## Windows and the ASR model\n",
             "| draw | pair | ST Alg. 1 windows (layers k+1..L) | ρ with depth | ASR Alg. 1 windows | ASR ρ | "
             "ST C_ii | ±2 mass / uniform | ASR WER | acc full / w=1 | gap recovered: Alg. 1 / "
             "uniform / shuffled |", "|" + "---|" * 11]
    for seed, d in draws.items():
        for pair in pairs:
            r = d["pairs"][pair]
            rho = "–" if r["rho"] is None else f"{r['rho']:+.2f}"
            arho = "–" if r["asr_rho"] is None else f"{r['asr_rho']:+.2f}"
            lines.append(f"| {seed} | {pair} | {' '.join(map(str, r['windows']))} | {rho} | "
                         f"{' '.join(map(str, r['asr_windows']))} | {arho} | {r['c_ii']:.3f} | {r['band2']:.2f} | "
                         f"{r['asr_wer']:.2f} | {_acc(r['acc_full'])} / {_acc(r['acc_w1'])} | "
                         f"{_pct(r['gap']['alg1'])} / {_pct(r['gap']['uniform'])} / {_pct(r['gap']['shuffled'])} |")
    lines.append("\n**The ASR model's dev WER (%) on the way** (greedy, every `train_asr.eval_every` updates):\n")
    lines += ["| draw | dev WER by update |", "|---|---|"]
    for seed, d in draws.items():
        lines.append(f"| {seed} | {_curve_cell(d['pairs'][pairs[0]]['asr_dev_wer'])} |")
    lines.append("\nSpearman's ρ of the ST windows with depth, mean ± 95 % t-interval half-width over the draws:\n")
    for pair in pairs:
        rho = s["pairs"][pair]["rho"]
        lines.append(f"- {pair}: {'–' if rho is None else _fmt_ci(rho)}")
    if s["draw_mean"] is not None:
        lines.append(f"- the per-draw mean over the pairs: {_fmt_ci(s['draw_mean'])}; range of the per-draw means "
                     f"{s['draw_mean_range']:.2f}")
    if s.get("pooled") is not None:
        pooled = s["pooled"]
        lines.append(pooled_line(pooled))
    for system in others:
        lines.append(f"\n## {system} − baseline per draw and pair\n")
        lines.append("Mean over seeds of the per-seed difference, with its 95 % t-interval over seeds (paired by "
                     "seed); dev NLL: teacher-forced, per target token, at the end of training (lower is better).\n")
        lines += [f"| draw | pair | baseline BLEU | {system} BLEU | Δ BLEU [95 % CI over seeds] | "
                  "Δ dev NLL [95 % CI] | per seed Δ BLEU |", "|---|---|---|---|---|---|---|"]
        for seed, d in draws.items():
            for pair in pairs:
                r = d["pairs"][pair]
                ds = deltas(r, system)
                if ds is None:
                    continue
                b, x = r["runs"]["baseline"]["bleu"], r["runs"][system]["bleu"]
                per = " ".join(f"{xi - bi:+.2f}" for xi, bi in zip(x, b))
                nll = ds["dev_nll"].cell(3) if "dev_nll" in ds else "–"
                lines.append(f"| {seed} | {pair} | {statistics.fmean(b):.2f} | {statistics.fmean(x):.2f} | "
                             f"{ds['bleu'].cell()} | {nll} | {per} |")
        counts = s["outcomes"].get(system, {})
        if counts:
            lines.append("\nDraws whose interval lies below 0 (lose), above 0 (gain) or holds 0: " + "; ".join(
                f"{pair} {c['lose']} / {c['gain']} / {c['hold_0']}" for pair, c in counts.items()) + ".")
    walls = ", ".join(f"{_minutes(d['wall_minutes'])} ({_minutes(d['asr_minutes'])})" for d in draws.values())
    lines.append(f"\nWall time per draw, in minutes (of which the shared ASR training): {walls}. Measured by this "
                 "command around the draw's stage scripts (an interrupted draw adds up its invocations; a draw "
                 "read from the workspace gives `make repro`'s time when reports/repro_timing.json holds it).\n")
    lacking = [str(seed) for seed, d in draws.items() if not all(d["pairs"][p].get("health_st") for p in pairs)]
    if lacking:
        lines.append("No per-layer tables: " + (f"draws {', '.join(lacking)} come" if len(lacking) > 1 else
                                                  f"draw {lacking[0]} comes") + " from a "
                     "file written before this command kept each draw's per-layer figures (see that file's report).")
        return "\n".join(lines) + "\n"
    for pair in pairs:
        lines.append(f"\n## {pair}: the ST windows per layer over the draws\n")
        lines.append(layer_markdown(summarize_draws({f"draw {seed}": d["pairs"][pair]["health_st"]
                                                     for seed, d in draws.items()})))
    return "\n".join(lines) + "\n"


#: what every merged file must agree on (a draw table over other seeds or systems would compare unlike things)
MERGE_KEYS = ("pairs", "seeds", "systems", "st_seed", "amp_label")


def _cpus(r: dict) -> list[str]:
    """The CPUs of one result, each as "name (n cores)": a merged result over several CPUs joins its
    sources' in ``cpu`` (``cores`` None); any other result names one CPU and its core count."""
    if r.get("cores") is None and " / " in str(r["cpu"]):
        return str(r["cpu"]).split(" / ")
    return [str(r["cpu"]) + (f" ({r['cores']} cores)" if r.get("cores") else "")]


def _split_cpu(label: str) -> tuple[str, int | None]:
    """"name (n cores)" -> (name, n); a label without the count -> (label, None)."""
    m = re.fullmatch(r"(.*) \((\d+) cores\)", label)
    return (m.group(1), int(m.group(2))) if m else (label, None)


def shown_path(path: Path | str) -> str:
    """A path as a recorded command line gives it: relative to the repository when inside it."""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def merge_results(paths: Sequence[Path], out: Path | None = None) -> dict:
    """Earlier results of this command (their JSON) as one result: the draws in file order, the summary
    recomputed over all of them. A file that is not such a result, disagrees with the first on
    :data:`MERGE_KEYS` or on the params (``setting``, :func:`setting_digest`: a file written before results
    kept it is not checked), or repeats a draw stops with a message naming it. A merged result merges again:
    its sources and CPUs are carried over, not nested. ``out``: the stem given to ``--out``, recorded in
    the command line (without it the command would refuse to run)."""
    result: dict | None = None
    draws: dict[int, dict] = {}
    sources, cpus = [], []
    setting: tuple[str, Path] | None = None  # the first digest found, and its file
    for path in paths:
        try:
            r = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: --merge {path}: cannot read it as JSON ({e})") from None
        missing = [k for k in (*MERGE_KEYS, "draws", "command", "cpu", "cores") if not isinstance(r, dict) or k not in r]
        if missing:
            raise SystemExit(f"error: --merge {path}: not a result of scripts/asr_draws.py (no {', '.join(missing)})")
        if result is None:
            result = r
        for key in MERGE_KEYS:
            if r[key] != result[key]:
                raise SystemExit(f"error: --merge {path}: {key} is {r[key]!r}, {paths[0]} has {result[key]!r}; "
                                 f"only draws of the same setting compare")
        if r.get("setting"):
            if setting is None:
                setting = (r["setting"], path)
            elif r["setting"] != setting[0]:
                raise SystemExit(f"error: --merge {path}: trained with other params than {setting[1]} (setting "
                                 f"{r['setting']} against {setting[0]}: the params without the ASR seed); only "
                                 f"draws of the same setting compare")
        for seed, d in r["draws"].items():
            try:
                key = int(seed)
            except ValueError:
                raise SystemExit(f"error: --merge {path}: draw {seed!r} is not an ASR seed") from None
            if key in draws:
                raise SystemExit(f"error: --merge {path}: draw {seed} is also in an earlier file")
            draws[key] = d
        if r.get("sources"):  # a merged result: its own sources, not the merge command
            sources += r["sources"]
        else:
            sources.append(f"`{r['command']}` ({r['cpu']}, {r['cores']} cores)")
        cpus += _cpus(r)
    assert result is not None
    cpu = sorted(set(cpus))
    command = "python scripts/asr_draws.py --merge " + " ".join(map(str, paths))
    return {**{k: result[k] for k in MERGE_KEYS},
            "command": command + (f" --out {shown_path(out)}" if out is not None else ""), "sources": sources,
            "setting": setting[0] if setting else None,
            "cpu": _split_cpu(cpu[0])[0] if len(cpu) == 1 else " / ".join(cpu),
            "cores": _split_cpu(cpu[0])[1] if len(cpu) == 1 else None,
            "draws": draws, "summary": summarize(draws, result["pairs"], result["systems"])}


def write_result(result: dict, out: Path) -> str:
    """The result's Markdown and JSON at ``out`` (.md, .json), each written whole; returns the Markdown."""
    from lib.io import atomic_write_json, atomic_write_text

    md = markdown(result)
    public = {**result, "draws": {seed: {**d, "pairs": {pair: {**r, "health_st": compact_health(r["health_st"])}
                                                         if r.get("health_st") else r
                                                         for pair, r in d["pairs"].items()}}
                                  for seed, d in result["draws"].items()}}
    atomic_write_json(out.with_suffix(".json"), public)
    atomic_write_text(out.with_suffix(".md"), md)
    return md


def main(argv: Sequence[str] | None = None, runner: Runner = subprocess_runner) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=3, help="how many draws (k >= 1)")
    ap.add_argument("--first", type=int, default=1, help="the first draw's train_asr.seed (then +1, +2, ...)")
    ap.add_argument("--asr-seeds", type=int, nargs="+",
                    help="the draws' train_asr.seed values, any set (instead of --draws and --first)")
    ap.add_argument("--amp", choices=["none", "auto", "bf16"], help="train_asr.amp of the draws (default: params')")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                    help="ST systems per draw (default: baseline local)")
    ap.add_argument("--control", choices=CONTROLS, help="also retrain this control for Algorithm 1 in every draw")
    ap.add_argument("--seeds", type=int, nargs="+", help="ST seeds per draw (default: the params' seeds)")
    ap.add_argument("--workspace-draw", action="store_true",
                    help="read the draw whose ASR seed is the params' from this checkout (a finished `make repro`)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--prepared", type=Path, help="the prepared data (default: data.prepared_dir of this checkout)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "runs" / "draws")
    ap.add_argument("--out", type=Path, help="output stem (default reports/asr_draws[_amp-<amp>]): .md and .json")
    ap.add_argument("--jobs", type=int, help="steps side by side (default: parallel.jobs resolved)")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                    help="train nothing: join these earlier results (their .json) into one table at --out")
    args = ap.parse_args(argv)
    if args.merge:
        if args.out is None:
            ap.error("--merge needs --out (the merged table's stem; the inputs are left as they are)")
        if args.out.with_suffix(".json").resolve() in {Path(m).resolve() for m in args.merge}:
            ap.error("--out: would overwrite one of the --merge inputs; give another stem")
        result = merge_results(args.merge, args.out)
        md = write_result(result, args.out)
        print(md, end="")
        return result
    if args.draws < 1:
        ap.error("--draws must be >= 1")
    if args.asr_seeds is not None and len(set(args.asr_seeds)) != len(args.asr_seeds):
        ap.error("--asr-seeds: a seed given twice")
    asr_seeds = list(args.asr_seeds or range(args.first, args.first + args.draws))
    if "baseline" not in args.systems:
        ap.error("--systems must include baseline (Algorithm 1 analyses it)")
    if args.control and "local" not in args.systems:
        ap.error("--control needs the local system (a control starts from local's ASR model and is compared with it)")
    try:
        p = load_params(args.params)  # validated, so a typo stops before any training
    except ParamError as e:
        sys.exit(f"error: {e}")
    raw = yaml.safe_load(args.params.read_text(encoding="utf-8"))
    prepared = args.prepared or (ROOT / p.data.prepared_dir)
    missing = [pair for pair in p.pairs if not (prepared / pair / "train.tsv").is_file()]
    if missing:
        sys.exit(f"error: {prepared}: no prepared data for {missing} (run `dvc repro prepare` first)")
    st_seed = p.analysis.st_seed
    seeds = args.seeds or list(p.seeds)
    if st_seed not in seeds:
        sys.exit(f"error: --seeds {seeds} must include analysis.st_seed = {st_seed} (Algorithm 1 analyses it)")
    systems = list(args.systems) + ([args.control] if args.control else [])
    amp_label = f"train_asr.amp: {args.amp}" if args.amp else f"train_asr.amp: {p.train_asr.amp}, as in the params"
    tag = f"amp-{args.amp}" if args.amp else "params"
    out = args.out or ROOT / "reports" / ("asr_draws" + (f"_amp-{args.amp}" if args.amp else ""))
    if args.jobs is None:
        from lib.parallel import resolve_jobs

        jobs = resolve_jobs(p.parallel.jobs)
    else:
        jobs = args.jobs
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.workdir / ".gitignore").write_text("*\n", encoding="utf-8")
    steps = draw_steps(p.pairs, seeds, st_seed, args.systems, args.control,
                       control_fork=p.local.asr_pretraining == "fork")
    draws: dict[int, dict] = {}
    workspace_seed = (p.train_asr.seed if args.workspace_draw and (args.amp is None or args.amp == p.train_asr.amp)
                      else None)
    if workspace_seed in asr_seeds:  # checked before any draw trains: a missing file would stop it after hours
        if args.control:
            sys.exit("error: --workspace-draw reads no control from the workspace; drop --control or the option")
        try:
            for pair in p.pairs:
                collect_draw(ROOT, pair, st_seed, seeds, systems)
        except FileNotFoundError as e:
            sys.exit(f"error: --workspace-draw: {e} (this checkout's `make repro` has not run or not finished)")
    for seed in asr_seeds:
        if seed == workspace_seed:
            folder, times = ROOT, workspace_draw_minutes(ROOT)
            print(f"draw {seed}: this checkout's `make repro`", file=sys.stderr, flush=True)
        else:
            folder = args.workdir / tag / f"seed{seed}"
            prepare_draw(folder, draw_params(raw, seed, args.amp, seeds, args.control), prepared, p.data.prepared_dir)
            print(f"draw {seed}: {folder}", file=sys.stderr, flush=True)
            times = run_draw(folder, steps, jobs, runner)
        try:
            draws[seed] = {**times, "pairs": {pair: collect_draw(folder, pair, st_seed, seeds, systems)
                                              for pair in p.pairs}}
        except FileNotFoundError as e:
            sys.exit(f"error: draw {seed}: {e}")
    if args.asr_seeds:
        cmd = ["python", "scripts/asr_draws.py", "--asr-seeds", *map(str, asr_seeds)]
    else:
        cmd = ["python", "scripts/asr_draws.py", "--draws", str(args.draws)]
        cmd += ["--first", str(args.first)] if args.first != 1 else []
    cmd += ["--amp", args.amp] if args.amp else []
    cmd += ["--systems", *args.systems] if list(args.systems) != list(SYSTEMS) else []
    cmd += ["--control", args.control] if args.control else []
    cmd += ["--seeds", *map(str, args.seeds)] if args.seeds else []
    cmd += ["--workspace-draw"] if args.workspace_draw else []
    cmd += ["--out", shown_path(args.out)] if args.out else []  # run as recorded, it rewrites this table only
    result = {"command": " ".join(cmd), "amp_label": amp_label, "st_seed": st_seed, "seeds": seeds,
              "systems": systems, "pairs": list(p.pairs), "cpu": cpu_name(), "cores": os.cpu_count(),
              "setting": setting_digest(draw_params(raw, 0, args.amp, seeds, args.control)),
              "draws": draws, "summary": summarize(draws, p.pairs, systems)}
    md = write_result(result, out)
    print(md, end="")
    return result


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the running steps got the Ctrl-C too and stop cleanly
        sys.exit("interrupted: finished steps are kept and the training steps resume from their checkpoints; "
                 "the same command continues")
