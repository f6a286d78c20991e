"""The depth claim across ASR draws: train k draws of the default ASR model (``train_asr.seed`` = 1..k,
optionally at another ``train_asr.amp``), and on each run what the pipeline runs after it for the
analysed ST seed: the ST baseline of every pair, Algorithm 1 (select_windows), the attention health
of the ASR model and of the ST baseline, and the band test of every window configuration. Then one
table: per draw and pair the windows, Spearman's ρ of the windows with depth, C_ii, the ±2 band mass
and the band test, with the mean ± 95 % t-interval of ρ over the draws; written to reports/ as
Markdown and JSON.

    python scripts/asr_draws.py --draws 3                 # train_asr.seed = 1, 2, 3 at params.yaml's amp
    python scripts/asr_draws.py --draws 3 --amp none      # the same draws with the ASR model in fp32

How: each draw runs the pipeline's own stage scripts, in the order DVC would, in a scratch copy of the
repository (``--workdir``, default runs/draws/<amp>/seed<k>/: this checkout's lib/ and stages/ copied
when the draw starts, a params.yaml that differs from ``--params`` in ``train_asr.seed``, ``train_asr.amp``
when given, ``seeds`` = [analysis.st_seed] and ``controls.band_seeds`` = [analysis.st_seed], and a link to
the prepared data). So a draw is exactly what `dvc repro` computes for that seed (draw 1 at the default
amp is the default pipeline's model on the same machine), without DVC experiments: no git commits, no
queue, no workspace checkouts, and this checkout's outputs are never touched. The pairs' chains run
``parallel.jobs`` at a time, as under `make repro`. A step that finished is not run again (a marker in
the draw's folder; the training stages also resume from their checkpoints), so an interrupted command
continues where it stopped. The folder holds a ``.gitignore`` of ``*``.

Prerequisite: the prepared data (``dvc repro prepare``). Cost: one shared ASR training plus one ST
baseline per pair per draw (on a 2-core AMD EPYC with the demo params, about 17 min per draw with the ASR
model in bf16, 27 min in fp32); the table states the measured wall time of every draw and the CPU it ran on.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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

#: ``runner(argv, cwd)`` runs one stage script (argv[0] = stages/<name>.py) in the draw folder ``cwd``.
Runner = Callable[[list[str], Path], None]
CODE = ("lib", "stages")
DONE = ".done"


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


def draw_params(params: dict, seed: int, amp: str | None) -> dict:
    """The draw's params.yaml (see the module docstring): only the ASR seed (and amp) differ."""
    out = yaml.safe_load(yaml.safe_dump(params))  # a deep copy
    out["train_asr"]["seed"] = seed
    if amp is not None:
        out["train_asr"]["amp"] = amp
    st_seed = out["analysis"]["st_seed"]
    out["seeds"] = [st_seed]
    out.setdefault("controls", {}).update(systems=[], band_seeds=[st_seed])
    return out


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


def pair_steps(pair: str, st_seed: int) -> list[list[str]]:
    """The stages after the shared ASR model, for one pair, in DVC's order."""
    return [["stages/train_asr.py", pair],
            ["stages/train_baseline.py", pair, str(st_seed)],
            ["stages/select_windows.py", pair, "--no-progress"],
            ["stages/health.py", pair, "asr", "--no-progress"],
            ["stages/health.py", pair, "st", "--no-progress"],
            ["stages/band_test.py", pair, str(st_seed)]]


def run_draw(folder: Path, pairs: Sequence[str], st_seed: int, jobs: int, runner: Runner) -> dict[str, float]:
    """Every step of one draw (the shared ASR model first, then the pairs ``jobs`` at a time). Returns the
    draw's wall minutes (summed over the invocations that ran any of its steps, kept in the draw's folder)
    and the minutes of the shared ASR training step."""
    t0 = time.perf_counter()
    ran = _step(folder, ["stages/train_asr.py", "--shared"], runner)

    def chain(pair: str) -> bool:
        return any([_step(folder, argv, runner) for argv in pair_steps(pair, st_seed)])

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        ran = any([future.result() for future in [pool.submit(chain, pair) for pair in pairs]]) or ran
    wall_file = folder / DONE / "wall.json"
    wall = json.loads(wall_file.read_text(encoding="utf-8"))["seconds"] if wall_file.is_file() else 0.0
    if ran:
        wall += time.perf_counter() - t0
        wall_file.write_text(json.dumps({"seconds": round(wall, 1)}) + "\n", encoding="utf-8")
    asr = json.loads(_marker(folder, ["stages/train_asr.py", "--shared"]).read_text(encoding="utf-8"))["seconds"]
    return {"wall_minutes": round(wall / 60, 2), "asr_minutes": round(asr / 60, 2)}


