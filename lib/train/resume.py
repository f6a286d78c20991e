"""Whether a run resumes, and from what: :func:`decide_resume` reads ``<checkpoints>/last.pt`` once,
resumes it only when it was made with the run's config (its fingerprint), moves a ``last.pt`` of another
config aside (with its snapshots and curves: :class:`SetAside`), brings back the state of this config
that an earlier params change set aside, and falls back to ``prev.pt`` (the state one save back) when
``last.pt`` cannot be read. Under torchrun rank 0 decides and broadcasts. The loop
(lib/train/loop.py) restores what it returns."""
from __future__ import annotations

import os
import shutil
import signal
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from tqdm import tqdm

from lib.params import TrainConfig
from lib.train import checkpoint as ckpt
from lib.train.distributed import dist_info


@dataclass
class Resume:
    """What :func:`decide_resume` found: the run's ``config`` (``{"train": cfg, **run_config}``), its
    ``fingerprint``, and ``state``: the ``last.pt`` to resume from, or None to start from scratch."""

    fingerprint: str
    config: dict[str, Any]
    state: dict[str, Any] | None = None
    # ``state`` is another run's fork state (:func:`train`'s ``fork_at``), not this run's last.pt:
    # start from its weights, optimizer, RNG, data position and update count, with a fresh dev history.
    fork: bool = False


#: Training keys added after runs were fingerprinted, with the value that changes nothing: left out of
#: the fingerprint at that value, so checkpoints (and fork states) of earlier runs keep matching.
_NEUTRAL_TRAIN_KEYS = {"encoder_lr_scale": 1.0, "ctc_decay_from": 0, "encoder_layer_lr_decay": 1.0,
                       "fold_update": "auto", "variant_lr": None, "update_grouping": "length"}
#: Training keys never fingerprinted: ``processes`` is the run config's ``world_size`` (a resume with
#: another count stops with :class:`ProcessCountChanged` instead of moving ``last.pt`` aside).
_UNFINGERPRINTED_TRAIN_KEYS = ("processes",)


def train_config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """``cfg`` as the dict a run's fingerprint hashes (``asdict`` minus keys at their neutral value)."""
    d = asdict(cfg)
    for key in _UNFINGERPRINTED_TRAIN_KEYS:
        d.pop(key, None)
    for key, neutral in _NEUTRAL_TRAIN_KEYS.items():
        if d.get(key) == neutral:
            del d[key]
    return d


def decide_resume(ckpt_dir: Path, cfg: TrainConfig, run_config: dict[str, Any],
                  log: Callable[[str], None] | None = None, live_dir: Path | None = None) -> Resume:
    """Whether the run resumes from ``<ckpt_dir>/last.pt``: only when it has the run's fingerprint.

    The fingerprint is computed and ``last.pt`` loaded (at most) once, here. A ``last.pt`` of
    another config is never resumed: ``log`` (default ``tqdm.write``) names the keys that differ,
    and it is set aside as ``last.stale-<its fingerprint>.pt`` with its snapshots and its training
    curves (``live_dir``, when given): :class:`SetAside`. When a state of *this* config was set aside
    earlier (params changed, then changed back), it is brought back and resumed. At most one set-aside
    state is kept: older ones are removed. Under torchrun this is a collective: every rank calls it,
    rank 0 decides and broadcasts the state it loaded.
    """
    config = {"train": train_config_dict(cfg), **run_config}
    fp = ckpt.fingerprint(config)
    rank, world = dist_info()
    state: Any = None
    if rank == 0:
        try:
            state = _matching_last(Path(ckpt_dir), fp, config, log or tqdm.write, live_dir)
        except ProcessCountChanged as e:
            state = e
    if world > 1:  # every rank resumes from what rank 0 found (or stops with it)
        obj = [state if not isinstance(state, ProcessCountChanged) else {"process_count_changed": str(state)}]
        dist.broadcast_object_list(obj, src=0)
        state = obj[0]
        if isinstance(state, dict) and "process_count_changed" in state:
            raise SystemExit(state["process_count_changed"])
    if isinstance(state, ProcessCountChanged):
        raise SystemExit(str(state))
    return Resume(fingerprint=fp, config=config, state=state)


class ProcessCountChanged(Exception):
    """``last.pt`` is this run's but was made by another number of processes: resuming would not
    continue it exactly (every process has its own dropout stream), and starting afresh would throw the
    training away; the run stops and says how to do either."""


