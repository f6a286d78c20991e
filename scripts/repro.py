"""`dvc repro` with independent stages side by side (`make repro` runs this).

DVC runs one stage at a time, and one demo training run does not keep two CPU cores busy
(lib/parallel.py). This script reads DVC's own stage graph, asks DVC which stages changed, and runs
those and everything downstream of them as `dvc --wait-for-lock repro --single-item <stage>`, at
most ``-j`` at a time, each stage only once every stage it depends on has finished. DVC releases
its repository lock while a stage's command runs and takes it again to record the result, so the
stages run side by side and `dvc.lock`, the cache and the run-cache stay exactly as a plain
`dvc repro` leaves them (it is DVC that decides, per stage, whether to run, restore from the
run-cache or skip).

    python scripts/repro.py                     # the whole pipeline, parallel.jobs at a time
    python scripts/repro.py -j 1                # one at a time, output streamed (like `dvc repro`)
    python scripts/repro.py -f train_baseline   # forced: that stage (matrix) and what it depends on
    python scripts/repro.py --dry               # what would run, in which order
    python scripts/repro.py --replay reports/repro_timing.json   # these rules on a recorded run's durations
    python scripts/repro.py -j 8 --estimate train_baseline=1.41 --estimate train_local=1.41   # a planned run

With more than one job each stage's output goes to `.dvc/tmp/repro/<stage>.log` and the terminal
gets one line per stage start and end, and a status line with each running stage's progress: the
count, rate and ETA of the newest tqdm bar in its log (scripts/_progress.py), or how long it has
run; redrawn in place every second on a terminal, a plain line every 60 s otherwise
(`--status-every`). With one job DVC's own output, bars included, reaches the terminal as it is.
A failing stage prints its log's tail, nothing new starts, the running ones finish, and the exit
status is 1. Ctrl-C stops every running stage (a training stage resumes from its last checkpoint
on the next run); SIGTERM (a scheduler's pre-emption) reaches every running stage as SIGTERM, on
which training saves its state after the update it is in; a second Ctrl-C or SIGTERM kills them.
After a run of the whole pipeline (or one that ran the report), or when it is
up to date, it prints where the report is and, per pair, BLEU baseline vs local and Algorithm 1's
windows in the local layers (metrics/summary.json, metrics/windows/; nothing when they do not
exist). `--timing FILE` writes every stage's start and end (seconds from the start) and the wall
time per stage group (`scripts/time_repro.py`), with repository-relative paths in its recorded
command.

Only stages that list `parallel` among their params (per-pair and per-seed stages, which train and
analyse with cores // jobs threads, the shared fork, and the one-thread stages of seconds,
prepare_multi and corpus_stats) run beside each other; every other stage runs alone, with the
whole machine: the shared ASR model (every core, and its `amp: auto` probe must time steps on a
quiet machine), the corpus and prepare worker pools, the report. Which stages come first among the
ready ones: those with the most stages downstream (seed 1's baselines, whose analysis leads to every
local run), then dvc.yaml order; the first that cannot start yet holds back the ones behind it,
unless nothing is downstream of it: a stage that runs alone and that no other stage waits for
lets the stages that share the machine pass it, so they fill a core that the last training run
would leave idle (80 s at the end of a default run when prepare_multi and corpus_stats still ran
alone; they share the machine since).

With `data.mustc_root` on a real MuST-C copy nothing reads the demo corpus, so the whole pipeline
leaves its `corpus` stages out, and the copy's folders are checked for every pair whose `prepare` is
to run before DVC starts anything (lib.data.corpora.check_corpus): DVC would stop such a stage on its
missing dependency with "No such file or directory", naming neither the param nor what to set.

`--estimate GROUP=HOURS` runs nothing either: it schedules the whole pipeline by the same rules with
every stage of those groups taking those hours and the rest none, for the cost of a run not yet made
(the paper profile's on GPUs, docs/gpu.md).

`--replay TIMING` runs nothing: it schedules the whole pipeline by these rules with the stage
durations a `--timing` file recorded (:func:`simulate`), so a change of the rules, or of which
stages share the machine, is measured on the same durations, free of this host's run-to-run noise
(it replayed a recorded run of the whole pipeline to within 0.3 % of its wall time under that run's
rules).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _progress import StatusLine, status_text, summary_lines

CODE = Path(__file__).resolve().parent.parent  # this repository's lib/ (the DVC project is the working directory)
LOG_DIR = Path(".dvc") / "tmp" / "repro"


@dataclass
class Plan:
    """The stages to run (DVC addressing, e.g. ``train_baseline@en-de-1``) in a valid order, and for
    each the stages among them it waits for."""

    order: list[str]
    needs: dict[str, set[str]]
    downstream: dict[str, int] = field(default_factory=dict)  # how many planned stages depend on it
    # stages that list `parallel` among their params share the machine (cores // jobs threads each);
    # every other stage runs alone: it uses every core (the shared ASR model, the corpus and
    # prepare worker pools) or is short, and a probe or a 2-thread run beside another is distorted
    shares: set[str] = field(default_factory=set)
    # pairs whose `prepare` reads a corpus that no stage writes (data.mustc_root on a real copy): their
    # layout is checked before DVC runs (:func:`corpus_problem`)
    corpus_checks: list[str] = field(default_factory=list)


def plan(root: Path, targets: list[str], force: bool) -> Plan:
    """Ask DVC for the graph and (unless ``force``) what changed: the changed stages among
    ``targets`` and their upstream (all stages without targets), plus everything downstream of
    them within that scope. Reading the graph takes DVC's lock briefly; it is released on return."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph  # edge (stage, upstream stage)
        by_name = {s.addressing: s for s in graph.nodes}
        if targets:
            chosen = set()
            for t in targets:
                for stage in repo.stage.collect(t):
                    chosen |= {stage} | nx.descendants(graph, stage)
        else:
            # the demo corpus only where a stage reads it: with data.mustc_root on a real copy none does
            chosen = {s for s in graph.nodes if s.addressing.split("@")[0] != "corpus" or nx.ancestors(graph, s)}
        scope = graph.subgraph(chosen)
        if force:
            start = set(scope.nodes)
        else:
            changed = repo.status(targets=targets or None)
            start = {by_name[name] for name in changed if name in by_name and by_name[name] in chosen}
        run = set(start)
        for stage in start:
            run |= nx.ancestors(scope, stage)  # ancestors of the reversed edges: everything downstream
        sub = scope.subgraph(run)
        rank = {s: i for i, s in enumerate(repo.index.stages)}
        order = [s.addressing for s in nx.lexicographical_topological_sort(sub.reverse(copy=True),
                                                                            key=lambda s: rank.get(s, 0))]
        needs = {s.addressing: {u.addressing for u in sub.successors(s)} for s in sub.nodes}
        downstream = {s.addressing: len(nx.ancestors(sub, s)) for s in sub.nodes}
        shares = {s.addressing for s in sub.nodes if "parallel" in _param_keys(s)}
        corpus_checks = sorted(s.addressing.split("@", 1)[1] for s in sub.nodes
                               if s.addressing.split("@")[0] == "prepare" and "@" in s.addressing
                               and not any(u.addressing.split("@")[0] == "corpus" for u in graph.successors(s)))
    return Plan(order=order, needs=needs, downstream=downstream, shares=shares, corpus_checks=corpus_checks)


