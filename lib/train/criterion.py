"""The training loss as one module: :class:`Criterion` (the model plus its loss). It owns every loss
term: label-smoothed CE, CTC, and head selection's KL (:func:`head_selection_kl_term`, collected from
the model's head selectors by :func:`selection_kl_per_task`, once per batch).

Kept apart from the training loop (lib/train/loop.py, which re-exports it) so that the ``amp: probe``
probe of lib/train/precision.py, which times training steps, can build it without importing the loop.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lib.data.dataset import BOS_ID, PAD_ID, Batch
from lib.train.objectives import ctc_loss, token_loss

__all__ = ["Criterion", "HostCounts", "head_selection_kl_term", "head_selectors", "selection_kl_per_task"]


@dataclass(frozen=True)
class HostCounts:
    """What the loss needs to know about a batch as host numbers, read before the batch moves to the GPU
    (reading them from device tensors would wait for the GPU): its frame lengths, its target tokens and
    (for CTC) each target's length. ``target_lengths`` None: CTC reads its lengths from the batch (a
    copy to the host inside ``F.ctc_loss``, once per batch on CUDA)."""

    feat_lengths: list[int]
    n_target_tokens: int
    target_lengths: list[int] | None = None

    @staticmethod
    def of(batch: Batch) -> "HostCounts":
        """From a batch whose tensors are on the host (a sync when they are not)."""
        target_lengths = [int(x) for x in batch.target_lengths.tolist()]
        return HostCounts([int(x) for x in batch.feat_lengths.tolist()], sum(target_lengths), target_lengths)

    def ctc_lengths(self, encoder: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
        """CTC's input and target lengths as CPU tensors (``encoder.output_lengths`` of the frame lengths,
        and the targets' lengths): ``F.ctc_loss`` copies device lengths to the host, which waits for
        the GPU; host ones it uses as they are. The same numbers as the device's, so the same loss."""
        if self.target_lengths is None:
            return None
        return (encoder.output_lengths(torch.tensor(self.feat_lengths, dtype=torch.long)),
                torch.tensor(self.target_lengths, dtype=torch.long))


def head_selectors(model: nn.Module) -> dict[str, list[nn.Module]]:
    """The head selectors of ``model`` (modules that say ``selects_heads``, with a ``kl()`` of (tasks, H'),
    lib.model.attention.head_selection.HeadSelector) per side, ``encoder`` / ``decoder`` (the first of
    the two in the module's name, so a wrapped model's ``module.`` / ``_orig_mod.`` prefix does not
    matter), in module order. Found by that mark, so the criterion never imports the variant; empty for
    a model without head selection."""
    sides: dict[str, list[nn.Module]] = {}
    for name, m in model.named_modules():
        if getattr(m, "selects_heads", False):
            parts = name.split(".")
            side = next((p for p in parts if p in ("encoder", "decoder")), parts[0])
            sides.setdefault(side, []).append(m)
    return sides


def selection_kl_per_task(selectors: Mapping[str, Sequence[nn.Module]]) -> dict[str, torch.Tensor]:
    """K_t per side, (tasks,): the Bernoulli KL of σ(φ) to the prior H / H' (docs/variants.md), averaged
    over the side's ``selectors`` (:func:`head_selectors`) and their H' candidates."""
    return {side: torch.cat([m.kl() for m in mods], dim=1).mean(dim=1) for side, mods in selectors.items()}


def head_selection_kl_term(per_task: dict[str, torch.Tensor], task: torch.Tensor, n_tokens: torch.Tensor,
                           weight: float | Mapping[str, float | Sequence[float] | torch.Tensor] = 1.0) -> torch.Tensor:
    """The head-selection KL term of one batch: Σ_side Σ_t λ_{side,t} · n_t · K_t^side (docs/variants.md),
    from ``per_task`` = ``{side: K_t (tasks,)}`` (:func:`selection_kl_per_task`); n_t the
    target tokens (eos included) of the batch's samples of task t (fairseq's per-task token weighting;
    the loop divides the update's summed loss by its token count as for the CE).

    ``task`` (B,) long, ``n_tokens`` (B,) target lengths. ``weight`` λ: a float for every side and task,
    or ``{side: float | (tasks,) per task}`` for both sides (e.g. from
    ``lib.train.head_selection.elbo_kl_weights``). A model
    without head selection (``per_task`` empty) gives 0.

    A float λ enters as a Python number and a per-task λ already on K_t's device is used as it is, so
    that on CUDA the term copies nothing from the host (a copy from pageable memory waits for the GPU;
    :class:`Criterion` puts a run's per-task weights on the device once)."""
    if not per_task:
        return torch.zeros((), device=n_tokens.device)
    total: torch.Tensor | None = None
    for side, k_t in per_task.items():
        n_t = torch.zeros_like(k_t).index_add_(0, task.to(k_t.device), n_tokens.to(k_t))
        if isinstance(weight, Mapping):
            if side not in weight:
                raise ValueError(f"head_selection_kl: no weight for side {side!r} (have {sorted(weight)})")
            lam: float | torch.Tensor = torch.as_tensor(weight[side], dtype=k_t.dtype, device=k_t.device)
        else:
            lam = float(weight)
        term = (lam * n_t * k_t).sum()
        total = term if total is None else total + term
    return total  # type: ignore[return-value]