@dataclass(frozen=True)
class SetAside:
    """The training state of one config, set aside by a params change (all in the checkpoint folder, so
    deleting it removes them too): ``last.stale-<fp>.pt``, its snapshots (``snapshots.stale-<fp>/``)
    and its training curves (``live.stale-<fp>/``). Brought back when the params are changed back:
    the run then continues as if nothing had happened, its final average included."""

    ckpt_dir: Path
    fingerprint: str

    @property
    def last(self) -> Path:
        return self.ckpt_dir / f"last.stale-{self.fingerprint}.pt"

    @property
    def snapshots(self) -> Path:
        return self.ckpt_dir / f"snapshots.stale-{self.fingerprint}"

    @property
    def live(self) -> Path:
        return self.ckpt_dir / f"live.stale-{self.fingerprint}"

    @staticmethod
    def others(ckpt_dir: Path, keep: set[str]) -> list["SetAside"]:
        """The set-aside states in ``ckpt_dir`` whose fingerprint is not in ``keep``."""
        fps = {p.name.split(".stale-", 1)[1].removesuffix(".pt") for p in ckpt_dir.glob("*.stale-*")}
        return [SetAside(ckpt_dir, fp) for fp in sorted(fps - keep)]

    def remove(self) -> None:
        self.last.unlink(missing_ok=True)
        for folder in (self.snapshots, self.live):
            shutil.rmtree(folder, ignore_errors=True)


def _replace_dir(src: Path, dst: Path) -> None:
    """``src`` becomes ``dst`` (an existing ``dst`` removed first); nothing when ``src`` is absent."""
    if src.is_dir():
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(src, dst)


def _matching_last(ckpt_dir: Path, fingerprint: str, config: dict, log: Callable[[str], None],
                   live_dir: Path | None = None) -> dict | None:
    """``<ckpt_dir>/last.pt`` loaded when its fingerprint is ``fingerprint``; else a mismatching file is
    set aside (with its snapshots and curves; its ``prev.pt`` removed), and the state of this config set
    aside earlier, if any, is brought back and returned; else None. An unreadable ``last.pt`` falls back to
    ``prev.pt``, the state one save back, with one line saying so; with no intact ``prev.pt`` either the run
    stops (SystemExit) with one line naming the file and the remedy. A missing ``last.pt`` starts from
    scratch, whatever ``prev.pt`` holds, unless this config's state was set aside (deleting the checkpoint
    folder is how a user asks for a fresh start)."""
    path, prev = ckpt_dir / "last.pt", ckpt_dir / ckpt.PREV
    own = SetAside(ckpt_dir, fingerprint)
    if not path.is_file():
        prev.unlink(missing_ok=True)
        return _bring_back(own, path, live_dir, log) if own.last.is_file() else None
    try:
        state = ckpt.load(path)
    except RuntimeError as e:
        state = _fall_back_to_prev(path, prev, e, log)
    if state.get("fingerprint") == fingerprint:
        return state
    theirs = state.get("config", {})
    if "world_size" in theirs and theirs.get("world_size") != config.get("world_size") and \
            {k: v for k, v in theirs.items() if k != "world_size"} == {k: v for k, v in config.items() if k != "world_size"}:
        n, m = theirs["world_size"], config.get("world_size")
        raise ProcessCountChanged(
            f"error: {path} was made by {n} process{'es' * (n != 1)} and this run has {m}: the same update, but "
            f"not the same dropout streams, so it would not continue exactly. Resume it with {n} "
            f"(the stage's train_*.processes: {n}), or delete {path.parent} to train this run afresh with {m}")
    diff = ckpt.config_diff(state.get("config", {}), config)
    aside = SetAside(ckpt_dir, str(state.get("fingerprint", "unknown")))
    removed = SetAside.others(ckpt_dir, keep={aside.fingerprint, own.fingerprint})
    for old in removed:  # keep at most one set-aside state: the newest
        old.remove()
    # last.pt first: once it is gone, nothing resumes the snapshots and curves that follow it aside
    os.replace(path, aside.last)
    prev.unlink(missing_ok=True)
    _replace_dir(ckpt_dir / "snapshots", aside.snapshots)
    if live_dir is not None:
        _replace_dir(live_dir, aside.live)
    back = own.last.is_file()
    log(f"NOT resuming {path}: it was made with a different config ({'; '.join(diff) or 'fingerprint differs'}); "
        f"moved it to {aside.last.name}" + (f" (removed the older {', '.join(o.last.name for o in removed)})" if removed else "")
        + (", with its snapshots and curves" if back else " and starting from scratch"))
    return _bring_back(own, path, live_dir, log) if back else None