def _read(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (the draw did not finish; rerun the command)")
    return json.loads(path.read_text(encoding="utf-8"))


def _windows(value) -> list[int]:
    return [int(w) for w in (value.split() if isinstance(value, str) else value)]


def collect_draw(folder: Path, pair: str, st_seed: int) -> dict:
    """One draw's figures for one pair, from the files its stages wrote."""
    st = _read(folder / "metrics" / "health" / pair / "st.json")
    asr = _read(folder / "metrics" / "health" / pair / "asr.json")
    band = _read(folder / "metrics" / "variants" / "band_test" / pair / f"seed{st_seed}.json")["rows"]
    wer = _read(folder / "metrics" / "asr" / f"{pair}.json").get("wer")
    bleu = _read(folder / "metrics" / "baseline" / pair / f"seed{st_seed}.json").get("bleu")
    s = st["summary"]
    return {"windows": _windows(st["algorithm1_windows"]), "rho": s.get("alg1_windows_rho"),
            "asr_windows": _windows(asr["algorithm1_windows"]), "asr_rho": asr["summary"].get("alg1_windows_rho"),
            "c_ii": s["c_ii_mean"], "band2": s["band2_mean"], "asr_wer": wer, "st_bleu": bleu,
            "acc_full": band["full"]["acc"], "acc_w1": band["w1"]["acc"],
            "gap": {name: band[name]["gap_recovered"] for name in ("alg1", "uniform", "shuffled")},
            "health_st": st}


def _ci_dict(values: Sequence[float]) -> dict:
    from lib.report.controls import mean_ci

    m, h = mean_ci(values)
    return {"mean": round(m, 4), "ci95": None if math.isnan(h) else round(h, 4), "n": len(values)}


def _fmt_ci(d: dict) -> str:
    return f"{d['mean']:+.2f}" + ("" if d["ci95"] is None else f" ± {d['ci95']:.2f}") + f" (n = {d['n']})"


def _pct(v) -> str:
    return "–" if v is None else f"{v:.0%}"


def summarize(draws: dict[int, dict], pairs: Sequence[str]) -> dict:
    """Per pair the mean ± 95 % CI of ρ over draws, and of the per-draw mean ρ over the pairs."""
    out = {"pairs": {}, "draw_mean": None}
    for pair in pairs:
        rhos = [d["pairs"][pair]["rho"] for d in draws.values() if d["pairs"][pair]["rho"] is not None]
        gaps = [d["pairs"][pair]["gap"]["alg1"] for d in draws.values() if d["pairs"][pair]["gap"]["alg1"] is not None]
        out["pairs"][pair] = {"rho": _ci_dict(rhos) if rhos else None, "alg1_gap": _ci_dict(gaps) if gaps else None}
    per_draw = [statistics.fmean(d["pairs"][p]["rho"] for p in pairs) for d in draws.values()
                if all(d["pairs"][p]["rho"] is not None for p in pairs)]
    if per_draw:
        out["draw_mean"] = _ci_dict(per_draw)
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def markdown(result: dict) -> str:
    pairs, draws, s = result["pairs"], result["draws"], result["summary"]
    lines = [f"# Algorithm 1 across ASR draws ({result['amp_label']})\n",
             f"Command: `{result['command']}`. Each draw trains the shared ASR model with `train_asr.seed` = the "
             f"draw, then for each pair the ST baseline of seed {result['st_seed']}, Algorithm 1 on it "
             "(select_windows), the attention health of both models and the band test (scripts/asr_draws.py). "
             f"CPU: {result['cpu']} ({result['cores']} cores).\n",
             "| draw | pair | ST Alg. 1 windows (layers k+1..L) | ρ with depth | ASR Alg. 1 windows | ASR ρ | "
             "ST C_ii | ±2 mass / uniform | ASR WER | ST BLEU | acc full / w=1 | gap recovered: Alg. 1 / "
             "uniform / shuffled | wall time |", "|" + "---|" * 13]
    for seed, d in draws.items():
        for pair in pairs:
            r = d["pairs"][pair]
            rho = "–" if r["rho"] is None else f"{r['rho']:+.2f}"
            arho = "–" if r["asr_rho"] is None else f"{r['asr_rho']:+.2f}"
            lines.append(f"| {seed} | {pair} | {' '.join(map(str, r['windows']))} | {rho} | "
                         f"{' '.join(map(str, r['asr_windows']))} | {arho} | {r['c_ii']:.3f} | {r['band2']:.2f} | "
                         f"{r['asr_wer']:.2f} | {r['st_bleu']:.2f} | {r['acc_full']:.1f} / {r['acc_w1']:.1f} | "
                         f"{_pct(r['gap']['alg1'])} / {_pct(r['gap']['uniform'])} / {_pct(r['gap']['shuffled'])} | "
                         f"{d['wall_minutes']:.1f} min |")
    lines.append("\nSpearman's ρ of the ST windows with depth, mean ± 95 % t-interval half-width over the draws:\n")
    for pair in pairs:
        rho = s["pairs"][pair]["rho"]
        lines.append(f"- {pair}: {'–' if rho is None else _fmt_ci(rho)}")
    if s["draw_mean"] is not None:
        lines.append(f"- the per-draw mean over the pairs: {_fmt_ci(s['draw_mean'])}")
    walls = ", ".join(f"{d['wall_minutes']:.1f} ({d['asr_minutes']:.1f})" for d in draws.values())
    lines.append(f"\nWall time per draw, in minutes (of which the shared ASR training): {walls}. Measured by this "
                 "command around the draw's stage scripts (an interrupted draw adds up its invocations).\n")
    for pair in pairs:
        lines.append(f"\n## {pair}: the ST windows per layer over the draws\n")
        lines.append(layer_markdown(summarize_draws({f"draw {seed}": d["pairs"][pair]["health_st"]
                                                     for seed, d in draws.items()})))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None, runner: Runner = subprocess_runner) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=3, help="how many draws (k >= 1)")
    ap.add_argument("--first", type=int, default=1, help="the first draw's train_asr.seed (then +1, +2, ...)")
    ap.add_argument("--amp", choices=["none", "auto", "bf16"], help="train_asr.amp of the draws (default: params')")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--prepared", type=Path, help="the prepared data (default: data.prepared_dir of this checkout)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "runs" / "draws")
    ap.add_argument("--out", type=Path, help="output stem (default reports/asr_draws[_amp-<amp>]): .md and .json")
    ap.add_argument("--jobs", type=int, help="pairs side by side (default: parallel.jobs resolved)")
    args = ap.parse_args(argv)
    if args.draws < 1:
        ap.error("--draws must be >= 1")
    try:
        p = load_params(args.params)  # validated, so a typo stops before any training
    except ParamError as e:
        sys.exit(f"error: {e}")
    raw = yaml.safe_load(args.params.read_text(encoding="utf-8"))
    prepared = args.prepared or (ROOT / p.data.prepared_dir)
    missing = [pair for pair in p.pairs if not (prepared / pair / "train.tsv").is_file()]
    if missing:
        sys.exit(f"error: {prepared}: no prepared data for {missing} (run `dvc repro prepare` first)")
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
    st_seed = p.analysis.st_seed
    draws: dict[int, dict] = {}
    for seed in range(args.first, args.first + args.draws):
        folder = args.workdir / tag / f"seed{seed}"
        prepare_draw(folder, draw_params(raw, seed, args.amp), prepared, p.data.prepared_dir)
        print(f"draw {seed}: {folder}", file=sys.stderr, flush=True)
        times = run_draw(folder, p.pairs, st_seed, jobs, runner)
        draws[seed] = {**times, "pairs": {pair: collect_draw(folder, pair, st_seed) for pair in p.pairs}}
    cmd = ["python", "scripts/asr_draws.py", "--draws", str(args.draws)]
    cmd += ["--first", str(args.first)] if args.first != 1 else []
    cmd += ["--amp", args.amp] if args.amp else []
    result = {"command": " ".join(cmd), "amp_label": amp_label, "st_seed": st_seed, "pairs": list(p.pairs),
              "cpu": cpu_name(), "cores": os.cpu_count(), "draws": draws, "summary": summarize(draws, p.pairs)}
    from lib.io import atomic_write_json, atomic_write_text

    md = markdown(result)
    public = {**result, "draws": {seed: {**d, "pairs": {pair: {k: v for k, v in r.items() if k != "health_st"}
                                                         for pair, r in d["pairs"].items()}}
                                  for seed, d in draws.items()}}
    atomic_write_json(out.with_suffix(".json"), public)
    atomic_write_text(out.with_suffix(".md"), md)
    print(md, end="")
    return result


if __name__ == "__main__":
    main()
