"""lib/train/loop.py: determinism, exact resume after a hard kill, one resume decision (last.pt loaded
once), stale checkpoints, NaN guard."""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import _driver
from lib.model.checkpoint import CheckpointError
from lib.train import checkpoint as ckpt
from lib.train import loop

DRIVER = Path(_driver.__file__).resolve()


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), f"{k} differs"


def state_differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- determinism


def test_same_seed_gives_bit_identical_runs(prepared: Path, tmp_path: Path) -> None:
    m1, s1 = _driver.run_training(prepared, tmp_path / "a")
    m2, s2 = _driver.run_training(prepared, tmp_path / "b")
    m3, s3 = _driver.run_training(prepared, tmp_path / "c", seed=2)
    assert s1["updates"] == 8 and s1["epochs_started"] == 2  # crossed an epoch boundary
    assert [r["update"] for r in s1["history"]] == [4, 8]
    assert_same_state(m1.state_dict(), m2.state_dict())
    assert s1["history"] == s2["history"] and s1["best"] == s2["best"]
    for name in ("avg_last_k.pt", "best.pt", "last.pt"):
        assert_same_state(ckpt.load(tmp_path / "a/checkpoints" / name)["model"],
                          ckpt.load(tmp_path / "b/checkpoints" / name)["model"])
    assert state_differs(m1.state_dict(), m3.state_dict())
    assert s1["history"] != s3["history"]


def test_specaugment_masks_every_batch_from_its_seed_and_epoch(prepared: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """SpecAugment (on in _driver's runs, as in the paper's recipe) masks every training batch (the dev loss
    none), with draws from a generator of (seed, epoch, batch): batch g of epoch 1 draws other masks than
    batch g of epoch 0 (each epoch masks anew), a run of another seed other masks than this one's, and a
    rerun of the same seed the same masks. A batch's draws are read as the masks its generator puts on one
    fixed probe utterance (the batches themselves hold other utterances in another epoch or seed)."""
    from lib.data import dataset as data
    from lib.train import feed

    probe = torch.randn(120, 80, generator=torch.Generator().manual_seed(0))
    real_collate, real_groups = loop.collate, loop._update_groups
    runs: list[list[dict]] = []

    def groups(train_ds, cfg, epoch):  # noqa: ANN001, ANN202
        runs[-1].append({"epoch": epoch})  # marks the start of an epoch
        return real_groups(train_ds, cfg, epoch)

    def collate(dataset, indices, *, specaugment=None, generator=None, **kwargs):  # noqa: ANN001, ANN202
        batch = real_collate(dataset, indices, specaugment=specaugment, generator=generator, **kwargs)
        if dataset.split != "train":
            assert specaugment is None  # the dev loss sees the features as they are
            return batch
        record = {"specaugment": specaugment, "masked": not torch.equal(batch.feats, real_collate(
            dataset, indices, **kwargs).feats)}
        if specaugment is not None:
            g = torch.Generator()
            g.set_state(generator.get_state())  # the generator as collate got it
            policy = dataclasses.asdict(specaugment)  # freq_mask_F, ..., time_mask_p
            record["probe"] = data.spec_augment(probe, g, **policy) != probe
        runs[-1].append(record)
        return batch

    monkeypatch.setattr(loop, "_update_groups", groups)
    monkeypatch.setattr(loop, "collate", collate)  # the dev loss's batches
    monkeypatch.setattr(feed, "collate", collate)  # the training batches (lib/train/feed.py)
    overrides = {"max_updates": 8, "eval_every": 8, "save_every": 8, "average_last": 1}
    masks = []  # per run: {(epoch, batch in epoch): mask on the probe}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        runs.append([])
        _driver.run_training(prepared, tmp_path / name, seed=seed, train_overrides=overrides)
        batches = [r for r in runs[-1] if "epoch" not in r]
        assert len(batches) == 8
        assert all(r["specaugment"] == data.SpecAugmentConfig() and r["masked"] for r in batches)
        by_slot, epoch, g = {}, -1, 0
        for r in runs[-1]:
            if "epoch" in r:
                epoch, g = r["epoch"], 0
            else:
                by_slot[(epoch, g)] = r["probe"]
                g += 1
        masks.append(by_slot)
    a, b, c = masks
    assert a.keys() == b.keys() == c.keys() and {e for e, _ in a} == {0, 1}  # crossed an epoch boundary
    assert all(torch.equal(a[k], b[k]) for k in a)  # same seed, same epoch: same masks
    assert all(a[k].any() for k in a)
    assert all(not torch.equal(a[k], c[k]) for k in a)  # another seed
    again = [g for e, g in a if e == 1]
    assert again and all(not torch.equal(a[(0, g)], a[(1, g)]) and not torch.equal(c[(0, g)], c[(1, g)])
                         for g in again)  # another epoch


def test_prefetching_the_next_updates_batches_trains_the_same(prepared: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """prefetch (on by default on CUDA): the next update's batches collated in a thread while this one
    runs. Forced on here, on a CPU, across an epoch boundary: the same weights, bit for bit."""
    from concurrent.futures import ThreadPoolExecutor

    submitted = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            submitted.append(args)
            return super().submit(fn, *args, **kwargs)

    from lib.train import feed

    m1, s1 = _driver.run_training(prepared, tmp_path / "a", prefetch=False)
    assert not submitted
    monkeypatch.setattr(feed, "ThreadPoolExecutor", Counting)
    m2, s2 = _driver.run_training(prepared, tmp_path / "b", prefetch=True, train_overrides={"data_workers": 0})
    assert s1["epochs_started"] == 2 and len(submitted) >= 5  # most updates' batches came from the thread
    assert_same_state(m1.state_dict(), m2.state_dict())
    assert s1["history"] == s2["history"]


# ----------------------------------------------------------------------------- resume after SIGKILL


def _start_driver(spec: dict, env_extra: dict[str, str]) -> tuple[subprocess.Popen, "queue.Queue[str | None]"]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env_extra}
    proc = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=str(DRIVER.parents[2]))
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _read_until(lines: "queue.Queue[str | None]", marker: str, timeout: float) -> str:
    """All output up to and including the first line containing ``marker``."""
    out, deadline = [], time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {marker!r} within {timeout} s; output so far:\n{''.join(out)}") from None
        if line is None:
            raise AssertionError(f"driver exited before {marker!r}; output:\n{''.join(out)}")
        out.append(line)
        if marker in line:
            return "".join(out)


def _run_to_done(spec: dict) -> str:
    """Run the driver to the end (no interruption); its output."""
    proc, lines = _start_driver(spec, {})
    try:
        log = _read_until(lines, "DONE", timeout=60)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return log


