"""lib/train/live.py: the training logger writes what dvclive's Live writes, without re-reading every
curve on every step when no DVC Studio is configured."""
from __future__ import annotations

from pathlib import Path

import dvclive.live
import pytest
from dvclive import Live

from lib.train.live import TrainingLive


@pytest.fixture(autouse=True)
def _no_studio(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("DVC_STUDIO_TOKEN", "STUDIO_TOKEN", "DVC_STUDIO_URL", "DVC_STUDIO_REPO_URL", "DVC_EXP_BASELINE_REV",
                "DVC_EXP_NAME", "DVC_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _log(cls: type, folder: Path, steps: range, resume: bool = False) -> None:
    """What lib/train/loop.py does per update: set the step, log the update's metrics, next_step."""
    live = cls(dir=str(folder), resume=resume, dvcyaml=False, save_dvc_exp=False, report=None)
    for step in steps:
        live.step = step
        live.log_metric("train/loss", 1.0 / step)
        live.log_metric("train/lr", step * 1e-4)
        if step % 4 == 0:
            live.log_metric("dev/bleu", 10.0 + step)
        live.next_step()
    live.end()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_writes_what_live_writes_fresh_and_resumed(tmp_path: Path) -> None:
    for cls, name in ((Live, "plain"), (TrainingLive, "ours")):
        _log(cls, tmp_path / name, range(1, 9))
        _log(cls, tmp_path / name, range(9, 13), resume=True)
    plain, ours = _files(tmp_path / "plain"), _files(tmp_path / "ours")
    assert "plots/metrics/train/loss.tsv" in plain and "metrics.json" in plain
    assert plain["plots/metrics/train/loss.tsv"].decode().count("\n") == 13  # header + 12 steps
    assert ours == plain


def test_does_not_parse_the_curves_each_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = dvclive.live.parse_metrics
    monkeypatch.setattr(dvclive.live, "parse_metrics", lambda live: calls.append(live.step) or real(live))
    _log(Live, tmp_path / "plain", range(1, 6))
    # dvclive still parses every curve on every step (else this module has nothing left to do)
    assert len(calls) >= 5, calls
    calls.clear()
    _log(TrainingLive, tmp_path / "ours", range(1, 6))
    assert calls == []


def test_defers_to_dvclive_when_studio_would_receive_the_data(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    posted = []
    monkeypatch.setattr(Live, "post_data_to_studio", lambda self: posted.append(self.step))
    live = TrainingLive(dir=str(tmp_path / "live"), dvcyaml=False, save_dvc_exp=False, report=None)
    live.next_step()
    assert posted == []  # no Studio here
    live._studio_events_to_skip.discard("data")  # as Live leaves it when a Studio config is found
    live.next_step()
    assert posted == [1]
