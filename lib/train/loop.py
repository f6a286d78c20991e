"""The training loop: ASR pretraining and ST training share it (fairseq's S2T MuST-C recipe).

Read top to bottom: :class:`TrainConfig` (lib/params/) holds plain values; :func:`decide_resume`
(lib/train/resume.py) decides, once per run, whether ``<out>/checkpoints/last.pt`` is resumed: only when it was made with
the same config (the same fingerprint of ``{"train": cfg, **run_config}``); a ``last.pt`` of another
config is set aside in ``stale-<its fingerprint>/`` with its snapshots, fork state and curves (keeping
at most one such state) and the run starts from scratch, or from the state of its own config that an
earlier change of params set aside; an unreadable ``last.pt`` falls back to ``prev.pt``, the state one save back. Under torchrun rank 0 decides and broadcasts. :func:`train` takes that
decision (``lib/train/run.py`` makes it before training, to set up dvclive; ``train`` makes it itself
when given none), builds the optimizer, restores the resumed state, then runs updates of
``update_freq`` batches each until ``max_updates``, evaluating, logging (dvclive) and checkpointing on
the way. ``update_freq`` is the whole update's batches whatever the number of processes: under
torchrun with n processes each runs ``update_freq / n`` of them (:func:`batches_per_process`), so the
paper's batch stays the paper's on one GPU or eight.

Determinism and resume. The data order is a function of ``(seed, epoch)`` (lib/data/dataset.py),
SpecAugment draws from a generator seeded by ``(seed, epoch, batch)``, and dropout draws from
the global torch RNG whose state is saved in every checkpoint together with the position in the
epoch. A run killed at any point and restarted continues from its last checkpoint and ends
with the same weights and metrics as an uninterrupted run (same machine, same thread count).

Loss normalisation follows fairseq: the summed label-smoothed loss of all batches of one update
(all ranks) is divided by the number of target tokens of that update, so one process computes the
same update as ``n`` processes with the same ``update_freq``.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from lib.data.dataset import PAD_ID, SpecAugmentConfig, SpeechDataset, batch_by_frames, collate
from lib.params import LOWER_IS_BETTER, ParamError, TrainConfig  # noqa: F401 (TrainConfig re-exported)
from lib.precision import autocast, resolve_amp, resolve_padding
from lib.train import checkpoint as ckpt
from lib.train.distributed import dist_info, init_distributed  # noqa: F401 (re-exported)
from lib.train.resume import Preempted, Resume, StopOnSigterm, decide_resume, train_config_dict  # noqa: F401 (re-exported)
from lib.model.attention import variant_parameters
from lib.train.criterion import Criterion, HostCounts  # noqa: F401 (Criterion, HostCounts re-exported)
from lib.train.feed import BatchJob, UpdateFeed, resolve_data_workers
from lib.train.fold import (  # noqa: F401 (the fold's names re-exported)
    FOLD_MARGIN, FOLD_MEMORY_SHARE, FoldPolicy, _forward_backward, _update_gradients, merge_batches)
from lib.train.objectives import ctc_weight_at, learning_rate, token_loss



@dataclass
class RunState:
    """Everything beyond the weights that a resumed run needs."""

    update: int = 0
    epoch: int = 0
    group_in_epoch: int = 0  # index of the next update-sized group of batches in this epoch
    best: float | None = None
    history: list[dict[str, float]] = field(default_factory=list)


@torch.no_grad()
def dev_loss(model: nn.Module, dataset: SpeechDataset, max_frames: int, device: torch.device,
             label_smoothing: float, amp: str = "none") -> dict[str, float]:
    """Teacher-forced dev loss and nll per target token (nats), eval mode, no SpecAugment."""
    core = model
    was_training = core.training
    core.eval()
    total = nll_total = tokens = 0.0
    for idx in batch_by_frames(dataset.n_frames, max_frames, shuffle=False):
        host = collate(dataset, idx)
        n_tokens = host.n_target_tokens
        batch = host.to(device)
        with autocast(device, amp):
            logits = core.decode(batch.prev_tokens, core.encode(batch.feats, batch.feat_lengths, task=batch.task))
        loss, nll = token_loss(logits, batch.target, label_smoothing, PAD_ID, n_tokens)
        total, nll_total, tokens = total + float(loss), nll_total + float(nll), tokens + n_tokens
    core.train(was_training)
    return {"loss": total / tokens, "nll": nll_total / tokens}


def batches_per_process(update_freq: int, world: int) -> int:
    """The batches each of ``world`` processes runs per update: ``update_freq / world``. ValueError when
    they do not split evenly (the update would not be the configured one)."""
    if update_freq % world:
        raise ValueError(f"update_freq: {update_freq} batches per update do not split evenly over {world} "
                         f"processes; set a number of processes that divides it (train_*.processes), "
                         f"e.g. {', '.join(str(d) for d in range(1, update_freq + 1) if update_freq % d == 0)}")
    return update_freq // world


def _update_groups(train_ds: SpeechDataset, cfg: TrainConfig, epoch: int) -> list[list[list[int]]]:
    """The epoch's batches, grouped per update: each group has ``update_freq`` batches, split among the
    processes (the last, shorter group is dropped so every update has the same number of batches).

    ``update_grouping: length`` (with ``update_freq`` > 1): the batches sorted by their longest item
    (stably, from the shuffled order), taken ``update_freq`` at a time, and the updates shuffled by a
    generator of (seed, epoch): an update's batches have similar lengths, so a folded update pads
    little (MuST-C's mix padded to its longest batch would fill 2-3 x the slots). ``shuffled``: consecutive
    batches of the shuffled epoch. With ``update_freq`` 1 both are the shuffled batches, as before."""
    batches = batch_by_frames(train_ds.n_frames, cfg.max_frames, shuffle=True, seed=cfg.seed, epoch=epoch)
    per_update = cfg.update_freq
    if per_update > 1 and cfg.update_grouping == "length":
        n_frames = train_ds.n_frames
        batches = sorted(batches, key=lambda b: max(int(n_frames[i]) for i in b))
    groups = [batches[i:i + per_update] for i in range(0, len(batches) - per_update + 1, per_update)]
    if per_update > 1 and cfg.update_grouping == "length":
        order = torch.randperm(len(groups), generator=torch.Generator().manual_seed(_batch_seed(cfg.seed, epoch, 1)))
        groups = [groups[i] for i in order.tolist()]
    return groups


def _batch_seed(*parts: int) -> int:
    """A SpecAugment seed that depends only on the batch's place in the run (resume-safe)."""
    seed = 0
    for p in parts:
        seed = (seed * 1_000_003 + p + 1) % (2**61 - 1)
    return seed


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _restore(resume: Resume, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
             snap_dir: Path, rank: int, world: int) -> RunState:
    """Load the resumed weights, optimizer, RNG and run state; or, starting from scratch, seed
    this rank's dropout stream and (rank 0) drop the snapshots of an earlier run."""
    if (resume.state is None or resume.fork) and rank == 0:
        for old in snap_dir.glob("update_*.pt"):
            old.unlink()
    if resume.state is None:
        torch.manual_seed(cfg.seed * 7919 + rank)  # dropout stream per rank
        return RunState()
    state = resume.state
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    _set_rng_state(state["rng"][rank] if world > 1 else state["rng"][0])
    st = RunState(**state["run_state"])
    if resume.fork:  # the forked run's own dev history and best model start here
        st.best, st.history = None, []
    return st


def _gather_rng(world: int) -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order (under torchrun a collective: all ranks call it)."""
    state = _rng_state()
    if world == 1:
        return [state]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, state)
    return out


def _save_checkpoint(ckpt_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, st: RunState,
                     resume: Resume, cfg: TrainConfig, snapshots_from: int | None, rank: int, world: int,
                     fold: dict[str, Any] | None = None, snapshot: bool = True) -> None:
    """Rank 0 writes ``snapshots/update_<n>.pt`` (unless ``snapshot`` is False: a save off the
    schedule, a pre-emption's) then ``last.pt`` (with every rank's RNG state, so all ranks call this),
    and keeps the snapshots of the schedule's last ``average_last`` saves (:func:`_kept_snapshots`)."""
    rngs = _gather_rng(world)
    if rank != 0:
        return
    snap_dir = ckpt_dir / "snapshots"
    # Snapshot first, last.pt second: a kill between the two resumes from the previous last.pt
    # and rewrites this snapshot identically, whereas the other order would resume past a
    # snapshot that was never written (and avg_last_k.pt would average the wrong updates).
    if snapshot:
        ckpt.save(ckpt.snapshot_path(snap_dir, st.update), {"model": model.state_dict(), "update": st.update,
                                                            "fingerprint": resume.fingerprint})
    state = _training_state(model, optimizer, st, resume, rngs)
    if fold is not None:  # FoldPolicy.state(): what fold_update auto learnt (never set on a CPU)
        state["fold"] = fold
    if snapshots_from is not None:
        state["snapshots_from"] = snapshots_from
    ckpt.save_keeping_previous(ckpt_dir / "last.pt", state)
    keep = set(_kept_snapshots(snap_dir, cfg, st.update, snapshots_from))
    for old in snap_dir.glob("update_*.pt"):
        if old not in keep:
            old.unlink()


def _kept_snapshots(snap_dir: Path, cfg: TrainConfig, update: int, snapshots_from: int | None) -> list[Path]:
    """The snapshots a run at ``update`` keeps, and at its end averages: those of the schedule's last
    ``average_last`` saves after ``snapshots_from`` (:func:`lib.train.checkpoint.averaged_updates`).
    ``snapshots_from`` None (a ``last.pt`` of earlier code, which did not record it): the newest
    ``average_last`` files, as that code kept them."""
    if snapshots_from is None:
        return sorted(snap_dir.glob("update_*.pt"))[-cfg.average_last:]
    return [ckpt.snapshot_path(snap_dir, u) for u in
            ckpt.averaged_updates(cfg.save_every, cfg.max_updates, cfg.average_last, update, snapshots_from)]


def _training_state(model: nn.Module, optimizer: torch.optim.Optimizer, st: RunState, resume: Resume,
                    rngs: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything a run continues from (last.pt, fork.pt)."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "run_state": asdict(st),
            "rng": rngs, "fingerprint": resume.fingerprint, "config": resume.config}


FORK_FILE = "fork.pt"


def _save_fork(ckpt_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, st: RunState,
               resume: Resume, rank: int, world: int) -> None:
    """``<ckpt_dir>/fork.pt``: the run's full state after update ``st.update`` (all ranks call this). A
    DVC output (copied to the run's folder), so written in canonical form: a run resumed before its fork
    update writes the same bytes as one never stopped (:func:`lib.train.checkpoint.canonical_tree`)."""
    rngs = _gather_rng(world)
    if rank == 0:
        ckpt.save(ckpt_dir / FORK_FILE, ckpt.canonical_tree(_training_state(model, optimizer, st, resume, rngs)))


def fork_is_valid(ckpt_dir: Path, fingerprint: str, fork_at: int) -> bool:
    """Whether ``<ckpt_dir>/fork.pt`` is this run's (``fingerprint``) state after update ``fork_at`` (False for
    an unreadable one, as for a missing one)."""
    path = Path(ckpt_dir) / FORK_FILE
    if not path.is_file():
        return False
    try:
        state = ckpt.load(path)
    except ckpt.CheckpointError:  # truncated or corrupt: as good as missing (the run trains again to keep one)
        return False
    return state.get("fingerprint") == fingerprint and state.get("run_state", {}).get("update") == fork_at


def _dev_metrics(model: nn.Module, dev_ds: SpeechDataset, cfg: TrainConfig, device: torch.device, amp: str,
                 evaluate: Callable[[nn.Module], dict[str, float]] | None) -> dict[str, float]:
    """``dev/loss`` and ``dev/nll``, plus ``evaluate(model)``'s metrics (run in eval mode) when given."""
    metrics = {f"dev/{k}": v for k, v in dev_loss(model, dev_ds, cfg.max_frames, device, cfg.label_smoothing, amp).items()}
    if evaluate is not None:
        model.eval()
        metrics.update({f"dev/{k}": v for k, v in evaluate(model).items()})
        model.train()
    return metrics


def _keep_best(metrics: dict[str, float], st: RunState, model: nn.Module, cfg: TrainConfig, ckpt_dir: Path) -> None:
    """When ``dev/<best_metric>`` improved on ``st.best``: record it and write ``best.pt`` (rank 0)."""
    key = f"dev/{cfg.best_metric}"
    if key not in metrics:
        return
    better = st.best is None or (metrics[key] < st.best if LOWER_IS_BETTER[cfg.best_metric] else metrics[key] > st.best)
    if better:
        st.best = metrics[key]
        ckpt.save(ckpt_dir / "best.pt", {"model": model.state_dict(), "update": st.update, key: st.best})


OPTIMIZER = "adam_fused"  # recorded in run_config: a change of optimizer implementation never resumes


def encoder_lr_scales(model: nn.Module, cfg: TrainConfig) -> dict[int, float]:
    """``id(parameter) -> lr_scale`` for every parameter of ``model.encoder``: ``cfg.encoder_lr_scale``
    times ``cfg.encoder_layer_lr_decay ** (L - l)`` for encoder layer l of L (1-based), the top layer's
    scale for the encoder's final LayerNorm and CTC projection, ``** L`` for everything else (the
    subsampler and its LayerNorm). ValueError when the model has no encoder."""
    encoder = getattr(model, "encoder", None)
    if encoder is None:
        raise ValueError(f"encoder_lr_scale = {cfg.encoder_lr_scale}, encoder_layer_lr_decay = "
                         f"{cfg.encoder_layer_lr_decay}: {type(model).__name__} has no encoder")
    top, decay = cfg.encoder_lr_scale, cfg.encoder_layer_lr_decay
    layers = list(getattr(encoder, "layers", []))
    scales = {id(p): top * decay ** len(layers) for p in encoder.parameters()}
    for i, layer in enumerate(layers):
        for p in layer.parameters():
            scales[id(p)] = top * decay ** (len(layers) - 1 - i)
    for name in ("layer_norm", "ctc_proj"):
        module = getattr(encoder, name, None)
        if module is not None:
            for p in module.parameters():
                scales[id(p)] = top
    return scales


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam with fairseq's betas / weight decay; the fused kernel (one pass over each parameter
    instead of ~10 elementwise ops) on CPU and CUDA: 4-5 % of a demo training step on 2 CPU cores
    (benchmarks/train_real_batches.py), and deterministic like the for-loop version.

    With ``cfg.encoder_lr_scale`` or ``cfg.encoder_layer_lr_decay`` below 1, every distinct scale of
    :func:`encoder_lr_scales` gets a parameter group whose ``lr_scale`` the training loop multiplies
    into every update's lr, in the order the parameters first appear, and the rest of the model one
    group at 1.0: with ``encoder_lr_scale`` alone that is the encoder's group, then the decoder's (the
    encoder is registered first). With both at 1.0 there is one group, exactly the optimizer of
    before the options existed.

    With ``cfg.variant_lr`` set, the attention variants' own parameters
    (:func:`lib.model.attention.variant_parameters`: head-selection logits, band-prior logits, the
    predicted gate's vector and bias) leave those groups for one more, last, group with ``lr_scale``
    variant_lr / lr (so they follow the run's schedule with peak ``variant_lr``, whatever the encoder's
    scale), ``weight_decay`` 0 and ``"variant": True``: they start from their initialisation, not from
    a pretrained model, and Adam moves a parameter by at most about Σ_t lr_t over a run (the defaults
    and their measurement: lib.params.smoothing.SmoothingParams, lib.params.multi.HeadSelectionParams). A model without such
    parameters gets exactly the groups above, whatever ``variant_lr`` is."""
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in model.parameters())
    params: Any = model.parameters()
    variant = {id(p) for _, p in variant_parameters(model)} if cfg.variant_lr is not None else set()
    if cfg.encoder_lr_scale != 1.0 or cfg.encoder_layer_lr_decay != 1.0 or variant:
        scales = encoder_lr_scales(model, cfg) if cfg.encoder_lr_scale != 1.0 or cfg.encoder_layer_lr_decay != 1.0 \
            else {}
        groups: dict[float, list[nn.Parameter]] = {}
        for p in model.parameters():
            if id(p) not in variant:
                groups.setdefault(scales.get(id(p), 1.0), []).append(p)
        params = [{"params": ps, "lr_scale": scale} for scale, ps in groups.items()]
        if variant:
            params.append({"params": [p for p in model.parameters() if id(p) in variant],
                           "lr_scale": cfg.variant_lr / cfg.lr, "weight_decay": 0.0, "variant": True})
    return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay,
                            fused=fused or None)


def _read_parts(pending: list[tuple[list[str], dict[str, torch.Tensor]]], st: RunState) -> dict[str, float]:
    """The update's loss parts summed per key, read from the device at once (one sync per update instead
    of one per batch and part): the same float sums, in the same order, as reading each part as it came.
    FloatingPointError (before the optimizer step) when a batch's CE or CTC loss is not finite."""
    keys = [(b, k) for b, (_, parts) in enumerate(pending) for k in parts]
    values = torch.stack([pending[b][1][k].detach().double() for b, k in keys]).tolist() if keys else []
    read = [dict() for _ in pending]
    for (b, k), v in zip(keys, values):
        read[b][k] = v
    for (ids, _), parts in zip(pending, read):
        if not math.isfinite(parts["ce"]) or not math.isfinite(parts.get("ctc", 0.0)):
            raise FloatingPointError(
                f"non-finite loss {parts} at update {st.update + 1} (epoch {st.epoch}, batch of "
                f"{ids[:3]}...); lower lr or check the data")
    logged: dict[str, float] = {}
    for parts in read:
        for k, v in parts.items():
            logged[k] = logged.get(k, 0.0) + v
    return logged


