"""Training objectives and the learning-rate schedule (fairseq's S2T MuST-C recipe)."""
from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int) -> tuple[Tensor, Tensor]:
    """fairseq's ``label_smoothed_cross_entropy``: summed over non-pad tokens (not averaged).

    loss = (1 - eps - eps/(V-1)) * nll + eps/(V-1) * sum_v(-log p_v), as fairseq computes it.
    Returns ``(loss_sum, nll_sum)`` in nats; divide by the token count for per-token values.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (B, L, V)
    target = target.unsqueeze(-1)
    nll = -lprobs.gather(dim=-1, index=target.clamp_min(0))
    smooth = -lprobs.sum(dim=-1, keepdim=True)
    pad = target.eq(ignore_index)
    nll = nll.masked_fill(pad, 0.0).sum()
    smooth = smooth.masked_fill(pad, 0.0).sum()
    eps_i = epsilon / (lprobs.size(-1) - 1)
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    return loss, nll


def ctc_loss(ctc_logits: Tensor, enc_lengths: Tensor, target: Tensor, target_lengths: Tensor, blank: int,
             reduction: str = "sum") -> Tensor:
    """Summed CTC loss of the encoder's CTC head against targets without the final eos
    (``reduction="none"``: one loss per utterance, (B,)).

    ``target`` is the decoder target (ending with eos, padded); ``target_lengths`` counts the eos.
    Utterances whose encoder output is shorter than the label sequence contribute 0 (zero_infinity).
    The padded targets go to CTC as they are (each row read up to its length, the eos and padding
    past it ignored): no host read per utterance, and the same bits as the concatenated labels on a CPU.
    """
    lprobs = F.log_softmax(ctc_logits.float(), dim=-1).transpose(0, 1)  # (N, B, V)
    lengths = target_lengths - 1  # drop eos
    return F.ctc_loss(lprobs, target, enc_lengths, lengths, blank=blank, reduction=reduction, zero_infinity=True)


def inverse_sqrt_lr(update: int, lr: float, warmup_updates: int, warmup_init_lr: float = 1e-7) -> float:
    """fairseq's ``inverse_sqrt``: linear warm-up from ``warmup_init_lr`` to ``lr`` over
    ``warmup_updates`` updates, then ``lr * sqrt(warmup_updates / update)``. ``update`` is the number of
    updates completed so far (0 for the first update, as fairseq's ``lr_step(num_updates)``)."""
    if update < warmup_updates:
        return warmup_init_lr + (lr - warmup_init_lr) * update / warmup_updates
    return lr * math.sqrt(warmup_updates / max(update, 1))


def polynomial_decay_lr(update: int, lr: float, warmup_updates: int, max_updates: int,
                        warmup_init_lr: float = 1e-7) -> float:
    """fairseq's ``polynomial_decay`` with power 1 and ``end_learning_rate`` 0: the same linear warm-up
    as :func:`inverse_sqrt_lr`, then a straight line from ``lr`` down to 0 at ``max_updates``. A short
    run ends at a small step size instead of ``lr * sqrt(warmup / max_updates)``, so its last snapshots
    (and their average) settle instead of jumping with the last batches."""
    if update < warmup_updates:
        return warmup_init_lr + (lr - warmup_init_lr) * update / warmup_updates
    return lr * max(max_updates - update, 0) / max(max_updates - warmup_updates, 1)


def learning_rate(update: int, scheduler: str, lr: float, warmup_updates: int, max_updates: int,
                  warmup_init_lr: float = 1e-7) -> float:
    """The lr of the update after ``update`` completed ones under ``scheduler`` (``TrainConfig.lr_scheduler``)."""
    if scheduler == "inverse_sqrt":
        return inverse_sqrt_lr(update, lr, warmup_updates, warmup_init_lr)
    if scheduler == "polynomial_decay":
        return polynomial_decay_lr(update, lr, warmup_updates, max_updates, warmup_init_lr)
    raise ValueError(f"unknown lr_scheduler {scheduler!r} (inverse_sqrt | polynomial_decay)")


def ctc_weight_at(update: int, ctc_weight: float, decay_from: int, max_updates: int,
                  start_updates: int = 0, start_weight: float = 0.0) -> float:
    """The auxiliary CTC loss's weight for the update after ``update`` completed ones (demo options, both
    off by default: then ``ctc_weight`` throughout):

    - ``start_updates`` > 0 (``TrainConfig.ctc_start_updates``): ``start_weight`` at the first update, falling
      linearly to ``ctc_weight`` at ``start_updates``: a strong CTC signal while the encoder learns to align
      frames to tokens, the run's weight after that;
    - ``decay_from`` > 0 (``TrainConfig.ctc_decay_from``): ``ctc_weight`` until ``decay_from`` updates, then
      falling linearly to 0 at ``max_updates``: the decay hands the top layers to the decoder's loss alone for
      the rest of the run (docs/locality-study.md, row U)."""
    if start_updates > 0 and update < start_updates:
        return start_weight + (ctc_weight - start_weight) * update / start_updates
    if decay_from <= 0 or update < decay_from:
        return float(ctc_weight)
    return ctc_weight * max(max_updates - update, 0) / max(max_updates - decay_from, 1)