@pytest.fixture(scope="module")
def uninterrupted(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """Run A: 8 updates without interruption (one thread, like the driver)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, summary = _driver.run_training(prepared, out)
    finally:
        torch.set_num_threads(old)
    return out, model.state_dict(), summary


KILL_POINTS = {
    # after update 5 (weights updated, nothing saved since last.pt of update 4)
    "after_update_5": ("TRAIN_DRIVER_BLOCK_AT", "5", "BLOCKED at update 5"),
    # in the middle of the checkpoint of update 6: just before its snapshot is written ...
    "before_snapshot_6": ("TRAIN_DRIVER_BLOCK_IN_SAVE", "update_0000006.pt@6", "BLOCKED in save"),
    # ... and just before its last.pt is written
    "before_last_6": ("TRAIN_DRIVER_BLOCK_IN_SAVE", "last.pt@6", "BLOCKED in save"),
}


@pytest.mark.parametrize("kill_point", list(KILL_POINTS))
def test_killed_run_resumes_to_the_uninterrupted_result(prepared: Path, tmp_path: Path, uninterrupted,
                                                        kill_point: str) -> None:
    """Run B is SIGKILLed at ``kill_point`` (save_every=2), then restarted on the same folder; it
    must resume and end bit-identical to run A: weights, history, best.pt, the snapshots kept and
    their average."""
    out_a, state_a, summary_a = uninterrupted
    env_key, env_value, marker = KILL_POINTS[kill_point]
    out_b = tmp_path / "b"
    spec = {"prepared": str(prepared), "out": str(out_b)}
    proc, lines = _start_driver(spec, {env_key: env_value})
    try:
        _read_until(lines, marker, timeout=60)
        killed_at = ckpt.load(out_b / "checkpoints/last.pt")["run_state"]["update"]
        assert killed_at in (4, 6)
        if kill_point == "after_update_5":
            state = ckpt.load(out_b / "checkpoints/last.pt")["run_state"]
            assert killed_at == 4 and state["epoch"] == 0 and state["group_in_epoch"] == 4
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (out_b / "final.pt").exists()

    log = _run_to_done(spec)
    assert f"resumed from {out_b / 'checkpoints' / 'last.pt'} at update {killed_at}" in log
    done = [line for line in log.splitlines() if line.startswith("update ")]
    assert done == [f"update {n}" for n in range(killed_at + 1, 9)], log  # continued, not restarted

    final_b = torch.load(out_b / "final.pt", weights_only=True)
    assert_same_state(state_a, final_b["model"])
    assert final_b["summary"]["history"] == summary_a["history"]
    assert final_b["summary"]["best"] == summary_a["best"]
    assert final_b["summary"]["updates"] == 8
    snaps = sorted(p.name for p in (out_b / "checkpoints/snapshots").glob("*.pt"))
    assert snaps == sorted(p.name for p in (out_a / "checkpoints/snapshots").glob("*.pt"))
    for name in ("avg_last_k.pt", "best.pt", "last.pt"):
        a, b = ckpt.load(out_a / "checkpoints" / name), ckpt.load(out_b / "checkpoints" / name)
        assert_same_state(a["model"], b["model"])
        assert {k: v for k, v in a.items() if k not in ("model", "optimizer", "rng")} == \
            {k: v for k, v in b.items() if k not in ("model", "optimizer", "rng")}, name
    assert not list(out_b.rglob(".*.tmp-*"))  # no temporary file left behind


def test_sigterm_saves_the_update_it_stopped_after_and_the_same_command_continues(prepared: Path, tmp_path: Path,
                                                                                   uninterrupted) -> None:
    """A pre-emption (SIGTERM) during training: the loop finishes its update, saves last.pt there (off
    the save_every=2 schedule: no update is lost, and no snapshot: snapshots follow the schedule) and
    stops with one line; the rerun continues from that update and ends bit-identical to the
    uninterrupted run, its average of the last saves included."""
    out_a, state_a, summary_a = uninterrupted
    out_b = tmp_path / "b"
    spec = {"prepared": str(prepared), "out": str(out_b)}
    proc, lines = _start_driver(spec, {"TRAIN_DRIVER_BLOCK_AT": "5"})  # hold after update 5 until signalled
    try:
        _read_until(lines, "BLOCKED at update 5", timeout=60)
        os.kill(proc.pid, signal.SIGTERM)
        log = _read_until(lines, "stopped by SIGTERM", timeout=60)
        assert proc.wait(timeout=30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"stopped by SIGTERM after update 5; its training state is in {out_b / 'checkpoints' / 'last.pt'}" in log
    assert ckpt.load(out_b / "checkpoints/last.pt")["run_state"]["update"] == 5  # not 4: nothing lost
    assert sorted(p.name for p in (out_b / "checkpoints/snapshots").iterdir()) == ["update_0000002.pt", "update_0000004.pt"]

    log = _run_to_done(spec)
    assert f"resumed from {out_b / 'checkpoints' / 'last.pt'} at update 5" in log
    final_b = torch.load(out_b / "final.pt", weights_only=True)
    assert_same_state(state_a, final_b["model"])
    assert final_b["summary"]["history"] == summary_a["history"]
    avg_a, avg_b = (ckpt.load(out / "checkpoints/avg_last_k.pt") for out in (out_a, out_b))
    assert avg_a["updates"] == avg_b["updates"] == [4, 6, 8]  # average_last 3 of the saves 2, 4, 6, 8
    assert_same_state(avg_a["model"], avg_b["model"])


def test_rerunning_a_finished_run_changes_nothing(prepared: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    overrides = {"max_updates": 3, "save_every": 3, "eval_every": 3}
    m1, s1 = _driver.run_training(prepared, tmp_path / "a", train_overrides=overrides)
    m2, s2 = _driver.run_training(prepared, tmp_path / "a", train_overrides=overrides)
    assert "resumed from" in capsys.readouterr().out
    assert_same_state(m1.state_dict(), m2.state_dict())
    assert s1["history"] == s2["history"] and s2["updates"] == 3


def test_a_missing_snapshot_stops_the_average_naming_it(prepared: Path, tmp_path: Path) -> None:
    """The final average is of the schedule's last average_last saves: a snapshot that is gone (deleted,
    lost with a disk) stops the run with one line naming it, rather than averaging the others."""
    overrides = {"max_updates": 4, "save_every": 2, "eval_every": 4, "average_last": 2}
    _driver.run_training(prepared, tmp_path / "a", train_overrides=overrides)
    snaps = tmp_path / "a/checkpoints/snapshots"
    assert sorted(p.name for p in snaps.iterdir()) == ["update_0000002.pt", "update_0000004.pt"]
    (snaps / "update_0000002.pt").unlink()
    with pytest.raises(SystemExit, match=r"snapshot update_0000002\.pt is missing; the run averages the snapshots of "
                                         r"its last 2 saves \(update_0000002\.pt, update_0000004\.pt\)"):
        _driver.run_training(prepared, tmp_path / "a", train_overrides=overrides)


def test_an_unreadable_snapshot_stops_the_average_naming_it_and_the_remedy(prepared: Path, tmp_path: Path) -> None:
    """A truncated snapshot (a disk fault, a partial copy) is met again by every rerun, since only training
    writes it: the run stops with one error naming the file and the folder whose deletion clears it."""
    overrides = {"max_updates": 4, "save_every": 2, "eval_every": 4, "average_last": 2}
    _driver.run_training(prepared, tmp_path / "a", train_overrides=overrides)
    snap = tmp_path / "a/checkpoints/snapshots/update_0000002.pt"
    snap.write_bytes(snap.read_bytes()[:1000])
    with pytest.raises(CheckpointError) as err:
        _driver.run_training(prepared, tmp_path / "a", train_overrides=overrides)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{snap}: cannot load checkpoint")
    assert message.endswith(f"delete {tmp_path / 'a/checkpoints'} to train the run again")


def test_an_unreadable_fork_state_counts_as_missing(tmp_path: Path) -> None:
    """fork.pt truncated: not this run's fork state (the run trains again to keep one, lib/train/run.py
    ``_fork_or_restart``) rather than a stop on a checkpoint no rerun can read."""
    ckpt.save(tmp_path / "fork.pt", {"fingerprint": "f", "run_state": {"update": 2}})
    assert loop.fork_is_valid(tmp_path, "f", 2)
    data = (tmp_path / "fork.pt").read_bytes()
    (tmp_path / "fork.pt").write_bytes(data[: len(data) // 2])
    assert not loop.fork_is_valid(tmp_path, "f", 2)


def test_a_resumed_run_writes_the_fork_state_byte_for_byte_as_an_uninterrupted_one(prepared: Path, tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """fork.pt is a DVC output: a run stopped after its save at update 4 and resumed writes, at its fork
    update 6, the same bytes as a run that was never stopped (the resumed run's history rows and
    optimizer groups come from last.pt as other string objects, which pickle would write otherwise)."""
    cfg = _driver.train_config(max_updates=8, save_every=2, eval_every=4)

    def fork_bytes(out: Path, stop_after_save_of: int | None) -> bytes:
        net, train_ds, dev_ds, run_config = _driver.build(prepared)
        if stop_after_save_of is not None:
            real_save = ckpt.save

            def save(path, state):  # noqa: ANN001
                real_save(path, state)
                if Path(path).name == "last.pt" and state["run_state"]["update"] == stop_after_save_of:
                    raise KeyboardInterrupt  # as a kill right after that save

            monkeypatch.setattr(ckpt, "save", save)
            with pytest.raises(KeyboardInterrupt):
                loop.train(net, cfg, train_ds, dev_ds, out, run_config=run_config, progress=False, fork_at=6)
            monkeypatch.setattr(ckpt, "save", real_save)
            assert not (out / "checkpoints/fork.pt").exists()
            net, train_ds, dev_ds, run_config = _driver.build(prepared)
        loop.train(net, cfg, train_ds, dev_ds, out, run_config=run_config, progress=False, fork_at=6)
        return (out / "checkpoints/fork.pt").read_bytes()

    uninterrupted = fork_bytes(tmp_path / "a", None)
    resumed = fork_bytes(tmp_path / "b", 4)
    a, b = ckpt.load(tmp_path / "a/checkpoints/fork.pt"), ckpt.load(tmp_path / "b/checkpoints/fork.pt")
    assert a["run_state"] == b["run_state"] and a["run_state"]["update"] == 6 and len(a["run_state"]["history"]) == 1
    assert resumed == uninterrupted


def test_the_average_is_the_element_wise_mean_of_the_snapshots_it_names(prepared: Path, tmp_path: Path) -> None:
    """avg_last_k.pt (the model the paper evaluates) is the mean of the snapshots of the schedule's last
    average_last saves, which the run keeps: recomputed here in float64 from those files, and different
    from each of them alone (an average of fewer snapshots than it names would fail)."""
    overrides = {"max_updates": 6, "save_every": 2, "eval_every": 6, "average_last": 3}
    _driver.run_training(prepared, tmp_path / "a", train_overrides=overrides)
    checkpoints = tmp_path / "a/checkpoints"
    avg = ckpt.load(checkpoints / "avg_last_k.pt")
    assert avg["updates"] == [2, 4, 6]
    snaps = [ckpt.load(checkpoints / f"snapshots/update_{u:07d}.pt") for u in avg["updates"]]
    assert [s["update"] for s in snaps] == [2, 4, 6]
    models = [s["model"] for s in snaps]
    assert_same_state(models[-1], ckpt.load(checkpoints / "last.pt")["model"])
    assert list(avg["model"]) == list(models[0])
    for k, v in avg["model"].items():
        if v.is_floating_point():
            mean = (sum(m[k].double() for m in models) / len(models)).to(v.dtype)
            torch.testing.assert_close(v, mean, rtol=1e-6, atol=1e-7, msg=k)
        else:
            assert torch.equal(v, models[-1][k]), k
    assert all(state_differs(avg["model"], m) for m in models)


def test_dev_nll_is_the_summed_token_nll_over_the_target_tokens(prepared: Path) -> None:
    """dev/nll is nats per target token (eos included, padding not): recomputed one utterance at a time,
    without padding, from the log-softmax of the teacher-forced logits, against dev_loss's padded batches
    (max_frames 200: two batches, one of two utterances padded to the longer)."""
    from lib.data.dataset import EOS_ID, batch_by_frames

    net, _, dev_ds, _ = _driver.build(prepared, "st")
    batches = batch_by_frames(dev_ds.n_frames, 200, shuffle=False)
    assert 1 < len(batches) < len(dev_ds)
    got = loop.dev_loss(net, dev_ds, 200, torch.device("cpu"), 0.1)
    assert net.training  # dev_loss evaluates in eval mode and gives the model back as it was
    net.eval()
    nll = tokens = 0.0
    with torch.no_grad():
        for i in range(len(dev_ds)):
            target = dev_ds.targets[i]
            feats = dev_ds.features(i)[None]
            enc = net.encode(feats, torch.tensor([feats.shape[1]]))
            logits = net.decode(torch.tensor([[EOS_ID] + target[:-1]]), enc)
            logp = torch.log_softmax(logits[0].double(), dim=-1)
            nll -= float(logp[torch.arange(len(target)), torch.tensor(target)].sum())
            tokens += len(target)
    assert tokens > 2 * len(dev_ds)
    assert got["nll"] == pytest.approx(nll / tokens, rel=1e-5)


def test_the_save_schedule_names_the_averaged_updates() -> None:
    assert ckpt.averaged_updates(2, 8, 3, 8) == [4, 6, 8]
    assert ckpt.averaged_updates(2, 8, 3, 5) == [2, 4]  # at a pre-emption after update 5: nothing off the schedule
    assert ckpt.averaged_updates(3, 8, 3, 8) == [3, 6, 8]  # the last update is always saved
    assert ckpt.averaged_updates(2, 8, 3, 8, start=5) == [6, 8]  # a fork from update 5: its own snapshots only
    assert ckpt.averaged_updates(30, 720, 2, 720) == [690, 720]


# ----------------------------------------------------------------------------- stale last.pt


def test_last_pt_of_another_config_is_moved_aside(prepared: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    short = {"max_updates": 2, "save_every": 2, "eval_every": 2}
    _driver.run_training(prepared, out, train_overrides={**short, "max_updates": 4})  # snapshots 2, 4
    old_fp = ckpt.load(out / "checkpoints/last.pt")["fingerprint"]
    capsys.readouterr()

    changed = {**short, "lr": 1e-3}
    model, summary = _driver.run_training(prepared, out, train_overrides=changed, model={"dropout": 0.2})
    log = capsys.readouterr().out
    assert "NOT resuming" in log and "resumed from" not in log
    assert "train.lr: 0.002 -> 0.001" in log and "train.max_updates: 4 -> 2" in log
    assert "model.dropout: 0.1 -> 0.2" in log
    assert "starting from scratch" in log
    stale = out / "checkpoints" / f"stale-{old_fp}"
    assert f"set it aside in {stale.name}/ with its snapshots and curves" in log
    assert ckpt.load(stale / "last.pt")["fingerprint"] == old_fp
    assert sorted(p.name for p in (stale / "snapshots").iterdir()) == ["update_0000002.pt", "update_0000004.pt"]
    assert ckpt.load(out / "checkpoints/last.pt")["fingerprint"] == summary["fingerprint"] != old_fp

    # from scratch == a fresh run of the new config in an empty folder
    fresh, fresh_summary = _driver.run_training(prepared, tmp_path / "fresh", train_overrides=changed,
                                                model={"dropout": 0.2})
    assert_same_state(model.state_dict(), fresh.state_dict())
    assert summary["history"] == fresh_summary["history"]
    # the old run's snapshots are not averaged into the new run's avg_last_k.pt
    snaps = sorted(p.name for p in (out / "checkpoints/snapshots").glob("*.pt"))
    assert snaps == ["update_0000002.pt"]
    assert ckpt.load(out / "checkpoints/avg_last_k.pt")["updates"] == [2]


def test_a_run_resumed_with_another_process_count_stops_and_says_how(tmp_path: Path) -> None:
    """last.pt of this very run but made by 1 process, resumed by 2: not moved aside (the training would
    be thrown away) nor resumed (the dropout streams differ): one line with both remedies. Another key
    differing as well is another config: moved aside as before."""
    from lib.train.resume import decide_resume, train_config_dict

    cfg = _driver.train_config()
    made = {"task": "asr", "data": "x", "world_size": 1}
    ckpt_dir = tmp_path / "checkpoints"
    config = {"train": train_config_dict(cfg), **made}
    ckpt.save(ckpt_dir / "last.pt", {"fingerprint": ckpt.fingerprint(config), "config": config,
                                     "run_state": {"update": 6}})
    with pytest.raises(SystemExit, match=r"last.pt was made by 1 process and this run has 2: .* Resume it with 1 "
                                         r"\(the stage.s train_\*\.processes: 1\), or delete .*checkpoints"):
        decide_resume(ckpt_dir, cfg, {**made, "world_size": 2})
    assert (ckpt_dir / "last.pt").is_file()  # kept
    logged = []
    resume = decide_resume(ckpt_dir, cfg, {**made, "world_size": 2, "data": "y"}, log=logged.append)
    assert resume.state is None and "NOT resuming" in logged[0] and not (ckpt_dir / "last.pt").exists()


def test_only_the_newest_stale_last_pt_is_kept(prepared: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Two config changes in a row: each mismatching state is set aside, the older one is removed, so
    one ``stale-*/`` remains (the most recent config's)."""
    out, ckpt_dir = tmp_path / "run", tmp_path / "run" / "checkpoints"
    short = {"max_updates": 1, "save_every": 1, "eval_every": 1}
    fps = []
    for lr in (2e-3, 1e-3, 5e-4):
        _, summary = _driver.run_training(prepared, out, train_overrides={**short, "lr": lr})
        fps.append(summary["fingerprint"])
    assert len(set(fps)) == 3
    log = capsys.readouterr().out
    assert log.count("NOT resuming") == 2 and "resumed from" not in log
    assert f"set it aside in stale-{fps[1]}/ with its snapshots and curves (removed the older stale-{fps[0]}/)" in log
    assert sorted(p.name for p in ckpt_dir.glob("*stale-*")) == [f"stale-{fps[1]}"]
    assert ckpt.load(ckpt_dir / f"stale-{fps[1]}/last.pt")["config"]["train"]["lr"] == 1e-3
    assert ckpt.load(ckpt_dir / "last.pt")["fingerprint"] == fps[2]

    # decide_resume alone: a mismatch moves last.pt aside (replacing the stale file) and says start afresh
    from lib.train.loop import decide_resume

    messages: list[str] = []
    resume = decide_resume(ckpt_dir, _driver.train_config(**short, lr=1e-4), _driver.build(prepared)[3],
                           messages.append)
    assert resume.state is None and len(messages) == 1 and "NOT resuming" in messages[0]
    assert not (ckpt_dir / "last.pt").exists()
    assert sorted(p.name for p in ckpt_dir.glob("*stale-*")) == [f"stale-{fps[2]}"]