class Criterion(nn.Module):
    """The model plus its training loss, as one module so that DistributedDataParallel wraps the
    whole forward (DDP only synchronises gradients of computations run through its forward).

    Head-selection models (docs/variants.md, reading B3): the batch's task ids reach the model, the
    KL term Σ_side Σ_t n_t K_t^side is computed and returned as part ``kl`` (summed like the CE, so
    ``kl / tokens`` is per target token), and ``kl_weight`` λ (a float, or ``{side: [λ per task]}``)
    times it is added to the loss when λ is not 0. Models without head selection: unchanged.

    ``host_parts`` (default True): the parts come back as Python floats (one device read each); False
    (the training loop): as detached 0-dim tensors, read once per update by the caller, so a CUDA
    training step waits for nothing."""

    def __init__(self, model: nn.Module, label_smoothing: float, ctc_weight: float,
                 kl_weight: float | dict[str, list[float]] = 0.0) -> None:
        super().__init__()
        self.model, self.label_smoothing, self.ctc_weight = model, label_smoothing, ctc_weight
        self.kl_weight = kl_weight
        self.host_parts = True
        # the CE's path (lib.train.objectives.token_loss): None = over the real tokens in fp32 chunks on
        # CUDA, the whole-logits reference elsewhere; True / False force one (the tests compare them)
        self.nonpad_loss: bool | None = None
        self.selectors = head_selectors(model)  # the modules whose KL is a loss term
        self.head_selection = bool(self.selectors)
        self._kl_weight_on: tuple[tuple, dict[str, torch.Tensor]] | None = None  # per-task λ on the KL's device

    def forward(self, batch: Batch, host: HostCounts | None = None) -> tuple[torch.Tensor, dict]:
        """Summed loss of one batch: label-smoothed CE (+ ctc_weight * CTC) (+ λ KL), and its parts.
        ``host``: the batch's :class:`HostCounts` when the caller has them (else read from ``batch``)."""
        enc = self.model.encode(batch.feats, batch.feat_lengths, task=batch.task,
                                **({"feat_lengths_host": host.feat_lengths} if host is not None else {}))
        logits = self.model.decode(batch.prev_tokens, enc)
        n_tokens = host.n_target_tokens if host is not None else batch.n_target_tokens
        loss, nll = token_loss(logits, batch.target, self.label_smoothing, PAD_ID, n_tokens, self.nonpad_loss)
        parts = {"nll": nll.detach(), "ce": loss.detach()}
        if self.ctc_weight > 0:
            if enc.ctc_logits is None:
                raise ValueError("ctc_weight > 0 but the model has no CTC head (set ctc_vocab_size)")
            # CTC is summed over labels without eos; rescale so both terms are per target token, by the
            # batch's tokens / labels. A folded batch applies each utterance the factor of the batch it
            # came from, as accumulating those batches would (lib.train.loop.merge_batches).
            lengths = host.ctc_lengths(self.model.encoder) if host is not None else None
            enc_lengths, target_lengths = lengths or (enc.lengths, batch.target_lengths)
            if batch.ctc_scale is None:
                c = ctc_loss(enc.ctc_logits, enc_lengths, batch.target, target_lengths, blank=BOS_ID)
                labels = n_tokens - len(batch.ids)
                loss = loss + self.ctc_weight * c * n_tokens / max(1, labels)
            else:
                per = ctc_loss(enc.ctc_logits, enc_lengths, batch.target, target_lengths, blank=BOS_ID,
                               reduction="none")
                c = per.sum()
                loss = loss + self.ctc_weight * (per * batch.ctc_scale.to(per.dtype)).sum()
            parts["ctc"] = c.detach()
        if self.head_selection:
            if batch.task is None:
                raise ValueError("a head-selection model needs task ids in its batches (Batch.task)")
            per_task = selection_kl_per_task(self.selectors)  # the modules' KL: computed once per batch
            parts["kl"] = head_selection_kl_term(per_task, batch.task, batch.target_lengths).detach()
            if isinstance(self.kl_weight, dict) or self.kl_weight != 0:
                loss = loss + head_selection_kl_term(per_task, batch.task, batch.target_lengths,
                                                     self._kl_weight_like(per_task))
        if self.host_parts:
            return loss, {k: v.item() for k, v in parts.items()}
        return loss, parts

    def _kl_weight_like(self, per_task: dict[str, torch.Tensor]) -> float | dict[str, torch.Tensor]:
        """``kl_weight``, its per-task lists as tensors on the KL's device and dtype: copied there on the
        first batch and kept (the weights are fixed for the run), not once per batch."""
        if not isinstance(self.kl_weight, dict):
            return self.kl_weight
        k_t = next(iter(per_task.values()))
        key = (k_t.device, k_t.dtype)
        if self._kl_weight_on is None or self._kl_weight_on[0] != key:
            self._kl_weight_on = (key, {side: torch.as_tensor(w, dtype=k_t.dtype).to(k_t.device)
                                        for side, w in self.kl_weight.items()})
        return self._kl_weight_on[1]