def corpus_problem(root: Path, pairs: list[str]) -> str | None:
    """One line for the first of ``pairs`` whose corpus at data.mustc_root would stop `prepare`
    (lib.data.corpora.check_corpus: a pair's own folder given as the root, a release still packed or
    one folder down, a missing pair or split); None when their folders are there. DVC would stop
    such a stage before it runs, on the missing dependency ``<root>/<pair>``, with a message that names
    neither the param nor what to set."""
    if not pairs:
        return None
    from lib.data.corpora import check_corpus
    from lib.data.reader import CorpusError
    from lib.params import load_params

    params = load_params(root / "params.yaml")
    corpus = Path(params.data.mustc_root)
    for pair in pairs:
        try:
            check_corpus(corpus if corpus.is_absolute() else root / corpus, pair, params.prepare.splits)
        except CorpusError as e:
            return f"data.mustc_root ({params.data.mustc_root}): {e}"
    return None


def _param_keys(stage) -> set[str]:
    """The params.yaml keys a DVC stage lists (its ``params:``)."""
    from dvc.dependency.param import ParamsDependency

    return {k for d in stage.deps if isinstance(d, ParamsDependency) for k in (d.params or [])}


def can_start(p: Plan, name: str, running: set[str], jobs: int) -> bool:
    """Whether ``name`` may start beside ``running``: a stage that shares the machine while fewer than
    ``jobs`` such stages run and nothing runs alone; any other stage only on an idle machine."""
    if not running:
        return True
    if name not in p.shares or not running <= p.shares:
        return False
    return len(running) < jobs