class _Interrupt(Exception):
    pass


@pytest.mark.parametrize("b_saved", [False, True], ids=["changed_run_failed_before_saving", "changed_run_saved"])
def test_params_changed_back_bring_back_the_state_set_aside(prepared: Path, tmp_path: Path, b_saved: bool,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Run A stops at update 4 of 6; its params change (B) and B stops, before or after its first save; the
    params change back: A continues from update 4 with its own snapshots, and ends with the weights and
    the final average of an uninterrupted A, bit for bit. B's state is the one set aside now."""
    import lib.train.loop as loop

    a = {"max_updates": 6, "save_every": 2, "eval_every": 2, "average_last": 2}
    b = {**a, "lr": 1e-3}
    out, ckpt_dir = tmp_path / "run", tmp_path / "run" / "checkpoints"
    real_lr = loop.learning_rate

    def stop_at(update_done: int):
        def lr(update: int, *args, **kwargs) -> float:
            if update == update_done:
                raise _Interrupt
            return real_lr(update, *args, **kwargs)
        return lr

    for overrides, stop in ((a, 4), (b, 2 if b_saved else 0)):
        monkeypatch.setattr(loop, "learning_rate", stop_at(stop))
        with pytest.raises(_Interrupt):
            _driver.run_training(prepared, out, train_overrides=overrides)
        monkeypatch.undo()
    fp_a = ckpt.load(ckpt_dir / f"stale-{_fingerprint(prepared, a)}/last.pt")["fingerprint"]
    assert (ckpt_dir / "last.pt").is_file() == b_saved
    capsys.readouterr()

    model, summary = _driver.run_training(prepared, out, train_overrides=a)
    log = capsys.readouterr().out
    assert f"resuming {ckpt_dir / 'last.pt'} at update 4: the state of these params" in log, log
    assert ("NOT resuming" in log) == b_saved and "starting from scratch" not in log
    assert summary["fingerprint"] == fp_a and summary["updates"] == 6
    ref, ref_summary = _driver.run_training(prepared, tmp_path / "ref", train_overrides=a)
    assert_same_state(model.state_dict(), ref.state_dict())
    assert summary["history"] == ref_summary["history"]
    avg, ref_avg = ckpt.load(ckpt_dir / "avg_last_k.pt"), ckpt.load(tmp_path / "ref/checkpoints/avg_last_k.pt")
    assert avg["updates"] == ref_avg["updates"] == [4, 6]
    assert_same_state(avg["model"], ref_avg["model"])
    stale = sorted(p.name for p in ckpt_dir.glob("*stale-*"))
    fp_b = _fingerprint(prepared, b)
    assert stale == ([f"stale-{fp_b}"] if b_saved else [])
    if b_saved:
        assert [p.name for p in (ckpt_dir / f"stale-{fp_b}/snapshots").iterdir()] == ["update_0000002.pt"]


def _fingerprint(prepared: Path, overrides: dict) -> str:
    from lib.train.resume import train_config_dict

    run_config = _driver.build(prepared)[3]
    return ckpt.fingerprint({"train": train_config_dict(_driver.train_config(**overrides)), **run_config})


def _fake_state(ckpt_dir: Path, live: Path, run_config: dict, update: int, tag: str) -> str:
    """A run's state as the loop leaves it (last.pt, a snapshot, fork.pt, a curve), each part holding
    ``tag``; returns its fingerprint."""
    from lib.train.resume import train_config_dict

    config = {"train": train_config_dict(_driver.train_config()), **run_config}
    fp = ckpt.fingerprint(config)
    ckpt.save(ckpt_dir / "last.pt", {"fingerprint": fp, "config": config, "run_state": {"update": update}})
    (ckpt_dir / "snapshots").mkdir(parents=True, exist_ok=True)
    (ckpt_dir / f"snapshots/update_{update:07d}.pt").write_text(tag)
    (ckpt_dir / "fork.pt").write_text(tag)
    live.mkdir(parents=True, exist_ok=True)
    (live / "curve.tsv").write_text(tag)
    return fp


def _parts(ckpt_dir: Path, live: Path, update: int) -> tuple:
    """(last.pt's update, the snapshot's, fork.pt's and the curve's tags) in their places, None if absent."""
    read = lambda p: p.read_text() if p.exists() else None  # noqa: E731
    last = ckpt_dir / "last.pt"
    return (ckpt.load(last)["run_state"]["update"] if last.exists() else None,
            read(ckpt_dir / f"snapshots/update_{update:07d}.pt"), read(ckpt_dir / "fork.pt"), read(live / "curve.tsv"))


RUN_X = {"task": "asr", "data": "x", "world_size": 1}
RUN_Y = {"task": "asr", "data": "y", "world_size": 1}


def test_decide_resume_sets_aside_and_brings_back_every_part(tmp_path: Path) -> None:
    """decide_resume with the run's curves folder: a state of another config goes aside whole (last.pt,
    snapshots, fork.pt, curves) into stale-<fp>/, and the run starts with none of them; changing back
    brings every part back. A set-aside last.pt of earlier versions (last.stale-<fp>.pt, without its
    snapshots) is never resumed, and goes at the next set-aside."""
    from lib.train.resume import decide_resume

    cfg = _driver.train_config()
    ckpt_dir, live = tmp_path / "checkpoints", tmp_path / "live"
    fp_x = _fake_state(ckpt_dir, live, RUN_X, 6, "x")
    (ckpt_dir / "last.stale-0123abcd.pt").write_bytes(b"earlier layout")
    logged: list[str] = []

    assert decide_resume(ckpt_dir, cfg, RUN_Y, logged.append, live_dir=live).state is None
    assert "NOT resuming" in logged[-1] and f"set it aside in stale-{fp_x}/" in logged[-1]
    assert "starting from scratch" in logged[-1]
    assert _parts(ckpt_dir, live, 6) == (None, None, None, None)
    assert sorted(p.name for p in ckpt_dir.iterdir()) == [f"stale-{fp_x}"]
    assert sorted(p.name for p in (ckpt_dir / f"stale-{fp_x}").iterdir()) == ["fork.pt", "last.pt", "live", "snapshots"]

    resume = decide_resume(ckpt_dir, cfg, RUN_X, logged.append, live_dir=live)
    assert resume.state is not None and resume.state["run_state"]["update"] == 6
    assert "at update 6" in logged[-1] and "brought back" in logged[-1]
    assert _parts(ckpt_dir, live, 6) == (6, "x", "x", "x")
    assert not list(ckpt_dir.glob("*stale-*")) and not list(ckpt_dir.glob(".*.tmp"))


def test_setting_a_state_aside_removes_its_prev_pt(tmp_path: Path) -> None:
    """prev.pt is the set-aside config's state one save back: it goes with the set-aside, so that a new
    run's unreadable last.pt cannot fall back to another config's state."""
    from lib.train.resume import decide_resume

    cfg = _driver.train_config()
    ckpt_dir, live = tmp_path / "checkpoints", tmp_path / "live"
    fp_x = _fake_state(ckpt_dir, live, RUN_X, 6, "x")
    ckpt.save(ckpt_dir / "prev.pt", {"fingerprint": fp_x, "run_state": {"update": 5}})
    assert decide_resume(ckpt_dir, cfg, RUN_Y, lambda m: None, live_dir=live).state is None
    assert sorted(p.name for p in ckpt_dir.iterdir()) == [f"stale-{fp_x}"]


def test_a_state_whose_config_has_no_process_count_is_set_aside_not_a_process_count_change(tmp_path: Path) -> None:
    """A last.pt of code that recorded no world_size (same keys otherwise) is another config: set aside,
    not the process-count stop (which has no count of it to name)."""
    from lib.train.resume import decide_resume, train_config_dict

    cfg = _driver.train_config()
    ckpt_dir = tmp_path / "checkpoints"
    old = {"train": train_config_dict(cfg), "task": "asr", "data": "x"}
    old_fp = ckpt.fingerprint(old)
    ckpt.save(ckpt_dir / "last.pt", {"fingerprint": old_fp, "config": old, "run_state": {"update": 3}})
    logged: list[str] = []
    assert decide_resume(ckpt_dir, cfg, RUN_X, logged.append).state is None
    assert "world_size: '<missing>' -> 1" in logged[-1] and f"set it aside in stale-{old_fp}/" in logged[-1]


def test_a_changed_run_that_stopped_before_saving_leaves_nothing_in_the_way(tmp_path: Path) -> None:
    """Params changed (X set aside), the changed run stopped before its first save, leaving a snapshot
    folder, a fork state and curves but no last.pt; params changed back: X comes back, the leftovers go."""
    from lib.train.resume import decide_resume

    cfg = _driver.train_config()
    ckpt_dir, live = tmp_path / "checkpoints", tmp_path / "live"
    _fake_state(ckpt_dir, live, RUN_X, 6, "x")
    decide_resume(ckpt_dir, cfg, RUN_Y, lambda m: None, live_dir=live)
    (ckpt_dir / "snapshots").mkdir()
    (ckpt_dir / "snapshots/update_0000006.pt").write_text("y")
    (ckpt_dir / "fork.pt").write_text("y")
    live.mkdir()
    (live / "curve.tsv").write_text("y")
    assert decide_resume(ckpt_dir, cfg, RUN_X, lambda m: None, live_dir=live).state["run_state"]["update"] == 6
    assert _parts(ckpt_dir, live, 6) == (6, "x", "x", "x")


@pytest.mark.parametrize("kill", ["aside_before_last", "aside_before_commit", "back_before_last"])
@pytest.mark.parametrize("then", ["X", "Y"])
def test_a_kill_while_a_state_moves_is_finished_or_undone_by_the_next_start(tmp_path: Path, kill: str, then: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill during any move of a state (setting X aside for Y; bringing X back) is finished or undone
    when the next run starts, whichever params it has: X's parts stay together, either all in place
    (X resumes) or all aside (Y starts from scratch)."""
    from lib.train import resume as resume_module
    from lib.train.resume import decide_resume

    cfg = _driver.train_config()
    ckpt_dir, live = tmp_path / "checkpoints", tmp_path / "live"
    fp_x = _fake_state(ckpt_dir, live, RUN_X, 6, "x")
    if kill == "back_before_last":
        decide_resume(ckpt_dir, cfg, RUN_Y, lambda m: None, live_dir=live)
    real_move = resume_module._move

    def move(src: Path, dst: Path) -> None:
        killed = {"aside_before_last": src == ckpt_dir / "last.pt" and ".aside-" in dst.parent.name,
                  "aside_before_commit": dst == ckpt_dir / f"stale-{fp_x}",
                  "back_before_last": dst == ckpt_dir / "last.pt"}[kill]
        if killed:
            raise KeyboardInterrupt
        real_move(src, dst)

    monkeypatch.setattr(resume_module, "_move", move)
    with pytest.raises(KeyboardInterrupt):
        decide_resume(ckpt_dir, cfg, RUN_X if kill == "back_before_last" else RUN_Y, lambda m: None, live_dir=live)
    monkeypatch.undo()

    resume = decide_resume(ckpt_dir, cfg, RUN_X if then == "X" else RUN_Y, lambda m: None, live_dir=live)
    if then == "X":
        assert resume.state is not None and resume.state["run_state"]["update"] == 6
        assert _parts(ckpt_dir, live, 6) == (6, "x", "x", "x")
        assert not list(ckpt_dir.glob("*stale-*"))
    else:
        assert resume.state is None and _parts(ckpt_dir, live, 6) == (None, None, None, None)
        aside = ckpt_dir / f"stale-{fp_x}"
        assert (aside / f"snapshots/update_{6:07d}.pt").read_text() == (aside / "fork.pt").read_text() == "x"
        assert (aside / "live/curve.tsv").read_text() == "x" and ckpt.load(aside / "last.pt")["fingerprint"] == fp_x
    assert not list(ckpt_dir.glob(".*.tmp"))


def test_a_set_aside_state_of_another_process_count_stops_the_run(tmp_path: Path) -> None:
    """X (1 process) set aside by Y, then X again with 2 processes: not a fresh start that would remove X's
    state at the next change of params, but the process-count line naming the set-aside file."""
    from lib.train.resume import decide_resume

    cfg = _driver.train_config()
    ckpt_dir, live = tmp_path / "checkpoints", tmp_path / "live"
    fp_x = _fake_state(ckpt_dir, live, RUN_X, 6, "x")
    decide_resume(ckpt_dir, cfg, RUN_Y, lambda m: None, live_dir=live)
    with pytest.raises(SystemExit, match=rf"stale-{fp_x}/last.pt \(set aside by a change of params\) was made by 1 "
                                         r"process and this run has 2: .* Resume it with 1"):
        decide_resume(ckpt_dir, cfg, {**RUN_X, "world_size": 2}, lambda m: None, live_dir=live)
    assert (ckpt_dir / f"stale-{fp_x}/last.pt").is_file()


def test_an_unreadable_last_pt_names_the_set_aside_state_in_its_remedy(tmp_path: Path) -> None:
    """Y's only last.pt is truncated (no prev.pt) and the params are back at X, whose state is aside: the
    one-line remedy says that deleting last.pt resumes it, not only that deleting the folder starts afresh."""
    from lib.train.resume import decide_resume

    cfg = _driver.train_config()
    ckpt_dir, live = tmp_path / "checkpoints", tmp_path / "live"
    fp_x = _fake_state(ckpt_dir, live, RUN_X, 6, "x")
    decide_resume(ckpt_dir, cfg, RUN_Y, lambda m: None, live_dir=live)
    (ckpt_dir / "last.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(SystemExit, match=rf"delete .*last.pt to resume the state of these params set aside at "
                                         rf"update 6 \(stale-{fp_x}/\), or delete .*checkpoints to train"):
        decide_resume(ckpt_dir, cfg, RUN_X, lambda m: None, live_dir=live)
    (ckpt_dir / "last.pt").unlink()
    assert decide_resume(ckpt_dir, cfg, RUN_X, lambda m: None, live_dir=live).state["run_state"]["update"] == 6


def test_curves_on_another_file_system_are_copied_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint folder on other storage than the curves (a link to scratch space): a rename between
    them fails (EXDEV), so the curves are copied; the state goes aside and comes back whole."""
    import errno

    from lib.train.resume import decide_resume

    cfg = _driver.train_config()
    ckpt_dir, live = tmp_path / "checkpoints", tmp_path / "live"
    _fake_state(ckpt_dir, live, RUN_X, 6, "x")
    real_rename = os.rename

    def rename(src, dst):  # noqa: ANN001, ANN202
        if (Path(src) == live) != (Path(dst) == live):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    decide_resume(ckpt_dir, cfg, RUN_Y, lambda m: None, live_dir=live)
    assert not live.exists()
    assert decide_resume(ckpt_dir, cfg, RUN_X, lambda m: None, live_dir=live).state["run_state"]["update"] == 6
    assert _parts(ckpt_dir, live, 6) == (6, "x", "x", "x")


def test_the_average_refuses_a_snapshot_of_another_config(tmp_path: Path) -> None:
    w = {"w": torch.ones(2)}
    ckpt.save(tmp_path / "update_0000002.pt", {"model": w, "update": 2, "fingerprint": "aaa"})
    ckpt.save(tmp_path / "update_0000004.pt", {"model": w, "update": 4, "fingerprint": "bbb"})
    ckpt.save(tmp_path / "update_0000006.pt", {"model": w, "update": 6})  # earlier code: no fingerprint
    paths = sorted(tmp_path.glob("update_*.pt"))
    with pytest.raises(CheckpointError, match=r"update_0000004.pt: a snapshot of another config \(fingerprint bbb"):
        ckpt.average_state_dicts(paths, "aaa")
    assert torch.equal(ckpt.average_state_dicts([paths[0], paths[2]], "aaa")["w"], torch.ones(2))
    assert torch.equal(ckpt.average_state_dicts(paths)["w"], torch.ones(2))  # no fingerprint given: no check




def _count_last_pt_loads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Make ``ckpt.load`` (as loop.py and run.py call it) record each load of a ``last.pt``."""
    real_load, loads = ckpt.load, []

    def load(path, *args, **kwargs):  # noqa: ANN001, ANN202
        if Path(path).name == "last.pt":
            loads.append(Path(path))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(ckpt, "load", load)
    return loads


def test_resumed_train_loads_last_pt_once(prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped during update 3 (last.pt of update 2) and restarted decides its resume once:
    one fingerprint, one load of last.pt, whether train() decides or is handed the decision."""
    import lib.train.loop as loop

    overrides = {"max_updates": 4, "save_every": 2, "eval_every": 2}
    real_lr = loop.learning_rate

    def lr(update: int, *args, **kwargs) -> float:
        if update == 2:  # the lr of update 3
            raise _Interrupt
        return real_lr(update, *args, **kwargs)

    for out in (tmp_path / "a", tmp_path / "b"):
        monkeypatch.setattr(loop, "learning_rate", lr)
        with pytest.raises(_Interrupt):
            _driver.run_training(prepared, out, train_overrides=overrides)
        monkeypatch.undo()
    fingerprints: list[dict] = []
    real_fingerprint = ckpt.fingerprint
    monkeypatch.setattr(ckpt, "fingerprint", lambda config: fingerprints.append(config) or real_fingerprint(config))
    loads = _count_last_pt_loads(monkeypatch)
    capsys.readouterr()

    _, summary = _driver.run_training(prepared, tmp_path / "a", train_overrides=overrides)  # train() decides
    assert f"resumed from {tmp_path / 'a/checkpoints/last.pt'} at update 2" in capsys.readouterr().out
    assert summary["updates"] == 4
    assert loads == [tmp_path / "a/checkpoints/last.pt"] and len(fingerprints) == 1

    # handed a decision, train() neither loads last.pt nor computes the fingerprint
    loads.clear()
    fingerprints.clear()
    cfg = _driver.train_config(**overrides)
    net, train_ds, dev_ds, run_config = _driver.build(prepared)
    resume = loop.decide_resume(tmp_path / "b/checkpoints", cfg, run_config)
    assert resume.state is not None and resume.state["run_state"]["update"] == 2
    assert len(loads) == 1 and len(fingerprints) == 1
    summary_b = loop.train(net, cfg, train_ds, dev_ds, tmp_path / "b", run_config=run_config, progress=False,
                           resume=resume)
    assert len(loads) == 1 and len(fingerprints) == 1
    assert summary_b["history"] == summary["history"] and summary_b["fingerprint"] == resume.fingerprint
    with pytest.raises(ValueError, match="another config"):  # a decision made for another config
        loop.train(net, _driver.train_config(**{**overrides, "lr": 1e-3}), train_ds, dev_ds, tmp_path / "b",
                   run_config=run_config, progress=False, resume=resume)


# ----------------------------------------------------------------------------- non-finite loss


def test_non_finite_loss_stops_naming_the_update(prepared: Path, tmp_path: Path) -> None:
    cfg = _driver.train_config(max_updates=6, eval_every=100, save_every=100)
    net, train_ds, dev_ds, run_config = _driver.build(prepared)
    real_decode, calls = net.decode, []

    def decode(*args, **kwargs):  # inf logits from the 3rd training batch on
        calls.append(1)
        logits = real_decode(*args, **kwargs)
        return logits * float("inf") if len(calls) >= 3 else logits

    net.decode = decode
    from lib.train.loop import train

    with pytest.raises(FloatingPointError, match=r"non-finite loss .* at update 3 \(epoch 0"):
        train(net, cfg, train_ds, dev_ds, tmp_path / "nan", run_config=run_config, progress=False)


def test_a_train_set_too_small_for_one_update_names_the_keys(prepared: Path, tmp_path: Path) -> None:
    from lib.params import ParamError

    with pytest.raises(ParamError, match=r"train set too small for one update \(\d+ segments\): fewer than 1000 "
                                         r"batches of max_frames=\d+; lower this stage's update_freq or max_frames"):
        _driver.run_training(prepared, tmp_path / "small", train_overrides={"update_freq": 1000})
    assert not (tmp_path / "small/checkpoints/last.pt").exists()


def test_huge_lr_diverges_into_floating_point_error(prepared: Path, tmp_path: Path) -> None:
    with pytest.raises(FloatingPointError, match=r"at update \d+"):
        _driver.run_training(prepared, tmp_path / "huge", train_overrides={
            "lr": 1e30, "warmup_updates": 1, "clip_norm": 1e30, "max_updates": 8, "eval_every": 100,
            "save_every": 100})


def test_optimizer_is_fused_adam_and_matches_the_for_loop_one() -> None:
    """make_optimizer: torch's fused Adam on CPU, the same update as the for-loop Adam up to rounding."""
    from lib.params import TrainConfig
    from lib.train.loop import make_optimizer

    torch.manual_seed(0)
    a = torch.nn.Linear(6, 5)
    b = torch.nn.Linear(6, 5)
    b.load_state_dict(a.state_dict())
    cfg = TrainConfig(lr=1e-2, weight_decay=1e-4)
    fused = make_optimizer(a, cfg)
    assert fused.defaults["fused"] is True
    loop = torch.optim.Adam(b.parameters(), lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay,
                            foreach=False)
    x = torch.randn(8, 6)
    for _ in range(5):
        for m, opt in ((a, fused), (b, loop)):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- encoder_lr_scale


def _tiny_s2t(seed: int = 0):
    from lib.model.s2t_transformer import S2TTransformer, model_config

    torch.manual_seed(seed)
    return S2TTransformer(model_config("tiny", vocab_size=20))


def test_encoder_lr_scale_one_is_the_single_group_optimizer_of_before() -> None:
    from lib.params import TrainConfig
    from lib.train.loop import make_optimizer, train_config_dict

    model = _tiny_s2t()
    opt = make_optimizer(model, TrainConfig())
    assert len(opt.param_groups) == 1 and "lr_scale" not in opt.param_groups[0]
    # ... and a run's fingerprint does not change with the key at its neutral value
    assert "encoder_lr_scale" not in train_config_dict(TrainConfig())
    assert train_config_dict(TrainConfig(encoder_lr_scale=0.2))["encoder_lr_scale"] == 0.2


def test_encoder_lr_scale_steps_the_encoder_with_that_share_of_the_lr() -> None:
    """Two groups that partition the parameters; after the loop's lr assignment one Adam step moves
    every encoder parameter by exactly `scale` times (up to rounding) what it moves at scale 1, and
    the decoder by the same amount."""
    from lib.params import TrainConfig
    from lib.train.loop import make_optimizer

    scale = 0.25
    moved = {}
    for s in (1.0, scale):
        model = _tiny_s2t()
        opt = make_optimizer(model, TrainConfig(lr=1e-2, encoder_lr_scale=s))
        if s != 1.0:
            enc = {id(p) for p in model.encoder.parameters()}
            assert [g["lr_scale"] for g in opt.param_groups] == [scale, 1.0]
            assert {id(p) for p in opt.param_groups[0]["params"]} == enc
            assert len(opt.param_groups[0]["params"]) + len(opt.param_groups[1]["params"]) == \
                len(list(model.parameters()))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        torch.manual_seed(1)
        feats = torch.randn(2, 40, model.cfg.n_mels)
        prev = torch.randint(4, 20, (2, 5))
        model(feats, torch.tensor([40, 33]), prev).float().square().mean().backward()
        for g in opt.param_groups:  # what lib.train.loop.train does before every step
            g["lr"] = 1e-2 * g.get("lr_scale", 1.0)
        opt.step()
        moved[s] = {n: (p.detach() - before[n]) for n, p in model.named_parameters()}
    checked = 0
    for name, delta in moved[1.0].items():
        if delta.abs().max() < 1e-6:
            continue  # no gradient reached it (e.g. padding rows)
        factor = scale if name.startswith("encoder.") else 1.0
        torch.testing.assert_close(moved[scale][name], factor * delta, rtol=1e-4, atol=1e-7)
        checked += 1
    assert checked > 10


def test_encoder_lr_scale_trains_deterministically_and_differs_from_one_lr(prepared: Path, tmp_path: Path) -> None:
    m1, s1 = _driver.run_training(prepared, tmp_path / "a", train_overrides={"encoder_lr_scale": 0.2})
    m2, s2 = _driver.run_training(prepared, tmp_path / "b", train_overrides={"encoder_lr_scale": 0.2})
    m3, _ = _driver.run_training(prepared, tmp_path / "c")
    assert_same_state(m1.state_dict(), m2.state_dict())
    assert s1["history"] == s2["history"]
    assert state_differs(m1.state_dict(), m3.state_dict())


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5])
def test_encoder_lr_scale_out_of_range_is_named(bad: float) -> None:
    from lib.params import TrainConfig

    with pytest.raises(ValueError, match=r"train_st\.encoder_lr_scale"):
        TrainConfig(encoder_lr_scale=bad).validate("train_st")


