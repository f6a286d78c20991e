"""Folded updates: an update's k batches run as one (``train_*.fold_update``), exactly as accumulated.

:func:`merge_batches` builds the folded batch, :class:`FoldPolicy` decides when to fold (and learns it on
CUDA), :func:`_forward_backward` runs an update's forward and backward passes, :func:`_update_gradients`
ties them together with the out-of-memory fallback. Split from lib/train/loop.py, which calls them.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from lib.data.dataset import PAD_ID, Batch
from lib.precision import autocast
from lib.train.criterion import HostCounts


def merge_batches(batches: list[Batch], device: torch.device | str | None = None) -> Batch:
    """One batch of the utterances of ``batches`` (collated on the host, SpecAugment already applied:
    the masks are those of accumulation), sorted by frame count, longest first (stable); frames padded
    with 0, targets with ``PAD_ID``. Its summed loss is the sum of the batches' losses, up to float
    rounding: each utterance carries the CTC factor of its own batch (``Batch.ctc_scale``, tokens /
    labels, which :class:`~lib.train.criterion.Criterion` applies per batch), so the CTC term too is
    the accumulated one.

    ``device``: where the large tensors (features, tokens) are concatenated. On CUDA each sub-batch is
    copied there as accumulation would copy it, and padding, concatenation and sorting run on the card:
    done on the host they cost about as much as the folded forward and backward of a paper update
    (100 MB of features). The lengths stay on the host (the model reads them there without a sync), the
    order is computed from them. None: the batches' own device (the host)."""
    if len(batches) == 1:
        return batches[0]
    n_frames = max(b.feats.shape[1] for b in batches)
    n_tokens = max(b.prev_tokens.shape[1] for b in batches)
    dev = torch.device(device) if device is not None else batches[0].feats.device
    non_blocking = dev.type == "cuda"

    def cat_padded(ts: list[torch.Tensor], width: int, value: float) -> torch.Tensor:
        return torch.cat([F.pad(t.to(dev, non_blocking=non_blocking),
                                (0, 0, 0, width - t.shape[1]) if t.dim() == 3 else (0, width - t.shape[1]),
                                value=value) for t in ts])

    feat_lengths = torch.cat([b.feat_lengths for b in batches])
    order = torch.sort(feat_lengths, descending=True, stable=True).indices
    rows = order.tolist()
    order_dev = order.to(dev, non_blocking=non_blocking)

    def listed(name: str) -> list:
        flat = [x for b in batches for x in getattr(b, name)]
        return [flat[r] for r in rows]

    tasks = [b.task for b in batches]
    if any(t is None for t in tasks) and not all(t is None for t in tasks):
        raise ValueError("merge_batches: some batches have task ids and some do not")
    scale = []
    for b in batches:  # as Criterion's per-batch factor: tokens / labels (labels = tokens - sentences)
        tokens = b.n_target_tokens
        scale += [tokens / max(1, tokens - len(b.ids))] * len(b.ids)
    return Batch(
        ids=listed("ids"),
        feats=cat_padded([b.feats for b in batches], n_frames, 0.0).index_select(0, order_dev),
        feat_lengths=feat_lengths[order],
        prev_tokens=cat_padded([b.prev_tokens for b in batches], n_tokens, PAD_ID).index_select(0, order_dev),
        target=cat_padded([b.target for b in batches], n_tokens, PAD_ID).index_select(0, order_dev),
        target_lengths=torch.cat([b.target_lengths for b in batches])[order],
        src_texts=listed("src_texts"),
        tgt_texts=listed("tgt_texts"),
        task=None if tasks[0] is None else torch.cat(tasks)[order],
        ctc_scale=torch.tensor(scale, dtype=torch.float64)[order],
    )


