"""What `make repro` shows while its stages run, and the summary it prints at the end.

With more than one job, scripts/repro.py sends each stage's output to `.dvc/tmp/repro/<stage>.log`.
Every long step of the pipeline draws a tqdm bar there (training: ``train <run>`` in updates,
decoding, analysis, health, corpus and prepare: in sentences or segments). :func:`last_bar` reads
the newest bar from a log's tail, so the status line repeats the stage's own count, rate and ETA
and keeps no counter of its own; a stage without a bar (yet) shows how long it has run.
:class:`StatusLine` draws one line for all running stages: redrawn in place on a terminal, as a
plain line at most every ``every`` seconds otherwise (CI logs, pipes), so a log stays small.

:func:`summary_lines` reads the finished pipeline's metrics (metrics/summary.json and
metrics/windows/<pair>.json) into one line per pair: BLEU baseline vs local, and Algorithm 1's
windows in the local layers. Torch-free: only the standard library.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

TAIL_BYTES = 16384  # a tqdm bar is < 300 characters; the tail also spans a few tqdm.write lines
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# tqdm's default format, with a total: "{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]"
WITH_TOTAL = re.compile(r"^(?:(?P<desc>.*?): *)?\d+%\|.*\| *(?P<n>[0-9.]+[kMGTP]?)/(?P<total>[0-9.]+[kMGTP]?) "
                        r"\[(?P<elapsed>[0-9:]+)<(?P<remaining>[0-9:?]+), *(?P<rate>[^,\]]*)")
# without a total: "{desc}: {n}{unit} [{elapsed}, {rate}{postfix}]"
NO_TOTAL = re.compile(r"^(?:(?P<desc>.*?): *)?(?P<n>[0-9.]+[kMGTP]?)[^\s\[]* \[(?P<elapsed>[0-9:]+), *(?P<rate>[^,\]]*)")


@dataclass(frozen=True)
class Bar:
    """One tqdm bar as last drawn: its description, count, total (None when unknown), tqdm's own
    rate (e.g. ``4.10upd/s`` or ``2.31s/upd``; None before the second update) and remaining time
    (e.g. ``00:58``; None when unknown)."""

    desc: str
    n: str
    total: str | None
    rate: str | None
    remaining: str | None

    def __str__(self) -> str:
        label = self.desc.split()[0] + " " if self.desc.split() else ""
        count = f"{self.n}/{self.total}" if self.total is not None else self.n
        parts = [label + count]
        if self.rate:
            parts.append(self.rate)
        if self.remaining and self.total is not None and self.n != self.total:
            parts.append(f"ETA {self.remaining}")
        return " ".join(parts)


def parse_bar(segment: str) -> Bar | None:
    """The bar drawn in one ``\\r``/``\\n``-separated piece of tqdm output, or None if it is none."""
    text = ANSI.sub("", segment).strip()
    m = WITH_TOTAL.match(text)
    if m is None:
        m = NO_TOTAL.match(text)
        if m is None:
            return None
    rate = m["rate"].strip()
    rate = None if not rate or rate.startswith("?") else rate
    groups = m.groupdict()
    remaining = groups.get("remaining")
    return Bar(desc=(m["desc"] or "").strip(), n=m["n"], total=groups.get("total"), rate=rate,
               remaining=None if remaining in (None, "?") else remaining)


def last_bar(text: str) -> Bar | None:
    """The newest tqdm bar in ``text`` (tqdm redraws a bar after ``\\r``; ``tqdm.write`` lines and
    a stage's other output end in ``\\n``), or None when it holds none."""
    for segment in reversed(re.split(r"[\r\n]", text)):
        bar = parse_bar(segment)
        if bar is not None:
            return bar
    return None


def read_tail(path: Path, nbytes: int = TAIL_BYTES) -> str:
    """The last ``nbytes`` of ``path`` as text ('' when it does not exist yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(size - nbytes, 0))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def stage_status(name: str, log: Path, running_for: float) -> str:
    """One stage's part of the status line: its newest bar, else how long it has run."""
    bar = last_bar(read_tail(log))
    return f"{name} {bar}" if bar is not None else f"{name} running {clock(running_for)}"


def status_text(stages: list[tuple[str, Path, float]], done: int, total: int) -> str:
    """The status line for the running ``(name, log, seconds running)`` stages."""
    return f"[{done}/{total} done] " + " | ".join(stage_status(*s) for s in stages)


class StatusLine:
    """One line showing every running stage. On a terminal (``tty``) it is redrawn in place at most
    every ``every`` seconds (default 1) and cleared before any other message; elsewhere a plain
    line is printed at most every ``every`` seconds (default 60)."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None, every: float | None = None,
                 clock_fn=time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = every if every is not None else (1.0 if self.tty else 60.0)
        self._now = clock_fn
        self._last = self._now()  # a plain line only after the first interval: short stages print none
        self._shown = ""  # what is on the terminal's last line now (tty)

    def _clear(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\r\x1b[K")
            self._shown = ""

    def say(self, msg: str) -> None:
        """Print a message on its own line(s); on a terminal the status line is redrawn below it at
        the next :meth:`update`."""
        self._clear()
        self.stream.write(msg + "\n")
        self.stream.flush()

    def wants_update(self) -> bool:
        """Whether :meth:`update` should be called now: the interval has passed, or a message
        cleared the line on a terminal (it is redrawn under the message at once)."""
        return self._now() - self._last >= self.every or (self.tty and not self._shown)

    def update(self, text: str) -> None:
        """Show ``text``: redrawn in place on a terminal, a line of its own elsewhere."""
        self._last = self._now()
        if self.tty:
            width = shutil.get_terminal_size((120, 24)).columns
            line = text if len(text) < width else text[:max(width - 2, 1)] + "…"
            self.stream.write("\r\x1b[K" + line)
            self._shown = line
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Leave the terminal on a fresh line."""
        self._clear()
        self.stream.flush()


def summary_lines(root: Path) -> list[str]:
    """Where the report is and, per pair, BLEU baseline vs local and the local layers' Algorithm 1
    windows, from metrics/summary.json and metrics/windows/<pair>.json. Empty when the pipeline
    wrote no summary (a partial run, another DVC project); a pair without windows shows BLEU only."""
    root = Path(root)
    report, summary = root / "reports" / "report.md", root / "metrics" / "summary.json"
    try:
        flat = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(flat, dict):
        return []
    pairs = sorted({k.split("/")[0] for k in flat if k.endswith("/baseline/bleu")})
    lines = [f"report: {report.relative_to(root)}" if report.is_file() else
             f"(no {report.relative_to(root)} yet; metrics from {summary.relative_to(root)})"]
    for pair in pairs:
        try:
            base, local = float(flat[f"{pair}/baseline/bleu"]), float(flat[f"{pair}/local/bleu"])
        except (KeyError, TypeError, ValueError):
            continue
        line = f"  {pair}: BLEU baseline {base:.2f}, local {local:.2f}"
        gap, half = flat.get(f"{pair}/local_minus_baseline/bleu"), flat.get(f"{pair}/local_minus_baseline/bleu_ci95")
        if isinstance(gap, (int, float)):  # the mean of the per-seed differences, with its interval over seeds
            line += f", local − baseline {gap:+.2f}"
            if isinstance(half, (int, float)):  # as the metrics hold them: endpoints recomputed from the
                line += f" ± {half:.2f}"  # rounded mean and half-width could miss the report's by 0.01
        windows = _local_windows(root / "metrics" / "windows" / f"{pair}.json")
        if windows:
            first, last, values = windows
            line += f"; Algorithm 1 windows, layers {first}-{last}: {' '.join(map(str, values))}"
        lines.append(line)
    return lines if len(lines) > 1 else []


def _local_windows(path: Path) -> tuple[int, int, list[int]] | None:
    """(first layer, last layer, windows) of the layers a windows metrics file marks local."""
    try:
        layers = json.loads(path.read_text(encoding="utf-8"))["layers"]
        local = sorted((int(k.lstrip("l")), int(v["window"])) for k, v in layers.items()
                       if v.get("attention") == "local")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (local[0][0], local[-1][0], [w for _, w in local]) if local else None