# ----------------------------------------------------------------------------- ctc_decay_from


def test_ctc_decay_sets_the_criterion_weight_before_every_update(prepared: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop asks ctc_weight_at for u = 0..max_updates-1 completed updates and trains with it:
    the run differs from one with the constant weight, deterministically; the neutral value 0 stays
    out of a run's fingerprint (runs of before resume)."""
    from lib.data.dataset import SpeechDataset
    from lib.params import TrainConfig
    from lib.train import loop
    from lib.train.loop import train_config_dict

    vocab = SpeechDataset(prepared, "train", "asr", max_frames=3000).vocab_size
    ctc_model = {"ctc_vocab_size": vocab}
    seen: list[tuple[int, float]] = []
    real = loop.ctc_weight_at

    def spy(update: int, weight: float, decay_from: int, max_updates: int, *start) -> float:  # noqa: ANN002
        w = real(update, weight, decay_from, max_updates, *start)
        seen.append((update, w))
        return w

    monkeypatch.setattr(loop, "ctc_weight_at", spy)
    decayed = dict(ctc_weight=0.3, ctc_decay_from=4)
    m1, _ = _driver.run_training(prepared, tmp_path / "a", train_overrides=decayed, model=ctc_model)
    assert [u for u, _ in seen] == list(range(8))
    assert [w for _, w in seen] == pytest.approx([0.3] * 5 + [0.225, 0.15, 0.075])
    m2, _ = _driver.run_training(prepared, tmp_path / "b", train_overrides=decayed, model=ctc_model)
    m3, _ = _driver.run_training(prepared, tmp_path / "c", train_overrides={"ctc_weight": 0.3}, model=ctc_model)
    assert_same_state(m1.state_dict(), m2.state_dict())
    assert state_differs(m1.state_dict(), m3.state_dict())
    assert "ctc_decay_from" not in train_config_dict(TrainConfig(ctc_weight=0.3))
    assert train_config_dict(TrainConfig(ctc_weight=0.3, ctc_decay_from=4))["ctc_decay_from"] == 4


# ----------------------------------------------------------------------------- encoder_layer_lr_decay


def test_encoder_lr_scales_by_hand() -> None:
    """Tiny model: 2 encoder layers. Top layer (and final LayerNorm, CTC head) at encoder_lr_scale,
    layer 1 one decay factor less, the subsampler two."""
    from lib.model.s2t_transformer import S2TTransformer, model_config
    from lib.params import TrainConfig
    from lib.train.loop import encoder_lr_scales

    torch.manual_seed(0)
    model = S2TTransformer(model_config("tiny", vocab_size=20, ctc_vocab_size=12))
    scales = encoder_lr_scales(model, TrainConfig(encoder_lr_scale=0.8, encoder_layer_lr_decay=0.5))
    enc = model.encoder
    assert set(scales) == {id(p) for p in enc.parameters()}
    for p in enc.layers[1].parameters():
        assert scales[id(p)] == pytest.approx(0.8)
    for p in enc.layers[0].parameters():
        assert scales[id(p)] == pytest.approx(0.4)
    for p in list(enc.layer_norm.parameters()) + list(enc.ctc_proj.parameters()):
        assert scales[id(p)] == pytest.approx(0.8)
    for p in enc.subsample.parameters():
        assert scales[id(p)] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="has no encoder"):
        encoder_lr_scales(torch.nn.Linear(2, 2), TrainConfig(encoder_layer_lr_decay=0.5))


