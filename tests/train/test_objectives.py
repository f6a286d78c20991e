"""Learning-rate schedule and training losses against hand computations."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lib.train.objectives import (ctc_loss, inverse_sqrt_lr, label_smoothed_nll_loss, learning_rate,
                                  nonpad_label_smoothed_nll_loss, polynomial_decay_lr, token_loss)

PAD = 1


# ----------------------------------------------------------------------------- inverse_sqrt


def test_inverse_sqrt_warmup_is_linear_from_init_lr() -> None:
    lr, warm, init = 2e-3, 10, 1e-7
    for u in range(1, warm):
        assert inverse_sqrt_lr(u, lr, warm, init) == pytest.approx(init + (lr - init) * u / warm, rel=1e-12)
    assert inverse_sqrt_lr(0, lr, warm, init) == pytest.approx(init)
    values = [inverse_sqrt_lr(u, lr, warm, init) for u in range(1, warm + 1)]
    assert values == sorted(values)  # increasing during warm-up


def test_inverse_sqrt_peak_and_decay() -> None:
    lr, warm = 1e-3, 10000
    assert inverse_sqrt_lr(warm, lr, warm) == pytest.approx(lr, rel=1e-12)
    assert inverse_sqrt_lr(4 * warm, lr, warm) == pytest.approx(lr / 2, rel=1e-12)
    assert inverse_sqrt_lr(50000, lr, warm) == pytest.approx(lr * math.sqrt(10000 / 50000), rel=1e-12)
    # continuous at the end of warm-up
    assert inverse_sqrt_lr(warm - 1, lr, warm) == pytest.approx(lr, rel=2e-4)
    assert inverse_sqrt_lr(warm + 1, lr, warm) < lr


def test_polynomial_decay_shares_the_warmup_then_falls_linearly_to_zero() -> None:
    lr, warm, total, init = 1.5e-3, 60, 270, 1e-7
    for u in range(warm):
        assert polynomial_decay_lr(u, lr, warm, total, init) == inverse_sqrt_lr(u, lr, warm, init)
    assert polynomial_decay_lr(warm, lr, warm, total, init) == pytest.approx(lr, rel=1e-12)
    assert polynomial_decay_lr(165, lr, warm, total, init) == pytest.approx(lr / 2, rel=1e-12)  # halfway
    assert polynomial_decay_lr(269, lr, warm, total, init) == pytest.approx(lr / 210, rel=1e-12)  # last update
    assert polynomial_decay_lr(total, lr, warm, total, init) == 0.0
    assert polynomial_decay_lr(total + 5, lr, warm, total, init) == 0.0  # never negative


def test_learning_rate_dispatches_on_the_scheduler_name() -> None:
    assert learning_rate(100, "inverse_sqrt", 1e-3, 10, 200) == inverse_sqrt_lr(100, 1e-3, 10)
    assert learning_rate(100, "polynomial_decay", 1e-3, 10, 200) == polynomial_decay_lr(100, 1e-3, 10, 200)
    with pytest.raises(ValueError, match="lr_scheduler 'cosine'"):
        learning_rate(100, "cosine", 1e-3, 10, 200)


# ----------------------------------------------------------------------------- label smoothing


def _hand_label_smoothed(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[float, float]:
    """Token by token in float64: the smoothed target distribution q puts 1 - eps on the gold
    token and eps / (V - 1) on each other token; loss = -sum_v q_v log p_v (fairseq's formula,
    written differently), nll = -log p_gold; pad targets skipped."""
    V = logits.shape[-1]
    loss = nll = 0.0
    for b in range(target.shape[0]):
        for t in range(target.shape[1]):
            y = int(target[b, t])
            if y == PAD:
                continue
            logp = torch.log_softmax(logits[b, t].double(), dim=-1).tolist()
            q = [eps / (V - 1)] * V
            q[y] = 1.0 - eps
            loss -= sum(qv * lp for qv, lp in zip(q, logp))
            nll -= logp[y]
    return loss, nll


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_matches_hand_computation(eps: float) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g) * 3
    target = torch.randint(2, 7, (3, 5), generator=g)
    target[0, 3:] = PAD
    target[2, 1:] = PAD
    loss, nll = label_smoothed_nll_loss(logits, target, eps, PAD)
    hand_loss, hand_nll = _hand_label_smoothed(logits, target, eps)
    assert float(loss) == pytest.approx(hand_loss, rel=1e-5)
    assert float(nll) == pytest.approx(hand_nll, rel=1e-5)
    if eps == 0.0:
        ref = F.cross_entropy(logits.reshape(-1, 7), target.reshape(-1), ignore_index=PAD, reduction="sum")
        assert float(loss) == pytest.approx(float(ref), rel=1e-6)


def test_label_smoothed_loss_ignores_pad_positions() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 6, generator=g)
    target = torch.tensor([[4, 5, 2, PAD], [3, 2, PAD, PAD]])
    loss, nll = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    wild = logits.clone()
    wild[target == PAD] = torch.randn(int((target == PAD).sum()), 6, generator=g) * 100
    loss2, nll2 = label_smoothed_nll_loss(wild, target, 0.1, PAD)
    assert torch.equal(loss, loss2) and torch.equal(nll, nll2)
    # == the sum over each sentence without its padding
    parts = [label_smoothed_nll_loss(logits[b:b + 1, :n], target[b:b + 1, :n], 0.1, PAD) for b, n in ((0, 3), (1, 2))]
    assert float(loss) == pytest.approx(sum(float(p[0]) for p in parts), rel=1e-6)
    # gradients never reach padded positions
    x = logits.clone().requires_grad_(True)
    label_smoothed_nll_loss(x, target, 0.1, PAD)[0].backward()
    assert torch.all(x.grad[target == PAD] == 0)
    assert torch.all(x.grad[target != PAD].abs().sum(-1) > 0)


def test_label_smoothed_loss_is_float32_for_half_logits() -> None:
    logits = torch.randn(1, 3, 5).to(torch.bfloat16)
    loss, nll = label_smoothed_nll_loss(logits, torch.tensor([[2, 3, 4]]), 0.1, PAD)
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32


# ----------------------------------------------------------------------------- CE over the real tokens


def _padded_logits(seed: int, dtype: torch.dtype, B: int = 4, L: int = 7, V: int = 13):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, L, V, generator=g, dtype=torch.float64) * 4).to(dtype)
    target = torch.randint(2, V, (B, L), generator=g)
    for b, n in enumerate((7, 3, 5, 1)[:B]):
        target[b, n:] = PAD
    return logits, target, int((target != PAD).sum())


def _hand_loss_tensor(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    """fairseq's formula in the logits' own dtype, differentiable (the reference for the gradient)."""
    lprobs = torch.log_softmax(logits, dim=-1)
    real = target != PAD
    nll = -lprobs.gather(-1, target.clamp_min(0)[..., None]).squeeze(-1)[real].sum()
    smooth = -lprobs.sum(-1)[real].sum()
    eps_i = eps / (logits.size(-1) - 1)
    return (1 - eps - eps_i) * nll + eps_i * smooth


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_bytes", [4 * 13, 4 * 13 * 3, 1 << 25])  # 1 row, 3 rows, all rows per chunk
def test_nonpad_loss_equals_fairseqs_formula_fp64(eps: float, chunk_bytes: int) -> None:
    """Loss, nll and the gradient of every logit (pad positions included: 0) against the formula
    differentiated by autograd, in fp64, whatever the chunking."""
    logits, target, n = _padded_logits(0, torch.float64)
    x = logits.clone().requires_grad_(True)
    loss, nll = nonpad_label_smoothed_nll_loss(x, target, eps, PAD, n, chunk_bytes=chunk_bytes)
    hand_loss, hand_nll = _hand_label_smoothed(logits, target, eps)
    assert loss.dtype == torch.float64 and not nll.requires_grad
    assert float(loss.detach()) == pytest.approx(hand_loss, rel=1e-12) and float(nll) == pytest.approx(hand_nll, rel=1e-12)
    (loss * 0.37).backward()
    y = logits.clone().requires_grad_(True)
    (_hand_loss_tensor(y, target, eps) * 0.37).backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-10, atol=1e-13)
    assert torch.all(x.grad[target == PAD] == 0) and torch.all(x.grad[target != PAD].abs().sum(-1) > 0)


def test_nonpad_loss_in_bf16_equals_the_reference_and_keeps_no_fp32_copy_of_the_logits() -> None:
    """bf16 logits (what autocast gives the loss on a GPU): the same sums as the whole-logits reference to
    fp32 rounding, a bf16 gradient within bf16 rounding of the reference's; and the autograd graph keeps
    the bf16 logits and one fp32 number per token, where the reference keeps fp32 log-probs of every slot."""
    logits, target, n = _padded_logits(1, torch.bfloat16, V=50)

    def run(fn):
        x = logits.clone().requires_grad_(True)
        saved: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            loss, nll = fn(x)
        loss.backward()
        return loss, nll, x.grad, saved

    loss, nll, grad, saved = run(lambda x: nonpad_label_smoothed_nll_loss(x, target, 0.1, PAD, n, chunk_bytes=4 * 50 * 4))
    ref_loss, ref_nll, ref_grad, ref_saved = run(lambda x: label_smoothed_nll_loss(x, target, 0.1, PAD))
    assert loss.dtype == nll.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), rel=1e-6) and float(nll.detach()) == pytest.approx(float(ref_nll.detach()), rel=1e-6)
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=0, atol=2 ** -8)
    wide = lambda ts: [t for t in ts if t.dtype == torch.float32 and t.dim() and t.shape[-1] == 50]  # noqa: E731
    assert wide(saved) == [] and len(wide(ref_saved)) >= 1


def test_token_loss_keeps_the_reference_on_the_cpu_bit_for_bit() -> None:
    """``nonpad`` None on CPU logits is the whole-logits reference (a CPU run's bits do not move);
    forced, the other path, equal to fp32 rounding."""
    logits, target, n = _padded_logits(2, torch.float32)
    ref = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    auto = token_loss(logits, target, 0.1, PAD, n)
    assert torch.equal(auto[0], ref[0]) and torch.equal(auto[1], ref[1])
    forced = token_loss(logits, target, 0.1, PAD, n, nonpad=True)
    assert float(forced[0]) == pytest.approx(float(ref[0]), rel=1e-6)
    assert float(forced[1]) == pytest.approx(float(ref[1]), rel=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nonpad_loss_on_cuda_equals_the_reference_and_peaks_lower() -> None:
    """On a GPU, bf16 logits of a paper-sized batch (2,500 real tokens of 4,000 slots, V = 8,000): the same
    loss and gradient as the reference (fp32 rounding / bf16 rounding), and a lower memory peak over the
    forward and backward (the reference holds fp32 log-probs of every slot)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    B, L, V = 100, 40, 8000
    logits = torch.randn(B, L, V, generator=g, device=dev).mul_(3).to(torch.bfloat16)
    lengths = torch.randint(10, L + 1, (B,), generator=g, device=dev)
    target = torch.randint(2, V, (B, L), generator=g, device=dev)
    target[torch.arange(L, device=dev)[None, :] >= lengths[:, None]] = PAD
    n = int((target != PAD).sum())

    def run(fn):
        x = logits.clone().requires_grad_(True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss, nll = fn(x)
        loss.backward()
        torch.cuda.synchronize()
        return loss, nll, x.grad, torch.cuda.max_memory_allocated() - base

    loss, nll, grad, peak = run(lambda x: token_loss(x, target, 0.1, PAD, n))  # nonpad: the CUDA default
    ref_loss, ref_nll, ref_grad, ref_peak = run(lambda x: token_loss(x, target, 0.1, PAD, n, nonpad=False))
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5) and float(nll) == pytest.approx(float(ref_nll), rel=1e-5)
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=0, atol=2 ** -8)
    assert peak < 0.6 * ref_peak, (peak, ref_peak)


