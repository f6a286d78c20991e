"""Training objectives and the learning-rate schedule (fairseq's S2T MuST-C recipe)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def _at_least_fp32(t: Tensor) -> Tensor:
    """bf16 / fp16 logits upcast to fp32 for the loss; fp32 and fp64 ones as they are (an fp64 run's
    loss stays fp64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int) -> tuple[Tensor, Tensor]:
    """fairseq's ``label_smoothed_cross_entropy``: summed over non-pad tokens (not averaged).

    loss = (1 - eps - eps/(V-1)) * nll + eps/(V-1) * sum_v(-log p_v), as fairseq computes it.
    Returns ``(loss_sum, nll_sum)`` in nats; divide by the token count for per-token values.
    """
    lprobs = F.log_softmax(_at_least_fp32(logits), dim=-1)  # (B, L, V)
    target = target.unsqueeze(-1)
    nll = -lprobs.gather(dim=-1, index=target.clamp_min(0))
    smooth = -lprobs.sum(dim=-1, keepdim=True)
    pad = target.eq(ignore_index)
    nll = nll.masked_fill(pad, 0.0).sum()
    smooth = smooth.masked_fill(pad, 0.0).sum()
    eps_i = epsilon / (lprobs.size(-1) - 1)
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    return loss, nll


class _NonPadLabelSmoothedCE(torch.autograd.Function):
    """The label-smoothed CE of (N, V) logits rows, all of them real tokens, in fp32 row chunks: the forward
    keeps the logits (in their own dtype) and one fp32 log-normaliser per row, the backward rebuilds the
    softmax chunk by chunk. So no fp32 (N, V) tensor exists at any time, only one chunk's. (fp64 logits
    are summed in fp64, where the reference rounds them to fp32.)

    Gradient: with p = softmax(x), d loss / d x_v = (1 − ε − ε_i)(p_v − [v = t]) + ε_i (V p_v − 1)
    = p_v − (1 − ε − ε_i)[v = t] − ε_i, since (1 − ε − ε_i) + ε_i V = 1 for ε_i = ε / (V − 1)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, chunk_rows: int):  # type: ignore[override]
        n, v = logits.shape
        eps_i = epsilon / (v - 1)
        wide = torch.promote_types(logits.dtype, torch.float32)  # fp32, or fp64 for fp64 logits
        lse = torch.empty(n, dtype=wide, device=logits.device)
        nll = torch.zeros((), dtype=wide, device=logits.device)
        smooth = torch.zeros((), dtype=wide, device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):
            for lo in range(0, n, chunk_rows):
                x = logits[lo:lo + chunk_rows].to(wide)
                norm = torch.logsumexp(x, dim=-1)
                lse[lo:lo + chunk_rows] = norm
                nll = nll + (norm - x.gather(-1, target[lo:lo + chunk_rows, None]).squeeze(-1)).sum()
                smooth = smooth + (norm[:, None] - x).sum()  # Σ_v −log p_v, as fairseq sums the log-probs
        ctx.save_for_backward(logits, target, lse)
        ctx.coefficients = (1.0 - epsilon - eps_i, eps_i)
        ctx.chunk_rows = chunk_rows
        ctx.mark_non_differentiable(nll)
        return (1.0 - epsilon - eps_i) * nll + eps_i * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):  # type: ignore[override]
        logits, target, lse = ctx.saved_tensors
        on_target, eps_i = ctx.coefficients
        grad = torch.empty_like(logits)
        rows = ctx.chunk_rows
        with torch.autocast(logits.device.type, enabled=False):
            for lo in range(0, logits.shape[0], rows):
                g = torch.exp(logits[lo:lo + rows].to(lse.dtype) - lse[lo:lo + rows, None]).sub_(eps_i)
                t = target[lo:lo + rows, None]
                g.scatter_add_(-1, t, torch.full(t.shape, -on_target, dtype=g.dtype, device=g.device))
                grad[lo:lo + rows] = g.mul_(grad_loss)
        return grad, None, None, None


def nonpad_label_smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int,
                                   n_tokens: int, chunk_bytes: int = 1 << 25) -> tuple[Tensor, Tensor]:
    """:func:`label_smoothed_nll_loss` over the real tokens only, without an fp32 copy of the logits:
    the same ``(loss_sum, nll_sum)`` to fp32 rounding (the sums run in another order), the same gradient.

    ``n_tokens``: the batch's non-pad target tokens, a host number (the loop reads it before the batch
    moves to the GPU). The real positions are picked by a stable sort of the pad mask cut at ``n_tokens``
    rather than ``nonzero`` (whose size the host would have to wait for), then the loss runs over those
    (n_tokens, V) rows in fp32 chunks of at most ``chunk_bytes`` (:class:`_NonPadLabelSmoothedCE`).
    Pad positions get a zero gradient, as in the reference."""
    v = logits.size(-1)
    flat_target = target.reshape(-1)
    keep = torch.argsort(flat_target.eq(ignore_index).to(torch.uint8), stable=True)[:n_tokens]
    rows = logits.reshape(-1, v).index_select(0, keep)
    return _NonPadLabelSmoothedCE.apply(rows, flat_target.index_select(0, keep), float(epsilon),
                                        max(1, chunk_bytes // (4 * v)))


def token_loss(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int, n_tokens: int,
               nonpad: bool | None = None) -> tuple[Tensor, Tensor]:
    """The decoder's label-smoothed CE, by the path that suits the device: ``nonpad`` None picks
    :func:`nonpad_label_smoothed_nll_loss` for CUDA logits (less memory: no fp32 copy of B × L × V, no
    pad rows) and :func:`label_smoothed_nll_loss` elsewhere, which keeps a CPU run's bits as they were."""
    if nonpad if nonpad is not None else logits.is_cuda:
        return nonpad_label_smoothed_nll_loss(logits, target, epsilon, ignore_index, n_tokens)
    return label_smoothed_nll_loss(logits, target, epsilon, ignore_index)


def ctc_loss(ctc_logits: Tensor, enc_lengths: Tensor, target: Tensor, target_lengths: Tensor, blank: int,
             reduction: str = "sum") -> Tensor:
    """Summed CTC loss of the encoder's CTC head against targets without the final eos
    (``reduction="none"``: one loss per utterance, (B,)).

    ``target`` is the decoder target (ending with eos, padded); ``target_lengths`` counts the eos.
    Utterances whose encoder output is shorter than the label sequence contribute 0 (zero_infinity).
    The padded targets go to CTC as they are (each row read up to its length, the eos and padding
    past it ignored): no host read per utterance, and the same bits as the concatenated labels on a CPU.
    ``F.ctc_loss`` reads both length vectors on the host: with CUDA logits, lengths given as CPU tensors
    (lib.train.criterion.HostCounts.ctc_lengths) spare the copy that would wait for the GPU.
    """
    lprobs = F.log_softmax(_at_least_fp32(ctc_logits), dim=-1).transpose(0, 1)  # (N, B, V)
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
