"""scripts/_progress.py: the status line of `make repro` reads each stage's own tqdm bar from its
log, and the end-of-run summary reads the pipeline's metrics."""
from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

from tqdm import tqdm

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import _progress  # noqa: E402
import repro  # noqa: E402

# A stage that draws a bar the way lib/train/loop.py does (desc "train <run>", unit "upd", a postfix),
# with tqdm's defaults for a non-terminal stream (its log).
BAR_STAGE = """import sys, time
from tqdm import tqdm
bar = tqdm(total={total}, desc="train fake-1", unit="upd", dynamic_ncols=True, mininterval=0)
for i in range({total}):
    time.sleep({sleep})
    bar.set_postfix(loss="1.234", lr="1.00e-03", fps="900")
    bar.update(1)
bar.close()
"""


def _tqdm_text(total: int | None, steps: int, initial: int = 0, write: str | None = None, **kw) -> str:
    """What tqdm writes to a file: ``steps`` updates of a bar (``write``: a tqdm.write line halfway)."""
    buf = io.StringIO()
    bar = tqdm(total=total, initial=initial, file=buf, mininterval=0, **kw)
    for i in range(steps):
        bar.set_postfix(loss=f"{1 / (i + 1):.3f}")
        bar.update(1)
        if write and i == steps // 2:
            tqdm.write(write, file=buf)
    return buf.getvalue()


def test_the_parser_reads_real_tqdm_output_with_a_total() -> None:
    text = _tqdm_text(360, 7, initial=100, desc="train en-de-1", unit="upd", dynamic_ncols=True,
                      write="resumed from runs/x/last.pt at update 100")
    bar = _progress.last_bar("Running stage 'train':\n> python stages/train.py\n" + text)
    assert bar is not None and (bar.desc, bar.n, bar.total) == ("train en-de-1", "107", "360")
    assert bar.rate is not None and re.fullmatch(r"[0-9.]+(upd/s|s/upd)", bar.rate), bar.rate
    assert bar.remaining is not None and re.fullmatch(r"[0-9:]+", bar.remaining)
    shown = str(bar)
    assert shown.startswith("train 107/360 ") and f"ETA {bar.remaining}" in shown, shown


def test_the_parser_takes_the_newest_bar_and_reads_bars_without_a_total() -> None:
    train = _tqdm_text(20, 20, desc="train en-de-1", unit="upd")
    decode = _tqdm_text(None, 3, desc="decode", unit="sent")
    bar = _progress.last_bar(train + "some line the stage printed\n" + decode)
    assert (bar.desc, bar.n, bar.total, bar.remaining) == ("decode", "3", None, None)
    assert str(bar).startswith("decode 3 ")
    finished = _progress.last_bar(train)
    assert (finished.n, finished.total) == ("20", "20") and "ETA" not in str(finished)
    # a bar not yet updated: no rate, no ETA; no description
    fresh = _progress.parse_bar("  0%|          | 0/360 [00:00<?, ?upd/s]")
    assert fresh == _progress.Bar(desc="", n="0", total="360", rate=None, remaining=None)
    assert str(fresh) == "0/360"
    # escape codes of nested bars are ignored
    assert _progress.parse_bar("\x1b[Adecode: 12sent [00:03, 4.00sent/s]\x1b[A").n == "12"


def test_lines_that_are_no_bar_give_none() -> None:
    for text in ("", "Running stage 'train_baseline@en-de-1':", "> python stages/train.py --pair en-de",
                 "resumed from runs/asr/last.pt at update 100", "Updating lock file 'dvc.lock'"):
        assert _progress.last_bar(text) is None, text