def _bring_back(own: SetAside, path: Path, live_dir: Path | None, log: Callable[[str], None]) -> dict | None:
    """The state of this config that a params change set aside, put back in place and returned (None,
    the stale files removed, when it cannot be read). Snapshots and curves first, ``last.pt`` last: a kill
    in between leaves the set-aside ``last.pt``, which the next start brings back again."""
    if not own.snapshots.is_dir():  # set aside by earlier code, which left its snapshots behind
        log(f"{own.last} was set aside without its snapshots (by an earlier version): starting from scratch")
        return None
    try:
        state = ckpt.load(own.last)
    except RuntimeError as e:
        reason = str(getattr(e, "__cause__", None) or e).splitlines()[0][:160]
        own.remove()
        log(f"{own.last} cannot be read ({reason}): removed it; starting from scratch")
        return None
    _replace_dir(own.snapshots, path.parent / "snapshots")
    if live_dir is not None:
        _replace_dir(own.live, live_dir)
    os.replace(own.last, path)
    log(f"resuming {path} at update {state.get('run_state', {}).get('update', '?')}: the state of these params "
        f"that a change of params had set aside ({own.last.name}), brought back with its snapshots and curves")
    return state


def _fall_back_to_prev(path: Path, prev: Path, error: Exception, log: Callable[[str], None]) -> dict:
    """The state of ``prev`` for an unreadable ``path``: ``path`` is kept as ``last.corrupt.pt`` and
    ``prev`` becomes ``path`` (so the next save does not link the corrupt file to ``prev.pt``)."""
    reason = str(getattr(error, "__cause__", None) or error).splitlines()[0][:160]
    corrupt = path.with_name("last.corrupt.pt")
    try:
        state = ckpt.load(prev)
    except (FileNotFoundError, RuntimeError):
        raise SystemExit(f"error: {path} cannot be read ({reason}) and there is no intact earlier training "
                         f"state ({prev.name}): delete {path.parent} to train this run from scratch") from None
    # The unreadable file gets a second name first, then one rename puts prev in its place: a kill at any
    # point leaves a last.pt (the unreadable one, with prev.pt beside it, or the intact one), never a
    # missing last.pt, which would make the next start train from scratch.
    corrupt.unlink(missing_ok=True)
    try:
        os.link(path, corrupt)
    except OSError:  # a file system without hard links
        shutil.copyfile(path, corrupt)
    os.replace(prev, path)
    update = state.get("run_state", {}).get("update", "?")
    log(f"{path} cannot be read ({reason}): resuming from the state one save back ({prev.name}, update "
        f"{update}); the unreadable file is kept as {corrupt.name}")
    return state


class Preempted(KeyboardInterrupt):
    """A run stopped by SIGTERM (a cluster's pre-emption, ``kill``, ``timeout``) after it saved its
    training state: the same command continues it. A KeyboardInterrupt, so a stage ends with one line
    and exit code 143 (stages/_common.py's ``run_stage``), as for any SIGTERM."""

    def __init__(self, update: int, path: Path) -> None:
        self.signum = signal.SIGTERM
        self.update, self.path = update, path
        super().__init__(f"stopped by SIGTERM after update {update}; its training state is in {path}: "
                         f"the same command continues it")


class StopOnSigterm:
    """While training (a context manager), SIGTERM only asks the loop to stop: it finishes the update it
    is in, saves the training state and raises :class:`Preempted`, so a pre-empted run loses no update.
    Outside, the process's own SIGTERM handling applies again. Main thread only (elsewhere: inert).
    Under torchrun every rank gets the signal; :meth:`requested` agrees across ranks (one all-reduce
    per update), so no rank waits in a collective for one that has left."""

    def __init__(self) -> None:
        self.flag = False
        self._old: Any = None
        self._installed = False

    def __enter__(self) -> "StopOnSigterm":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._old)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.flag = True

    def requested(self, world: int) -> bool:
        if world == 1:
            return self.flag
        flag = torch.tensor(float(self.flag), device=_collective_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