def test_encoder_layer_lr_decay_groups_and_steps() -> None:
    """One group per distinct scale (the decoder's at 1.0), partitioning the parameters; one Adam step
    moves each encoder parameter by its scale times what it moves with one lr."""
    from lib.params import TrainConfig
    from lib.train.loop import encoder_lr_scales, make_optimizer, train_config_dict

    cfg = TrainConfig(lr=1e-2, encoder_lr_scale=1.0, encoder_layer_lr_decay=0.5)
    assert train_config_dict(cfg)["encoder_layer_lr_decay"] == 0.5
    assert "encoder_layer_lr_decay" not in train_config_dict(TrainConfig())  # neutral: old fingerprints hold
    moved = {}
    for c in (TrainConfig(lr=1e-2), cfg):
        model = _tiny_s2t()
        opt = make_optimizer(model, c)
        if c is cfg:
            assert sorted(g["lr_scale"] for g in opt.param_groups) == [0.25, 0.5, 1.0]
            assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
            scales = encoder_lr_scales(model, c)
            name_scale = {n: scales.get(id(p), 1.0) for n, p in model.named_parameters()}
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        torch.manual_seed(1)
        model(torch.randn(2, 40, model.cfg.n_mels), torch.tensor([40, 33]),
              torch.randint(4, 20, (2, 5))).float().square().mean().backward()
        for g in opt.param_groups:
            g["lr"] = 1e-2 * g.get("lr_scale", 1.0)
        opt.step()
        moved[c is cfg] = {n: (p.detach() - before[n]) for n, p in model.named_parameters()}
    assert name_scale["encoder.layers.1.fc1.weight"] == 1.0 and name_scale["encoder.layers.0.fc1.weight"] == 0.5
    assert name_scale["decoder.layers.0.fc1.weight"] == 1.0
    checked = 0
    for name, delta in moved[False].items():
        if delta.abs().max() < 1e-6:
            continue
        factor = name_scale[name]
        torch.testing.assert_close(moved[True][name], factor * delta, rtol=1e-4, atol=1e-7)
        checked += 1
    assert checked > 10


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5])
def test_encoder_layer_lr_decay_out_of_range_is_named(bad: float) -> None:
    from lib.params import TrainConfig

    with pytest.raises(ValueError, match=r"train_st\.encoder_layer_lr_decay"):
        TrainConfig(encoder_layer_lr_decay=bad).validate("train_st")