def next_ready(p: Plan, done: set[str], started: set[str]) -> list[str]:
    """Stages whose upstream stages have all finished, most downstream work first, then plan order."""
    ready = [s for s in p.order if s not in started and p.needs[s] <= done]
    pos = {s: i for i, s in enumerate(p.order)}
    return sorted(ready, key=lambda s: (-p.downstream.get(s, 0), pos[s]))


def to_start(p: Plan, ready: list[str], running: set[str], jobs: int) -> list[str]:
    """Which of ``ready`` (most urgent first, :func:`next_ready`) start now beside ``running``: in
    order while each can (:func:`can_start`). One that cannot holds back every stage behind it, so
    nothing delays a stage that others wait for, except a stage nothing waits for (no planned stage
    downstream): delaying it delays no other stage, so those behind it may pass."""
    start, now = [], set(running)
    for name in ready:
        if can_start(p, name, now, jobs):
            start.append(name)
            now.add(name)
        elif p.downstream.get(name, 0) > 0:
            break
    return start


def simulate(p: Plan, seconds: dict[str, float], jobs: int) -> dict[str, tuple[float, float]]:
    """The schedule :func:`execute` would follow if every stage took ``seconds[stage]``: stage ->
    (start, end), by the same rules (:func:`next_ready`, :func:`to_start`). ``--replay`` feeds it the
    durations a real run recorded (``--timing``), so a change of the scheduling rules or of which
    stages share the machine is compared on the same durations, free of this host's run-to-run
    noise. KeyError names a planned stage without a duration."""
    missing = [s for s in p.order if s not in seconds]
    if missing:
        raise KeyError(f"no recorded duration for {', '.join(missing)}")
    now, running, done, times = 0.0, {}, set(), {}
    while len(done) < len(p.order):
        for name in to_start(p, next_ready(p, done, set(running) | done), set(running), jobs):
            running[name] = now + seconds[name]
            times[name] = (now, running[name])
        if not running:
            raise ValueError(f"nothing can start after {sorted(done)}: the plan has a cycle")
        now = min(running.values())
        for name, end in list(running.items()):
            if end <= now:
                del running[name]
                done.add(name)
    return times


def idle_share_seconds(times: dict[str, tuple[float, float]], shares: set[str]) -> float:
    """Wall time during which a single stage ran and it was one that shares the machine: the time
    the other cores' share lay idle under ``-j 2`` (a stage that runs alone uses every core)."""
    edges = sorted({t for ab in times.values() for t in ab})
    idle = 0.0
    for a, b in zip(edges, edges[1:]):
        running = [name for name, (s, e) in times.items() if s <= a and e >= b]
        if len(running) == 1 and running[0] in shares:
            idle += b - a
    return idle