def train(model: nn.Module, cfg: TrainConfig, train_ds: SpeechDataset, dev_ds: SpeechDataset, out_dir: Path, *,
          run_config: dict[str, Any], evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
          device: torch.device | None = None, progress: bool = True, live: Any = None,
          resume: Resume | None = None, kl_weight: float | dict[str, list[float]] = 0.0,
          update_hooks: Sequence[Callable[[int], None]] = (), prefetch: bool | None = None,
          amp: str | None = None, fork_at: int | None = None) -> dict[str, Any]:
    """Train ``model`` in place; returns the final summary (also left in ``<out>/checkpoints``).

    ``run_config`` is everything that defines the run (hyperparameters, model config, data
    fingerprint, init checkpoint); its hash decides whether ``last.pt`` may be resumed.
    ``resume`` is :func:`decide_resume`'s answer for ``<out>/checkpoints`` and this config; None
    (the default) decides here (under torchrun: on every rank, or on none).
    ``evaluate(model) -> {"bleu": ...}`` adds decoding metrics to each evaluation.
    ``live`` is a dvclive ``Live`` (or None), used on rank 0 only.
    ``amp`` is the resolved training precision (lib/train/run.py measures ``auto`` with
    :func:`lib.train.precision.resolve_train_amp`); None resolves ``cfg.amp`` by the device's flags.
    ``kl_weight``: the criterion's weight λ of head selection's KL term (docs/variants.md; the KL is
    logged as ``train/kl`` per target token for such models whether or not it is optimised).
    ``update_hooks``: called with the number of updates completed before every update (fairseq's
    ``set_num_updates``; head selection's τ and noise schedule: ``HeadSelectionTraining.set_num_updates``).
    The loop knows no variant: what a variant changes in training reaches it through these two. Put
    them into ``run_config`` too (they change the run).
    ``prefetch``: collate the next update's batches while this update runs (pinned, for asynchronous
    copies), in ``cfg.data_workers`` worker processes or a background thread (lib/train/feed.py);
    None: on CUDA only, where the GPU would otherwise wait for the host (memory-mapped reads,
    normalisation, SpecAugment). The batches are the same either way: SpecAugment draws from a
    generator seeded by the batch's place, never from the global RNG.
    ``fork_at``: also write the full training state after that update to ``checkpoints/fork.pt``
    (``local.asr_pretraining: fork``: another run continues from it with another attention spec,
    passed as ``Resume(..., state=<fork.pt>, fork=True)``). It does not change the training.
    """
    cfg.validate()
    rank, world = dist_info()
    device = device or torch.device("cpu")
    say = (lambda msg: tqdm.write(msg)) if rank == 0 else (lambda msg: None)
    ckpt_dir = Path(out_dir) / "checkpoints"
    snap_dir = ckpt_dir / "snapshots"
    if rank == 0:
        snap_dir.mkdir(parents=True, exist_ok=True)
    if resume is None:
        resume = decide_resume(ckpt_dir, cfg, run_config, say)
    elif resume.config != {"train": train_config_dict(cfg), **run_config}:
        raise ValueError("train(resume=...) was decided for another config than cfg and run_config")

    model.to(device)
    optimizer = make_optimizer(model, cfg)
    st = _restore(resume, model, optimizer, cfg, snap_dir, rank, world)
    # where this run's snapshots begin: 0 from scratch, the fork's update for a fork (its snapshots
    # were dropped), else what last.pt recorded (None for a last.pt of earlier code)
    snapshots_from = 0 if resume.state is None else st.update if resume.fork else resume.state.get("snapshots_from")
    if resume.fork:
        say(f"started from a fork state at update {st.update}")
    elif resume.state is not None:
        say(f"resumed from {ckpt_dir / 'last.pt'} at update {st.update}")
    criterion = Criterion(model, cfg.label_smoothing, cfg.ctc_weight, kl_weight=kl_weight)
    criterion.host_parts = False  # parts stay on the device until _read_parts, once per update
    net = nn.parallel.DistributedDataParallel(criterion) if world > 1 else criterion
    amp = resolve_amp(cfg.amp, device) if amp is None else amp
    pad_frames_to, pad_tokens_to = resolve_padding(cfg.pad_frames_to, cfg.pad_tokens_to, amp, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    per_rank = batches_per_process(cfg.update_freq, world)
    folding = FoldPolicy(cfg.fold_update, device, per_rank, exact=not criterion.head_selection)
    if resume.state is not None and not resume.fork:
        folding.load_state(resume.state.get("fold"))
    specaug = SpecAugmentConfig(time_mask_p=cfg.specaug_time_p) if cfg.specaugment else None

    def update_jobs(epoch: int, group_in_epoch: int) -> list[BatchJob]:
        """This process's batches of update group ``group_in_epoch`` of ``epoch``, to collate."""
        mine = groups[group_in_epoch][rank * per_rank:(rank + 1) * per_rank]
        # Seeded by the batch's place in the update group (not by which rank holds it), so n ranks
        # draw the same masks as 1 process with the same update_freq; with one process this is the
        # same seed as (rank=0, b).
        return [BatchJob(tuple(idx), _batch_seed(cfg.seed, epoch, group_in_epoch, 0, rank * per_rank + b))
                for b, idx in enumerate(mine)]

    prefetch = device.type == "cuda" if prefetch is None else prefetch
    workers = resolve_data_workers(cfg.data_workers, device) if prefetch else 0
    feed = UpdateFeed(train_ds, specaugment=specaug, pad_frames_to=pad_frames_to, pad_tokens_to=pad_tokens_to,
                      prefetch=prefetch, pin=prefetch and device.type == "cuda", workers=workers, say=say)
    if feed.workers:
        say(f"data_workers: collating the training batches in {feed.workers} worker processes")

    model.train()
    bar = tqdm(total=cfg.max_updates, initial=st.update, desc=f"train {Path(out_dir).name}", unit="upd",
               disable=not progress or rank != 0, dynamic_ncols=True)
    frames_seen, t0 = 0, time.perf_counter()
    # SIGTERM: finish the update, save, stop; the feed's workers and thread end with the loop, however it ends
    with StopOnSigterm() as sigterm, contextlib.closing(feed):
        while st.update < cfg.max_updates:
            groups = _update_groups(train_ds, cfg, st.epoch)
            if not groups:
                raise ParamError(f"train set too small for one update ({len(train_ds)} segments): fewer than "
                                 f"{cfg.update_freq} batches of max_frames={cfg.max_frames}; lower this stage's "
                                 f"update_freq or max_frames (train_asr.* / train_st.*), or give it more data")
            while st.group_in_epoch < len(groups) and st.update < cfg.max_updates:
                optimizer.zero_grad(set_to_none=True)
                # the CTC weight for u = updates completed so far (resume-safe)
                criterion.ctc_weight = ctc_weight_at(st.update, cfg.ctc_weight, cfg.ctc_decay_from, cfg.max_updates,
                                                     cfg.ctc_start_updates, cfg.ctc_start_weight)
                for hook in update_hooks:  # u = updates completed so far (resume-safe)
                    hook(st.update)
                # on the host: their sizes are read here without waiting for the GPU
                batches = feed.get((st.epoch, st.group_in_epoch), update_jobs(st.epoch, st.group_in_epoch))
                if st.group_in_epoch + 1 < len(groups) and st.update + 1 < cfg.max_updates:
                    feed.prefetch((st.epoch, st.group_in_epoch + 1), update_jobs(st.epoch, st.group_in_epoch + 1))
                local_tokens = sum(x.n_target_tokens for x in batches)
                tokens = torch.full((), float(local_tokens), device=device)  # a fill kernel: no host-to-device copy to wait for
                if world > 1:
                    dist.all_reduce(tokens)
                pending = _update_gradients(net, batches, tokens, world, device, amp, scaler, folding, optimizer, say)
                logged = _read_parts(pending, st)
                frames_seen += sum(x.n_frames for x in batches)
                scaler.unscale_(optimizer)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm))
                # fairseq sets the lr for update k from k - 1 completed updates (update 1 runs at warmup_init_lr).
                lr = learning_rate(st.update, cfg.lr_scheduler, cfg.lr, cfg.warmup_updates, cfg.max_updates,
                                   cfg.warmup_init_lr)
                for g in optimizer.param_groups:
                    g["lr"] = lr * g.get("lr_scale", 1.0)
                scaler.step(optimizer)
                scaler.update()
                st.update += 1
                st.group_in_epoch += 1
                train_loss = logged["ce"] / max(local_tokens, 1)
                bar.set_postfix(loss=f"{train_loss:.3f}", lr=f"{lr:.2e}",
                                fps=f"{frames_seen / max(time.perf_counter() - t0, 1e-9):.0f}")
                bar.update(1)
                row = {"update": st.update, "train/loss": train_loss, "train/lr": lr, "train/grad_norm": grad_norm}
                if len(batches) > 1:  # padded frame slots of the update folded into one batch / its frames
                    row["train/fold_padding"] = (sum(len(x.ids) for x in batches) * max(x.feats.shape[1] for x in batches)
                                                 / max(sum(x.n_frames for x in batches), 1))
                if "ctc" in logged:
                    row["train/ctc"] = logged["ctc"] / max(local_tokens - sum(len(x.ids) for x in batches), 1)
                if "kl" in logged:
                    row["train/kl"] = logged["kl"] / max(local_tokens, 1)
                if st.update % cfg.eval_every == 0 or st.update == cfg.max_updates:
                    metrics = _dev_metrics(model, dev_ds, cfg, device, amp, evaluate if rank == 0 else None)
                    if rank == 0:
                        _keep_best(metrics, st, model, cfg, ckpt_dir)
                    row.update(metrics)
                    say(" ".join(f"{k}={v:.4g}" for k, v in row.items()))
                if live is not None and rank == 0:
                    live.step = st.update
                    for k, v in row.items():
                        if k != "update":
                            live.log_metric(k, v)
                    live.next_step()
                if "dev/loss" in row:
                    st.history.append(row)
                if fork_at is not None and st.update == fork_at:  # before last.pt: a kill in between redoes it
                    _save_fork(ckpt_dir, model, optimizer, st, resume, rank, world)
                saved = st.update % cfg.save_every == 0 or st.update == cfg.max_updates
                if saved:
                    _save_checkpoint(ckpt_dir, model, optimizer, st, resume, cfg, snapshots_from, rank, world,
                                     fold=folding.state())
                if sigterm.requested(world):  # pre-empted: keep this update, then stop (the same command continues)
                    if not saved:
                        _save_checkpoint(ckpt_dir, model, optimizer, st, resume, cfg, snapshots_from, rank, world,
                                         fold=folding.state(), snapshot=False)  # off the schedule
                    raise Preempted(st.update, ckpt_dir / "last.pt")
            if st.group_in_epoch >= len(groups):
                st.epoch += 1
                st.group_in_epoch = 0
    bar.close()
    if rank == 0:
        snaps = _kept_snapshots(snap_dir, cfg, st.update, snapshots_from)
        missing = [p.name for p in snaps if not p.is_file()]
        if missing:
            raise SystemExit(f"error: {snap_dir}: snapshot {', '.join(missing)} is missing; the run averages the "
                             f"snapshots of its last {cfg.average_last} saves ({', '.join(p.name for p in snaps)}). "
                             f"Delete {ckpt_dir} to train the run again")
        ckpt.save(ckpt_dir / "avg_last_k.pt", {"model": ckpt.average_state_dicts(snaps, resume.fingerprint),
                                               "updates": [int(p.stem.split("_")[1]) for p in snaps]})
    return {"updates": st.update, "epochs_started": st.epoch + 1, "best": st.best, "history": st.history,
            "fingerprint": resume.fingerprint}