def test_a_runs_first_updates_do_not_depend_on_its_length_or_evaluations(prepared: Path, tmp_path: Path) -> None:
    """scripts/st_length.py reads a long run's dev curve as the curve of shorter runs: under inverse_sqrt the
    first k updates of an 8-update run with a dev evaluation every 2 are a 4-update run's, weights and dev
    loss alike (dev evaluations draw nothing from the training RNG); polynomial_decay, whose lr depends on
    the length, is the control."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        short, s_short = _driver.run_training(prepared, tmp_path / "short", train_overrides=dict(max_updates=4, eval_every=4))
        _, s_long = _driver.run_training(prepared, tmp_path / "long", train_overrides=dict(max_updates=8, eval_every=2))
        poly = dict(warmup_updates=1, lr_scheduler="polynomial_decay")
        poly4, _ = _driver.run_training(prepared, tmp_path / "poly4", train_overrides=dict(max_updates=4, **poly))
        _driver.run_training(prepared, tmp_path / "poly8", train_overrides=dict(max_updates=8, eval_every=2, **poly))
    finally:
        torch.set_num_threads(old)
    at4 = ckpt.load(tmp_path / "long/checkpoints/snapshots/update_0000004.pt")["model"]
    assert_same_state(short.state_dict(), at4)
    assert [r["update"] for r in s_long["history"]] == [2, 4, 6, 8]
    assert s_long["history"][1] == s_short["history"][0]
    assert state_differs(poly4.state_dict(), ckpt.load(tmp_path / "poly8/checkpoints/snapshots/update_0000004.pt")["model"])


# ----------------------------------------------------------------------------- corrupt last.pt


def _interrupted_at_update_3(prepared: Path, out: Path, overrides: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Train until update 3 starts; with save_every 1 that leaves last.pt of update 2, prev.pt of 1."""
    import lib.train.loop as loop

    real_lr = loop.learning_rate

    def lr(update: int, *args, **kwargs) -> float:
        if update == 2:  # the lr of update 3
            raise _Interrupt
        return real_lr(update, *args, **kwargs)

    monkeypatch.setattr(loop, "learning_rate", lr)
    with pytest.raises(_Interrupt):
        _driver.run_training(prepared, out, train_overrides=overrides)
    monkeypatch.undo()


