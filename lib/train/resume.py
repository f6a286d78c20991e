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
#: another count stops with :class:`ProcessCountChanged` instead of moving ``last.pt`` aside);
#: ``data_workers`` changes how the batches are collated, not which (lib/train/feed.py).
_UNFINGERPRINTED_TRAIN_KEYS = ("processes", "data_workers")


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
    and it is set aside in ``stale-<its fingerprint>/`` with its snapshots, fork state and training
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
    """The training state of one config, set aside by a params change: one folder in the checkpoint
    folder, ``stale-<fp>/``, with its ``last.pt``, ``snapshots/``, ``fork.pt`` and training curves
    (``live/``), so deleting the checkpoint folder removes it too. Brought back when the params are
    changed back: the run then continues as if nothing had happened, its final average included.

    Each move goes through a temporary folder, ``.aside-<fp>.tmp`` (setting aside) or ``.back-<fp>.tmp``
    (bringing back), with ``last.pt`` moved last: a kill at any point leaves a move that the next start
    finishes or undoes (:func:`_finish_moves`), never a ``last.pt`` without its snapshots."""

    ckpt_dir: Path
    fingerprint: str

    @property
    def folder(self) -> Path:
        return self.ckpt_dir / f"stale-{self.fingerprint}"

    @property
    def last(self) -> Path:
        return self.folder / "last.pt"

    @property
    def aside_tmp(self) -> Path:
        return self.ckpt_dir / f".aside-{self.fingerprint}.tmp"

    @property
    def back_tmp(self) -> Path:
        return self.ckpt_dir / f".back-{self.fingerprint}.tmp"

    @staticmethod
    def all(ckpt_dir: Path) -> list["SetAside"]:
        return [SetAside(ckpt_dir, p.name.removeprefix("stale-")) for p in sorted(ckpt_dir.glob("stale-*")) if p.is_dir()]

    def update(self) -> int | str:
        try:
            return ckpt.load(self.last).get("run_state", {}).get("update", "?")
        except (FileNotFoundError, RuntimeError):
            return "?"


def _places(ckpt_dir: Path, live_dir: Path | None) -> list[tuple[str, Path]]:
    """Where a live run keeps each part of its state, ``last.pt`` last (the order of every move)."""
    places = [("snapshots", ckpt_dir / "snapshots"), ("fork.pt", ckpt_dir / "fork.pt")]
    if live_dir is not None:
        places.append(("live", live_dir))
    return places + [("last.pt", ckpt_dir / "last.pt")]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _move(src: Path, dst: Path) -> None:
    """``src`` to ``dst`` (an existing ``dst`` removed first); a copy where they are on different file
    systems (a checkpoint folder linked to scratch space, the curves beside it)."""
    if dst.exists() or dst.is_symlink():
        _remove(dst)
    shutil.move(str(src), str(dst))


def _finish_moves(ckpt_dir: Path, live_dir: Path | None) -> None:
    """Finish or undo a move of :class:`SetAside` that a kill interrupted: a state being set aside whose
    ``last.pt`` had left its place is committed, else its parts go back; a state being brought back whose
    ``last.pt`` was still aside gets its other parts put in place, then ``last.pt``."""
    for tmp in sorted(ckpt_dir.glob(".aside-*.tmp")):
        if (tmp / "last.pt").is_file():
            _move(tmp, ckpt_dir / f"stale-{tmp.name[len('.aside-'):-len('.tmp')]}")
            continue
        for name, place in _places(ckpt_dir, live_dir):
            if (tmp / name).exists() and not place.exists():
                _move(tmp / name, place)
        _remove(tmp)
    for tmp in sorted(ckpt_dir.glob(".back-*.tmp")):
        if (tmp / "last.pt").is_file():
            for name, place in _places(ckpt_dir, live_dir):
                if (tmp / name).exists():
                    _move(tmp / name, place)
        _remove(tmp)


def _set_aside(ckpt_dir: Path, fingerprint: str, live_dir: Path | None) -> SetAside:
    """The live state (``last.pt`` of ``fingerprint`` and its parts) moved to ``stale-<fingerprint>/``."""
    aside = SetAside(ckpt_dir, fingerprint)
    aside.aside_tmp.mkdir(exist_ok=True)
    for name, place in _places(ckpt_dir, live_dir):
        if place.exists():
            _move(place, aside.aside_tmp / name)
    (ckpt_dir / ckpt.PREV).unlink(missing_ok=True)
    _move(aside.aside_tmp, aside.folder)
    return aside


def _bring_back(own: SetAside, path: Path, live_dir: Path | None, log: Callable[[str], None]) -> dict | None:
    """The state of this config that a params change set aside, put back in place and returned (None, and
    the set-aside folder removed, when its ``last.pt`` cannot be read). What sits in the places without a
    ``last.pt`` (a changed run that stopped before its first save) is removed first."""
    try:
        state = ckpt.load(own.last)
    except RuntimeError as e:
        reason = str(getattr(e, "__cause__", None) or e).splitlines()[0][:160]
        _remove(own.folder)
        log(f"{own.last} cannot be read ({reason}): removed {own.folder.name}; starting from scratch")
        return None
    places = _places(own.ckpt_dir, live_dir)
    for _, place in places:
        _remove(place)
    os.replace(own.folder, own.back_tmp)
    for name, place in places:  # last.pt last
        if (own.back_tmp / name).exists():
            _move(own.back_tmp / name, place)
    _remove(own.back_tmp)
    log(f"resuming {path} at update {state.get('run_state', {}).get('update', '?')}: the state of these params "
        f"that a change of params had set aside ({own.folder.name}/), brought back with its snapshots and curves")
    return state