# ----------------------------------------------------------------------------- CTC


def _ctc_inputs(enc_lengths: list[int], label_lengths: list[int], V: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, N = len(enc_lengths), max(enc_lengths)
    logits = torch.randn(B, N, V, generator=g)
    L = max(label_lengths) + 1
    target = torch.full((B, L), PAD, dtype=torch.long)
    for b, n in enumerate(label_lengths):
        target[b, :n] = torch.randint(3, V, (n,), generator=g)  # no blank (0), pad (1) or eos (2)
        target[b, n] = 2  # eos
    return logits, torch.tensor(enc_lengths), target, torch.tensor([n + 1 for n in label_lengths])


def test_ctc_loss_finite_and_matches_torch_per_utterance() -> None:
    logits, enc_len, target, tlen = _ctc_inputs([10, 7], [4, 3])
    x = logits.clone().requires_grad_(True)
    loss = ctc_loss(x, enc_len, target, tlen, blank=0)
    assert math.isfinite(loss.item()) and loss.item() > 0
    loss.backward()
    assert torch.isfinite(x.grad).all()
    per = 0.0
    for b in range(2):
        lp = torch.log_softmax(logits[b, : int(enc_len[b])], -1)[:, None]
        lab = target[b, : int(tlen[b]) - 1][None]  # eos dropped
        per += float(F.ctc_loss(lp, lab, enc_len[b:b + 1], tlen[b:b + 1] - 1, blank=0, reduction="sum"))
    assert loss.item() == pytest.approx(per, rel=1e-5)


def test_ctc_loss_zero_infinity_drops_impossible_utterances() -> None:
    """An utterance whose encoder output is shorter than its labels (impossible alignment)
    contributes 0 instead of inf; the batch loss equals that of the feasible utterance."""
    logits, enc_len, target, tlen = _ctc_inputs([10, 2], [4, 5])
    x = logits.clone().requires_grad_(True)
    loss = ctc_loss(x, enc_len, target, tlen, blank=0)
    alone = ctc_loss(logits[:1], enc_len[:1], target[:1], tlen[:1], blank=0)
    assert math.isfinite(loss.item())
    assert loss.item() == pytest.approx(alone.item(), rel=1e-6)
    loss.backward()
    assert torch.isfinite(x.grad).all()
    assert torch.all(x.grad[1] == 0)


def test_ctc_weight_at_is_constant_then_falls_linearly_to_zero() -> None:
    from lib.train.objectives import ctc_weight_at

    # off (decay_from 0): the weight at every update
    assert [ctc_weight_at(u, 0.3, 0, 10) for u in (0, 5, 9)] == [0.3, 0.3, 0.3]
    # 0.3 for updates 1..6 (u = 0..5 completed), then 0.3 * (10 - u) / 4 for u = 6..9: 0.3, 0.225, 0.15, 0.075
    got = [ctc_weight_at(u, 0.3, 6, 10) for u in range(10)]
    assert got[:6] == [0.3] * 6
    assert got[6:] == pytest.approx([0.3, 0.225, 0.15, 0.075])
    assert ctc_weight_at(10, 0.3, 6, 10) == 0.0  # past the end (never trained)


@pytest.mark.parametrize("bad", [dict(ctc_decay_from=10, max_updates=10, ctc_weight=0.3),
                                 dict(ctc_decay_from=-1, max_updates=10, ctc_weight=0.3),
                                 dict(ctc_decay_from=5, max_updates=10, ctc_weight=0.0)])
def test_ctc_decay_from_out_of_range_is_named(bad: dict) -> None:
    from lib.params import TrainConfig

    with pytest.raises(ValueError, match=r"train_asr\.ctc_decay_from"):
        TrainConfig(**bad).validate("train_asr")


def test_ctc_start_weight_falls_linearly_to_the_runs_weight() -> None:
    from lib.train.objectives import ctc_weight_at

    # 0.5 at the first update, 0.1 from update 5 on (u = 4 completed: 0.5 + (0.1 - 0.5) * 4 / 4 = 0.1)
    got = [ctc_weight_at(u, 0.1, 0, 10, start_updates=4, start_weight=0.5) for u in range(10)]
    assert got == pytest.approx([0.5, 0.4, 0.3, 0.2] + [0.1] * 6)
    # with a decay after it: the two phases do not overlap
    got = [ctc_weight_at(u, 0.2, 6, 10, start_updates=2, start_weight=0.6) for u in range(10)]
    assert got == pytest.approx([0.6, 0.4, 0.2, 0.2, 0.2, 0.2, 0.2, 0.15, 0.1, 0.05])


@pytest.mark.parametrize("bad", [dict(ctc_start_updates=3, ctc_start_weight=0.0),
                                 dict(ctc_start_updates=-1, ctc_start_weight=0.5),
                                 dict(ctc_start_updates=10, ctc_start_weight=0.5),
                                 dict(ctc_start_updates=6, ctc_start_weight=0.5, ctc_decay_from=5)])
def test_ctc_start_out_of_range_is_named(bad: dict) -> None:
    from lib.params import TrainConfig

    with pytest.raises(ValueError, match=r"train_asr\.ctc_start_updates"):
        TrainConfig(**{"max_updates": 10, "ctc_weight": 0.1, **bad}).validate("train_asr")


def test_fp64_logits_keep_the_losses_in_fp64_and_low_precision_ones_go_to_fp32():
    """amp: fp64 (exactness checks): the CE and CTC stay in float64; bf16 logits are upcast to fp32,
    fp32 ones used as they are (the CPU default's bits)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    target = torch.tensor([[3, 4, 2, 1, 1], [5, 2, 1, 1, 1]])
    loss64, nll64 = label_smoothed_nll_loss(logits, target, 0.1, 1)
    assert loss64.dtype == nll64.dtype == torch.float64
    loss32, _ = label_smoothed_nll_loss(logits.float(), target, 0.1, 1)
    assert loss32.dtype == torch.float32 and loss64.item() == pytest.approx(loss32.item(), rel=1e-6)
    assert label_smoothed_nll_loss(logits.bfloat16(), target, 0.1, 1)[0].dtype == torch.float32
    lengths = torch.tensor([5, 4])
    ctc64 = ctc_loss(logits, lengths, target, torch.tensor([3, 2]), blank=0)
    assert ctc64.dtype == torch.float64
    assert ctc64.item() == pytest.approx(ctc_loss(logits.float(), lengths, target, torch.tensor([3, 2]), blank=0).item(),
                                         rel=1e-6)


def test_warmup_starts_at_1e7_by_default() -> None:
    """The default warmup_init_lr (1e-7, params.yaml and TrainConfig) is the lr of the very first update."""
    assert inverse_sqrt_lr(0, 2e-3, 10) == pytest.approx(1e-7, rel=1e-12)
    assert inverse_sqrt_lr(1, 2e-3, 10) == pytest.approx(1e-7 + (2e-3 - 1e-7) / 10, rel=1e-12)