def test_truncated_last_pt_falls_back_to_prev_pt(prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A half-written last.pt (disk fault) resumes from prev.pt, the state one save back, says so in one
    line, and ends with the weights of an uninterrupted run."""
    overrides = {"max_updates": 4, "save_every": 1, "eval_every": 2}
    full, full_summary = _driver.run_training(prepared, tmp_path / "full", train_overrides=overrides)
    ckpt_dir = tmp_path / "cut" / "checkpoints"
    _interrupted_at_update_3(prepared, tmp_path / "cut", overrides, monkeypatch)
    assert ckpt.load(ckpt_dir / "last.pt")["run_state"]["update"] == 2
    assert ckpt.load(ckpt_dir / "prev.pt")["run_state"]["update"] == 1
    last = ckpt_dir / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    # killed in the middle of the fall-back, before its rename: the next start falls back all the same
    from lib.train import resume

    real_replace = os.replace

    def killed(src, dst):  # the rename that puts prev.pt in place is where the kill lands
        if Path(src).name == "prev.pt":
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(resume.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        _driver.run_training(prepared, tmp_path / "cut", train_overrides=overrides)
    monkeypatch.undo()
    assert last.is_file() and (ckpt_dir / "prev.pt").is_file()
    capsys.readouterr()

    model, summary = _driver.run_training(prepared, tmp_path / "cut", train_overrides=overrides)
    log = capsys.readouterr().out
    lines = [line for line in log.splitlines() if "cannot be read" in line]
    assert len(lines) == 1 and str(last) in lines[0] and "prev.pt, update 1" in lines[0]
    assert f"resumed from {last} at update 1" in log
    assert (ckpt_dir / "last.corrupt.pt").is_file()
    assert_same_state(model.state_dict(), full.state_dict())
    assert summary["history"] == full_summary["history"]
    # training went on rotating: prev.pt is again the state one save before last.pt
    assert ckpt.load(ckpt_dir / "prev.pt")["run_state"]["update"] == 3


def test_truncated_last_pt_without_an_intact_prev_stops_with_one_line(prepared: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = {"max_updates": 4, "save_every": 1, "eval_every": 2}
    ckpt_dir = tmp_path / "run" / "checkpoints"
    _interrupted_at_update_3(prepared, tmp_path / "run", overrides, monkeypatch)
    for name in ("last.pt", "prev.pt"):
        path = ckpt_dir / name
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(SystemExit) as err:
        _driver.run_training(prepared, tmp_path / "run", train_overrides=overrides)
    message = str(err.value)
    assert "\n" not in message and str(ckpt_dir / "last.pt") in message
    assert f"delete {ckpt_dir}" in message and "from scratch" in message
    # nothing was moved or overwritten: the user decides
    assert (ckpt_dir / "last.pt").stat().st_size == 100 and not (ckpt_dir / "last.corrupt.pt").exists()


def test_a_deleted_last_pt_starts_from_scratch_whatever_prev_pt_holds(prepared: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleting last.pt is how a user restarts a run: prev.pt is not resumed, and it is removed."""
    overrides = {"max_updates": 4, "save_every": 1, "eval_every": 2}
    ckpt_dir = tmp_path / "run" / "checkpoints"
    _interrupted_at_update_3(prepared, tmp_path / "run", overrides, monkeypatch)
    (ckpt_dir / "last.pt").unlink()
    from lib.train.loop import decide_resume

    resume = decide_resume(ckpt_dir, _driver.train_config(**overrides), _driver.build(prepared)[3], print)
    assert resume.state is None and not (ckpt_dir / "prev.pt").exists()


def test_save_keeping_previous_keeps_the_replaced_state(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    ckpt.save_keeping_previous(path, {"update": 1})
    assert not (tmp_path / "prev.pt").exists()
    ckpt.save_keeping_previous(path, {"update": 2})
    ckpt.save_keeping_previous(path, {"update": 3})
    assert ckpt.load(path)["update"] == 3 and ckpt.load(tmp_path / "prev.pt")["update"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"]  # no link temporaries left