def _same_but_processes(theirs: dict, config: dict) -> bool:
    """Whether ``theirs`` is ``config`` with another number of processes (``world_size``)."""
    return "world_size" in theirs and theirs.get("world_size") != config.get("world_size") and \
        {k: v for k, v in theirs.items() if k != "world_size"} == {k: v for k, v in config.items() if k != "world_size"}


def _process_count_changed(path: Path, ckpt_dir: Path, theirs: dict, config: dict, what: str = "") -> ProcessCountChanged:
    n, m = theirs["world_size"], config.get("world_size")
    return ProcessCountChanged(
        f"error: {path}{what} was made by {n} process{'es' * (n != 1)} and this run has {m}: the same update, but "
        f"not the same dropout streams, so it would not continue exactly. Resume it with {n} "
        f"(the stage's train_*.processes: {n}), or delete {ckpt_dir} to train this run afresh with {m}")


def _stop_for_a_process_count_twin(others: list[SetAside], config: dict) -> None:
    """Before a run starts afresh or sets a state aside (which removes the older ones): stop if a set-aside
    state is this run's, made with another number of processes, rather than throw it away later."""
    for other in others:
        try:
            theirs = ckpt.load(other.last).get("config", {})
        except (FileNotFoundError, RuntimeError):
            continue
        if _same_but_processes(theirs, config):
            raise _process_count_changed(other.last, other.ckpt_dir, theirs, config, " (set aside by a change of params)")


def _matching_last(ckpt_dir: Path, fingerprint: str, config: dict, log: Callable[[str], None],
                   live_dir: Path | None = None) -> dict | None:
    """``<ckpt_dir>/last.pt`` loaded when its fingerprint is ``fingerprint``; else a mismatching state is
    set aside (:class:`SetAside`; its ``prev.pt`` removed), and the state of this config set aside earlier,
    if any, is brought back and returned; else None. An unreadable ``last.pt`` falls back to ``prev.pt``,
    the state one save back, with one line saying so; with no intact ``prev.pt`` either the run stops
    (SystemExit) with one line naming the file and the remedy. A missing ``last.pt`` starts from scratch,
    whatever ``prev.pt`` holds, unless this config's state was set aside (deleting the checkpoint folder
    is how a user asks for a fresh start). A state of this config made by another number of processes,
    live or set aside, stops the run (:class:`ProcessCountChanged`) rather than being thrown away."""
    _finish_moves(ckpt_dir, live_dir)
    path, prev = ckpt_dir / "last.pt", ckpt_dir / ckpt.PREV
    own = SetAside(ckpt_dir, fingerprint)
    others = [a for a in SetAside.all(ckpt_dir) if a.fingerprint != fingerprint]
    if not path.is_file():
        prev.unlink(missing_ok=True)
        if own.last.is_file():
            return _bring_back(own, path, live_dir, log)
        _stop_for_a_process_count_twin(others, config)
        return None
    try:
        state = ckpt.load(path)
    except RuntimeError as e:
        state = _fall_back_to_prev(path, prev, e, log, own if own.last.is_file() else None)
    if state.get("fingerprint") == fingerprint:
        return state
    theirs = state.get("config", {})
    if _same_but_processes(theirs, config):
        raise _process_count_changed(path, ckpt_dir, theirs, config)
    diff = ckpt.config_diff(theirs, config)
    if not own.last.is_file():
        _stop_for_a_process_count_twin(others, config)
    aside = _set_aside(ckpt_dir, str(state.get("fingerprint", "unknown")), live_dir)
    removed = [o for o in others if o.fingerprint != aside.fingerprint]
    for old in removed:  # keep at most one set-aside state: the newest
        _remove(old.folder)
    for legacy in ckpt_dir.glob("last.stale-*.pt"):  # the layout of earlier versions: a last.pt without snapshots
        legacy.unlink()
    back = own.last.is_file()
    log(f"NOT resuming {path}: it was made with a different config ({'; '.join(diff) or 'fingerprint differs'}); "
        f"set it aside in {aside.folder.name}/ with its snapshots and curves"
        + (f" (removed the older {', '.join(o.folder.name + '/' for o in removed)})" if removed else "")
        + ("" if back else " and starting from scratch"))
    return _bring_back(own, path, live_dir, log) if back else None


def _fall_back_to_prev(path: Path, prev: Path, error: Exception, log: Callable[[str], None],
                       own: SetAside | None = None) -> dict:
    """The state of ``prev`` for an unreadable ``path``: ``path`` is kept as ``last.corrupt.pt`` and
    ``prev`` becomes ``path`` (so the next save does not link the corrupt file to ``prev.pt``). With
    neither readable, the run stops; its remedy names ``own``, this config's set-aside state, if any."""
    reason = str(getattr(error, "__cause__", None) or error).splitlines()[0][:160]
    corrupt = path.with_name("last.corrupt.pt")
    try:
        state = ckpt.load(prev)
    except (FileNotFoundError, RuntimeError):
        remedy = (f"delete {path} to resume the state of these params set aside at update {own.update()} "
                  f"({own.folder.name}/), or " if own is not None else "")
        raise SystemExit(f"error: {path} cannot be read ({reason}) and there is no intact earlier training "
                         f"state ({prev.name}): {remedy}delete {path.parent} to train this run from scratch") from None
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