class FoldPolicy:
    """Whether an update of k = ``update_freq`` batches runs as one folded batch (:func:`merge_batches`)
    instead of k accumulated ones (``train_*.fold_update``). The gradient is the same up to float
    rounding (normalised by the update's target tokens either way); a folded update pays the per-batch
    costs (kernel launches, optimizer-side bookkeeping) once instead of k times and runs larger matmuls.

    * ``off``: accumulate. ``on``: fold (an out-of-memory error is the user's).
    * ``auto``: on CUDA, fold when the folded batch's estimated peak fits in :data:`FOLD_MEMORY_SHARE` of
      the card: the first update of the process accumulates and measures the peak memory per padded
      frame slot of its batches (host-side allocator statistics: no device sync), and each later update
      folds when ``memory before + slots x that x FOLD_MARGIN`` fits; every later batch, folded or not,
      raises that per-slot peak if it needed more. An out-of-memory error of a folded
      update (one process) redoes the update accumulated and keeps accumulating (:func:`_update_gradients`).
      What it learnt is kept in last.pt (:meth:`state`), so a resumed run folds the updates the
      uninterrupted run folds. On a CPU auto accumulates: folding is not measured faster there, and the
      default pipeline (``update_freq: 1``, nothing to fold) runs on CPU unchanged.
    * ``exact`` False (a head-selection model: its Gumbel noise is one draw per forward, k draws when
      accumulated, one when folded): auto accumulates and ``on`` is refused.
    """

    def __init__(self, mode: str, device: torch.device, update_freq: int, exact: bool = True) -> None:
        if mode == "on" and not exact:
            raise ValueError("fold_update: on: this model selects heads, whose Gumbel noise is drawn once per "
                             "forward, so a folded update is not the accumulated one; use auto or off")
        self.mode, self.device, self.update_freq = mode, device, update_freq
        self.exact = exact
        self.per_slot: float | None = None  # peak bytes per padded frame slot, measured
        self.base = 0
        self.gave_up = False
        self.announced = False
        self._peak = 0.0

    @staticmethod
    def slots(batch: Batch) -> int:
        return int(batch.feats.shape[0] * batch.feats.shape[1])

    def learning(self) -> bool:
        """Whether this policy measures its batches' memory (``auto`` on CUDA, until it gives up)."""
        return self.mode == "auto" and self.exact and self.device.type == "cuda" and not self.gave_up

    def measuring(self) -> bool:
        """Whether the first measurement is still to come (until then nothing is folded)."""
        return self.learning() and self.per_slot is None

    def decide(self, batches: list[Batch]) -> bool:
        if len(batches) < 2 or self.mode == "off":
            return False
        if self.mode == "on":
            return True
        if not self.exact or self.device.type != "cuda" or self.gave_up or self.per_slot is None:
            return False
        slots = len([i for b in batches for i in b.ids]) * max(b.feats.shape[1] for b in batches)
        before = torch.cuda.memory_allocated(self.device)
        total = torch.cuda.get_device_properties(self.device).total_memory
        fits = before + slots * self.per_slot * FOLD_MARGIN <= FOLD_MEMORY_SHARE * total
        if fits and not self.announced:
            self.announced = True
            tqdm.write(f"fold_update: auto: folding the {len(batches)} batches of an update into one (estimated peak "
                       f"{(before + slots * self.per_slot * FOLD_MARGIN) / 2**30:.1f} of {total / 2**30:.1f} GiB)")
        return fits

    def before_batch(self) -> None:
        if self.learning():
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)

    def after_batch(self, batch: Batch, last: bool) -> None:
        """The peak per padded slot of every batch, accumulated or folded, raises the estimate: a folded
        batch that needs more per slot than the first update's (longer utterances: attention grows
        with N²) makes the next decisions more careful instead of running out of memory."""
        if not self.learning():
            return
        peak = (torch.cuda.max_memory_allocated(self.device) - self.base) / max(self.slots(batch), 1)
        self._peak = max(self._peak, peak)
        if last:
            self.per_slot = self._peak

    def out_of_memory(self, say: Callable[[str], None]) -> None:
        self.gave_up = True
        gc.collect()  # the failed forward's graph, should a reference cycle hold it
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        say("fold_update: auto: a folded update ran out of GPU memory; accumulating from now on")

    def state(self) -> dict[str, Any] | None:
        """What the policy learnt (the per-slot peak, or that folding ran out of memory), for last.pt: a
        resumed run decides its updates as the uninterrupted one would, instead of measuring again on an
        accumulated update. None while it has learnt nothing (always on a CPU: last.pt unchanged there)."""
        if self.per_slot is None and not self.gave_up:
            return None
        return {"per_slot": self.per_slot, "gave_up": self.gave_up}

    def load_state(self, state: dict[str, Any] | None) -> None:
        if state:
            self.per_slot, self.gave_up = state.get("per_slot"), bool(state.get("gave_up", False))
            # The running maximum the later batches raise: at an update's end (where last.pt is
            # written) it equals per_slot. Left at 0, the resumed run's next update would lower
            # per_slot to the peak seen since the resume, and fold what the uninterrupted run accumulates.
            self._peak = float(self.per_slot or 0.0)