def test_stage_status_without_a_bar_shows_the_time_it_has_run(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    assert _progress.stage_status("s", log, 75.0) == "s running 1:15"  # no log yet
    log.write_text("Running stage 's':\n> python stages/s.py\n")
    assert _progress.stage_status("s", log, 3725.0) == "s running 1:02:05"
    log.write_text(log.read_text() + _tqdm_text(50, 5, desc="health", unit="sent"))
    assert _progress.stage_status("s", log, 3725.0).startswith("s health 5/50 ")


def test_read_tail_reads_only_the_end(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("x" * 100_000 + _tqdm_text(9, 4, desc="train r", unit="upd"))
    assert len(_progress.read_tail(log)) <= _progress.TAIL_BYTES
    assert _progress.last_bar(_progress.read_tail(log)).n == "4"


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_status_line_plain_lines_at_most_every_interval() -> None:
    out, clock = io.StringIO(), _Clock()
    line = _progress.StatusLine(out, tty=False, every=60.0, clock_fn=clock)
    assert not line.wants_update()  # none at once: a short stage prints no status line
    clock.t = 59.0
    assert not line.wants_update()
    clock.t = 60.0
    assert line.wants_update()
    line.update("[0/1 done] a train 3/9")
    line.say("[1/1] finished a")
    assert not line.wants_update()
    assert out.getvalue() == "[0/1 done] a train 3/9\n[1/1] finished a\n"


def test_status_line_on_a_terminal_redraws_in_place_and_clears_before_messages() -> None:
    out, clock = io.StringIO(), _Clock()
    line = _progress.StatusLine(out, tty=True, clock_fn=clock)
    assert line.every == 1.0 and line.wants_update()  # drawn at once
    line.update("[0/2 done] a train 1/9")
    assert not line.wants_update()
    clock.t = 1.0
    line.update("[0/2 done] a train 2/9")
    line.say("[2/2] started  b")
    assert line.wants_update()  # redrawn under the message at once
    line.close()
    assert out.getvalue() == ("\r\x1b[K[0/2 done] a train 1/9\r\x1b[K[0/2 done] a train 2/9"
                              "\r\x1b[K[2/2] started  b\n")


def test_execute_shows_each_stage_progress_from_its_own_log(tmp_path: Path) -> None:
    """Two stages side by side, one drawing a tqdm bar, one silent: the status line repeats the bar's
    count (from the stage's log) and the silent stage's running time."""
    (tmp_path / "bar.py").write_text(BAR_STAGE.format(total=8, sleep=0.3))
    (tmp_path / "quiet.py").write_text("import time; time.sleep(1.5)\n")
    p = repro.Plan(order=["fake", "quiet"], needs={"fake": set(), "quiet": set()}, shares={"fake", "quiet"})
    out = io.StringIO()
    line = _progress.StatusLine(out, tty=False, every=0.3)
    rc, times = repro.execute(p, 2, lambda name: [sys.executable, str(tmp_path / ("bar.py" if name == "fake" else "quiet.py"))],
                              tmp_path, say=line.say, status=line)
    text = out.getvalue()
    assert rc == 0 and set(times) == {"fake", "quiet"}, text
    shown = re.findall(r"fake train (\d)/8", text)
    assert shown and any(0 < int(n) < 8 for n in shown), text
    assert re.search(r"fake train \d/8 [0-9.]+(upd/s|s/upd) ETA [0-9:]+", text), text
    assert re.search(r"quiet running 0:0\d", text), text
    assert "[2/2 done]" not in text and "[1/2 done] fake train" in text  # counts finished stages


def _layout(root: Path, windows: bool = True, report: bool = True) -> Path:
    flat = {}
    for pair, (b, l, gap) in {"en-de": (76.37, 76.76, 0.39), "en-it": (81.0, 80.93, -0.07)}.items():
        flat.update({f"{pair}/baseline/bleu": b, f"{pair}/local/bleu": l, f"{pair}/baseline/chrf": 1.0,
                     f"{pair}/local_minus_baseline/bleu": gap})
    flat["en-de/local_minus_baseline/bleu_ci95"] = 1.5
    (root / "metrics" / "windows").mkdir(parents=True)
    (root / "metrics" / "summary.json").write_text(json.dumps(flat))
    if windows:
        layers = {f"l{i:02d}": {"attention": "full" if i <= 2 else "local", "window": w}
                  for i, w in enumerate([23, 3, 1, 5, 15], start=1)}
        (root / "metrics" / "windows" / "en-de.json").write_text(json.dumps({"full_layers": 2, "layers": layers}))
    if report:
        (root / "reports").mkdir()
        (root / "reports" / "report.md").write_text("# Results\n")
    return root


def test_summary_names_the_report_and_each_pairs_bleu_and_windows(tmp_path: Path) -> None:
    lines = _progress.summary_lines(_layout(tmp_path))
    assert lines == ["report: reports/report.md",
                     "  en-de: BLEU baseline 76.37, local 76.76, local − baseline +0.39 ± 1.50; "
                     "Algorithm 1 windows, layers 3-5: 1 5 15",
                     "  en-it: BLEU baseline 81.00, local 80.93, local − baseline -0.07"]


def test_summary_is_empty_or_short_when_metrics_are_missing(tmp_path: Path) -> None:
    assert _progress.summary_lines(tmp_path) == []  # a partial pipeline, or another DVC project
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "summary.json").write_text("{not json")
    assert _progress.summary_lines(tmp_path) == []
    (tmp_path / "metrics" / "summary.json").write_text(json.dumps({"a/b": 1}))
    assert _progress.summary_lines(tmp_path) == []
    root = _layout(tmp_path / "r", windows=False, report=False)
    (root / "metrics" / "windows" / "en-it.json").write_text("[]")  # unreadable: that pair shows BLEU only
    lines = _progress.summary_lines(root)
    assert lines[0].startswith("(no reports/report.md yet") and len(lines) == 3
    assert all("windows" not in line for line in lines[1:])