def _span(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``intervals`` (wall time during which at least one of them ran)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def timing_record(stages: dict[str, tuple[float, float]], total: float, jobs: int, command: str,
                  returncode: int) -> dict:
    """``--timing``'s JSON: per stage its start, end and seconds; per stage group (the name before
    ``@``) the wall time during which any of its stages ran, so groups may overlap and their sum can
    exceed ``total_seconds``."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for name, (a, b) in stages.items():
        groups.setdefault(name.split("@")[0], []).append((a, b))
    return {"command": command, "returncode": returncode, "jobs": jobs, "total_seconds": round(total, 1),
            "cpu_count": os.cpu_count(), "by_stage_group": {g: round(_span(iv), 1) for g, iv in groups.items()},
            "by_stage": {n: round(b - a, 1) for n, (a, b) in stages.items()},
            "intervals": {n: [round(a, 1), round(b, 1)] for n, (a, b) in stages.items()}}


def execute(p: Plan, jobs: int, command: Callable[[str], list[str]], root: Path,
            say: Callable[[str], None] = print,
            status: StatusLine | None = None) -> tuple[int, dict[str, tuple[float, float]]]:
    """Run the plan, at most ``jobs`` stages at a time; returns (exit status, stage -> (start, end)
    in seconds from the start). With one job the stage's output is streamed, else logged, and
    ``status`` (when given) shows each running stage's progress read from its log (its newest
    tqdm bar, :func:`_progress.status_text`); ``say`` then should be ``status.say``."""
    log_dir = root / LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    running: dict[str, tuple[subprocess.Popen, float, Path]] = {}
    done: set[str] = set()
    times: dict[str, tuple[float, float]] = {}
    failed: list[str] = []
    try:
        while True:
            if not failed:
                for name in to_start(p, next_ready(p, done, set(running) | done), set(running), jobs):
                    log = log_dir / f"{name}.log"
                    out = None if jobs == 1 else open(log, "w", encoding="utf-8")
                    proc = subprocess.Popen(command(name), cwd=root, stdout=out, stderr=subprocess.STDOUT if out else None,
                                            start_new_session=True)
                    if out is not None:
                        out.close()
                    running[name] = (proc, time.perf_counter() - t0, log)
                    if jobs > 1:
                        say(f"[{len(done) + len(running)}/{len(p.order)}] started  {name}")
            if not running:
                break
            if status is not None and jobs > 1 and status.wants_update():
                now = time.perf_counter() - t0
                status.update(status_text([(n, log, now - started) for n, (_, started, log) in running.items()],
                                          len(done), len(p.order)))
            time.sleep(0.2)
            for name, (proc, started, log) in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del running[name]
                end = time.perf_counter() - t0
                times[name] = (started, end)
                if rc != 0:
                    failed.append(name)
                    say(f"FAILED   {name} (exit {rc}) after {end - started:.1f} s"
                        + (f"; its log: {log}" if jobs > 1 else ""))
                    if jobs > 1:
                        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]
                        say("\n".join("    " + line for line in tail))
                    if running:
                        say(f"waiting for {len(running)} running stage(s) to finish; nothing new starts")
                else:
                    done.add(name)
                    if jobs > 1:
                        say(f"[{len(done)}/{len(p.order)}] finished {name} in {end - started:.1f} s")
    except KeyboardInterrupt as e:
        # Ctrl-C (SIGINT), or SIGTERM (a scheduler's pre-emption, `kill`, `timeout`; see Terminated): the
        # same signal to every running stage's process group, whose training saves its state on SIGTERM
        signum = getattr(e, "signum", signal.SIGINT)
        if status is not None:
            status.close()
        for proc, _, _ in running.values():
            interrupt(proc, signum)
        wait_for_stages([proc for proc, _, _ in running.values()], say)
        say(f"interrupted by {signal.Signals(signum).name}: stopped {', '.join(running) or 'nothing'}")
        return 128 + signum, times
    if status is not None:
        status.close()
    return (1 if failed else 0), times


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt (:func:`main` installs the handler): the stages
    run in sessions of their own, so a SIGTERM to this process alone would leave them running."""

    signum = signal.SIGTERM


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def interrupt(proc: subprocess.Popen, signum: int = signal.SIGINT) -> None:
    """``signum`` to the stage's process group (DVC and the stage's command: both clean up)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for_stages(procs: list[subprocess.Popen], say: Callable[[str], None]) -> None:
    """Wait until every stage has ended. A second Ctrl-C or SIGTERM while they clean up kills them
    (SIGKILL: what a stage would have saved since its last checkpoint is lost) instead of ending this
    process with a traceback and leaving them unsupervised."""
    killed = False
    while True:
        try:
            for proc in procs:
                proc.wait()
            return
        except KeyboardInterrupt:
            if not killed:
                say("interrupted again: killing the running stages")
                killed = True
            for proc in procs:
                interrupt(proc, signal.SIGKILL)


def replay(p: Plan, timing: Path, jobs: int, say: Callable[[str], None] = print) -> int:
    """``--replay``: :func:`simulate` ``p`` with the durations recorded in ``timing`` and print the
    simulated wall time and idle share (:func:`idle_share_seconds`) next to the recorded ones. Exit
    status 1 (with the reason) for an unreadable file or a stage it has no duration for."""
    try:
        record = json.loads(timing.read_text(encoding="utf-8"))
        recorded = {name: (float(a), float(b)) for name, (a, b) in record["intervals"].items()}
        times = simulate(p, {name: b - a for name, (a, b) in recorded.items()}, jobs)
    except KeyError as e:
        say(f"error: {timing}: not a --timing record: no key {e} (scripts/time_repro.py writes one)")
        return 1
    except (OSError, ValueError, TypeError) as e:
        say(f"error: {timing}: {e}")
        return 1
    total = max(end for _, end in times.values())
    say(f"{len(times)} stage(s), {jobs} at a time, durations from {timing}:")
    say(f"  recorded: {record.get('total_seconds', max(b for _, b in recorded.values())):.1f} s, "
        f"a stage that shares the machine ran alone for {idle_share_seconds(recorded, p.shares):.1f} s")
    say(f"  replayed by these rules: {total:.1f} s, a stage that shares the machine ran alone for "
        f"{idle_share_seconds(times, p.shares):.1f} s")
    return 0


def estimate(p: Plan, hours: dict[str, float], jobs: int, say: Callable[[str], None] = print) -> int:
    """``--estimate``: :func:`simulate` ``p`` with every stage of a group in ``hours`` (the stage name
    before ``@``: ``train_baseline``) taking that many hours and every other stage none, and print the
    wall time next to the summed stage-hours (one GPU each: the GPU-hours). Exit status 1 naming a
    group that no planned stage belongs to."""
    groups = {name.split("@")[0] for name in p.order}
    unknown = sorted(set(hours) - groups)
    if unknown:
        say(f"error: --estimate: no planned stage in {', '.join(unknown)} (groups: {', '.join(sorted(groups))})")
        return 1
    seconds = {name: 3600.0 * hours.get(name.split("@")[0], 0.0) for name in p.order}
    times = simulate(p, seconds, jobs)
    wall = max(end for _, end in times.values()) / 3600
    timed = [name for name in p.order if seconds[name] > 0]
    say(f"{len(timed)} timed stage(s) of {len(p.order)}, {jobs} at a time "
        f"({', '.join(f'{g} {h:g} h' for g, h in sorted(hours.items()))}; every other stage 0 h):")
    say(f"  {sum(seconds.values()) / 3600:.1f} stage-hours, wall time {wall:.1f} h")
    return 0


def _group_hours(value: str) -> tuple[str, float]:
    group, _, hours = value.partition("=")
    try:
        h = float(hours)
    except ValueError:
        h = -1.0
    if not group or not h > 0:
        raise argparse.ArgumentTypeError(f"expected GROUP=HOURS (e.g. train_baseline=1.41), got {value!r}")
    return group, h


def st_processes(root: Path) -> int:
    """``train_st.processes`` of ``root``'s params.yaml (1 where it has none: a pipeline without it)."""
    import yaml

    try:
        section = (yaml.safe_load((root / "params.yaml").read_text()) or {}).get("train_st") or {}
    except (OSError, yaml.YAMLError):
        return 1
    value = section.get("processes", 1) if isinstance(section, dict) else 1
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """This script's command line (scripts/time_repro.py checks its arguments with it before it touches
    any file)."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="*", help="stages (as for `dvc repro`); default: the whole pipeline")
    ap.add_argument("-j", "--jobs", help="stages at a time (default: params.yaml's parallel.jobs)")
    ap.add_argument("-f", "--force", action="store_true", help="run the stages even if nothing changed")
    ap.add_argument("--dry", action="store_true", help="print the plan and exit")
    ap.add_argument("--timing", type=Path, help="write every stage's start and end to this JSON file")
    ap.add_argument("--status-every", type=float, metavar="SECONDS",
                    help="with more than one job: refresh the status line every SECONDS (default: 1 on a "
                         "terminal, where it is redrawn in place; 60 otherwise, as a plain line)")
    ap.add_argument("--replay", type=Path, metavar="TIMING",
                    help="run nothing: schedule the pipeline (or the targets, as with -f) by this checkout's rules "
                         "with the stage durations a --timing file recorded, and print that schedule's wall time "
                         "next to the recorded one")
    ap.add_argument("--estimate", type=_group_hours, action="append", metavar="GROUP=HOURS",
                    help="run nothing: schedule the whole pipeline (or the targets, as with -f) by these rules "
                         "with every stage of GROUP taking HOURS (repeat per group) and every other stage none, "
                         "and print its wall time and stage-hours")
    return ap


def unknown_targets(root: Path, targets: list[str]) -> str | None:
    """One line naming the targets that are no stage of ``root``'s dvc.yaml, or None (DVC would stop
    on them with a traceback)."""
    if not targets:
        return None
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    bad = []
    with Repo(str(root)) as repo:
        for t in targets:
            try:
                repo.stage.collect(t)
            except DvcException as e:
                bad.append(f"{t} ({e})")
    return f"no such stage: {'; '.join(bad)}" if bad else None


def main() -> None:
    from _venv import ensure_project_venv

    ensure_project_venv(CODE)  # torch and dvc: re-run under .venv when started with another python
    args = build_parser().parse_args()
    sys.path.insert(0, str(CODE))
    root = Path.cwd()
    from lib.params import ParamError, load_params
    import lib.params.multi  # noqa: F401 (the variants' sections are checked too, before any stage runs)
    import lib.params.smoothing  # noqa: F401
    from lib.parallel import resolve_jobs

    try:
        value = args.jobs if args.jobs is not None else load_params(root / "params.yaml").parallel.jobs
    except ParamError as e:
        raise SystemExit(f"error: {e}") from None
    if value != "auto" and not (str(value).isdigit() and int(value) >= 1):
        raise SystemExit(f"error: -j/--jobs: expected an integer >= 1 or 'auto', got {value!r}")
    # with CUDA, auto: as many ST runs side by side as their processes (one GPU each) fit on the node
    jobs = resolve_jobs(value if value == "auto" else int(value), processes_per_run=st_processes(root))
    if args.status_every is not None and not args.status_every > 0:
        raise SystemExit(f"error: --status-every: expected a number of seconds > 0, got {args.status_every}")
    problem = unknown_targets(root, args.targets)
    if problem:
        raise SystemExit(f"error: {problem}")
    if args.replay is not None:
        sys.exit(replay(plan_or_exit(root, args.targets, True), args.replay, jobs))
    if args.estimate:
        sys.exit(estimate(plan_or_exit(root, args.targets, True), dict(args.estimate), jobs))
    p = plan_or_exit(root, args.targets, args.force)
    problem = corpus_problem(root, p.corpus_checks)
    if problem:
        raise SystemExit(f"error: {problem}")
    if not p.order:
        print("Data and pipelines are up to date.")
        if not args.targets:  # (with targets the report may wait on stages outside them)
            print_summary(root)
        return
    print(f"{len(p.order)} stage(s) to run, {jobs} at a time" + (" (forced)" if args.force else ""), flush=True)
    if args.dry:
        for name in p.order:
            print(f"  {name}" + (f"   (after {', '.join(sorted(p.needs[name]))})" if p.needs[name] else ""))
        return

    def command(name: str) -> list[str]:
        return ["dvc", "--wait-for-lock", "repro", "--single-item", *(["-f"] if args.force else []), name]

    status = StatusLine(sys.stdout, every=args.status_every) if jobs > 1 else None
    signal.signal(signal.SIGTERM, _on_sigterm)
    t0 = time.perf_counter()
    rc, times = execute(p, jobs, command, root, say=status.say if status else lambda msg: print(msg, flush=True),
                        status=status)
    total = time.perf_counter() - t0
    if args.timing is not None:
        command_line = " ".join(["python scripts/repro.py", *(portable_arg(a, root) for a in sys.argv[1:])])
        write_json(args.timing, timing_record(times, total, jobs, command_line, rc))
    print(f"{'done' if rc == 0 else 'stopped'}: {len(times)} stage(s) in {total / 60:.1f} min", flush=True)
    if rc == 0 and (not args.targets or "report" in p.order):  # the report is this run's
        print_summary(root)
    sys.exit(rc)


def plan_or_exit(root: Path, targets: list[str], force: bool) -> Plan:
    """:func:`plan`, or one line and exit code 1 when DVC cannot read the project (a params.yaml or
    dvc.yaml it cannot parse: DVC's own message, with its cause, instead of a traceback)."""
    from dvc.exceptions import DvcException

    try:
        return plan(root, targets, force)
    except DvcException as e:
        cause = f": {' '.join(str(e.__cause__).split())}" if e.__cause__ is not None else ""
        raise SystemExit(f"error: {' '.join(str(e).split())}{cause}") from None


def print_summary(root: Path) -> None:
    """Where the report is and the per-pair summary (:func:`_progress.summary_lines`); nothing when
    the pipeline wrote no metrics/summary.json."""
    for line in summary_lines(root):
        print(line, flush=True)


def portable_arg(arg: str, root: Path) -> str:
    """A command-line argument as recorded in a timing file: a path inside the repository relative to
    it (a timing file names no machine's folders), anything else as it is."""
    if arg.startswith("--") and "=" in arg:  # --timing=/abs/path
        option, value = arg.split("=", 1)
        return f"{option}={portable_arg(value, root)}"
    path = Path(arg)
    if not path.is_absolute():
        return arg
    try:
        return path.resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return arg


def write_json(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