#: fold_update auto: the folded batch's estimated peak must fit in this share of the card's memory,
#: the per-slot peak measured on single batches scaled by this margin.
FOLD_MEMORY_SHARE = 0.85
FOLD_MARGIN = 1.25


def _forward_backward(net: nn.Module, steps: list[Batch], tokens: torch.Tensor, world: int, device: torch.device,
                      amp: str, scaler: Any, folding: FoldPolicy) -> list[tuple[list[str], dict[str, torch.Tensor]]]:
    """Forward and backward of one update's batches (on the host; each moved to ``device`` here), the
    loss scaled by ``world / tokens``. Returns each batch's ids and loss parts (detached tensors, not
    read: :func:`_read_parts` reads them once)."""
    pending = []
    for b, cpu_batch in enumerate(steps):
        sync = b == len(steps) - 1 or world == 1
        ctx = net.no_sync() if (world > 1 and not sync) else contextlib.nullcontext()
        folding.before_batch()
        batch = cpu_batch.to(device)
        with ctx, autocast(device, amp):
            loss, parts = net(batch, HostCounts.of(cpu_batch))
            scaler.scale(loss * world / tokens).backward()
        folding.after_batch(cpu_batch, b == len(steps) - 1)
        pending.append((cpu_batch.ids, parts))
    return pending


def _update_gradients(net: nn.Module, batches: list[Batch], tokens: torch.Tensor, world: int, device: torch.device,
                      amp: str, scaler: Any, folding: "FoldPolicy", optimizer: torch.optim.Optimizer,
                      say: Callable[[str], None]) -> list[tuple[list[str], dict[str, torch.Tensor]]]:
    """The update's gradients: its batches folded into one when ``folding`` says so, else accumulated.

    An out-of-memory error of a folded update (``fold_update: auto``, one process) redoes it accumulated,
    after the handler has ended: while an exception is handled its traceback keeps the failed forward's
    activations alive, and the merged batch is still referenced, so a retry inside the ``except`` would
    find the card as full as it was. Here both are released (and the allocator's cache emptied) first.
    Merging is inside the guard too: it allocates the folded batch on the card."""
    fold = folding.decide(batches)
    if not fold:
        return _forward_backward(net, batches, tokens, world, device, amp, scaler, folding)
    rng = _rng_state(device)  # what the failed attempt draws (dropout) must not shift the retry's draws
    try:
        return _forward_backward(net, [merge_batches(batches, device)], tokens, world, device, amp, scaler, folding)
    except torch.cuda.OutOfMemoryError:
        if world > 1 or folding.mode == "on":
            raise
    # the handler has ended: the traceback, the failed graph and the merged batch are garbage now
    optimizer.zero_grad(set_to_none=True)
    _set_rng_state(device, rng)  # the retry is the update an accumulating run makes, bit for bit
    folding.out_of_memory(say)  # auto: accumulate this update and the rest of the run
    return _forward_backward(net, batches, tokens, world, device, amp, scaler, folding)


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The global generators a forward draws from: the CPU one (lib/model/dropout.py's seeds, SpecAugment
    aside: it has its own) and the device's (CUDA dropout). Host copies of their states: no device sync."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(device: torch.device, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
