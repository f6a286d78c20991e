"""Attention head selection for multilingual ST (Gong et al.; docs/variants.md, library items 1-10):
the encoder module (lib.model.attention.HeadSelectionAttention), the decoder module
(lib.model.attention.head_selection.HeadSelectionMultiheadAttention), task ids end to end (Batch.task,
EncoderOutput.task, Criterion), the tiled ASR initialisation, the tag as decoder start token and the
spec / config validation (lib.model.spec.head_selection_spec, lib.model.config).

Item numbers refer to the spec's docs/variants.md list. float64 wherever exactness matters."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from lib.data.dataset import EOS_ID, PAD_ID, Batch, collate
from lib.decode.beam_search import BeamSearchConfig, beam_search, greedy_search
from lib.train.criterion import head_selection_kl_term, head_selectors, selection_kl_per_task
from lib.model.checkpoint import load_decoder_layers, load_encoder
from lib.model.attention import (
    FullAttention,
    HeadSelectionAttention,
    LocalAttention,
    bernoulli_kl,
    build_attention,
    candidate_slots,
    gather_heads,
    logistic_noise,
    merge_slots,
    select_heads,
    set_head_selection_noise,
    set_head_selection_tau,
)
from lib.model.config import ModelConfig
from lib.model.s2t_transformer import (
    EncoderOutput,
    S2TTransformer,
    model_config,
)
from lib.model.attention import HeadSelectionMultiheadAttention
from lib.model.spec import decoder_head_selection_spec, head_selection_spec, local_attention_spec
from lib.train.loop import Criterion
from lib.train.head_selection import HeadSelectionTraining, elbo_kl_weights, head_selection_tau, head_selections

D, H = 16, 4
DH = D // H
T = 3  # tasks
F64 = torch.float64


def _module(strategy: str = "group", candidates: int = 8, *, tasks: int = T, window: int | None = None,
            seed: int = 0, train: bool = False) -> HeadSelectionAttention:
    """A float64 encoder head-selection module, dropout 0, with random (spread) logits."""
    spec = {"type": "head_select", "strategy": strategy, "candidates": candidates, "tasks": tasks}
    if window is not None:
        spec["window"] = window
    torch.manual_seed(seed)
    m = build_attention(spec, D, H, 0.0).to(F64)
    with torch.no_grad():
        m.selector.head_logits.copy_(2.0 * torch.randn(m.selector.head_logits.shape, dtype=F64))
    return m.train(train)


def _batch(lengths: list[int], n: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), n, D, generator=g, dtype=F64)
    mask = torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]  # (B, N) True = padding
    return x.masked_fill(mask[..., None], 1e3), mask  # garbage in padded frames must not matter


def _cfg(enc: str | None = "group", dec: str | None = "group", candidates: int = 8, **kw) -> ModelConfig:
    """Tiny float model (d 16, H 4, 2 + 2 layers), dropout 0, head selection on the named sides."""
    spec = {"strategy": enc, "candidates": candidates, "tasks": T}
    over = dict(n_heads=H, decoder_layers=2, vocab_size=24, dropout=0.0, attention_dropout=0.0,
                activation_dropout=0.0)
    if enc is not None:
        over["encoder_attention"] = [{"type": "head_select", **spec}] * 2
    if dec is not None:
        over["decoder_self_attention"] = {"type": "head_select", **spec, "strategy": dec}
    return model_config("tiny", **{**over, **kw})


def _model(seed: int = 0, **kw) -> S2TTransformer:
    torch.manual_seed(seed)
    m = S2TTransformer(_cfg(**kw)).to(F64)
    with torch.no_grad():
        for mods in m.head_selection_layers().values():
            for _, mod in mods:
                mod.head_logits.copy_(2.0 * torch.randn(mod.head_logits.shape, dtype=F64))
    return m.eval()


def _feats(lengths: list[int], seed: int = 1) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(len(lengths), max(lengths), 80, generator=g, dtype=F64), torch.tensor(lengths)


def _tokens(rows: list[list[int]]) -> Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(r)
    return out


# ----------------------------------------------------------------------------------------
# 1. Exact head counts per strategy; eval selection = top-H / per-group argmax, ties -> lower index
# ----------------------------------------------------------------------------------------


def test_selection_by_hand() -> None:
    phi = torch.tensor([[0.1, 0.5, 0.2, 0.9]])
    # subset: top-2 = {3, 1} (value order 3, 1); listed by slot c mod H, then index
    assert select_heads(phi, 2, "subset").tolist() == [[1, 3]]
    # group, strided (B7): groups {0, 2} and {1, 3} -> 2 and 3 (contiguous groups would give 1, 3)
    assert select_heads(phi, 2, "group").tolist() == [[2, 3]]
    # ties go to the lower index
    assert select_heads(torch.zeros(1, 6), 3, "subset").tolist() == [[0, 1, 2]]
    assert select_heads(torch.zeros(1, 6), 3, "group").tolist() == [[0, 1, 2]]
    assert select_heads(torch.tensor([[1.0, 2.0, 2.0, 2.0]]), 2, "subset").tolist() == [[2, 1]]  # slots 0, 1


@pytest.mark.parametrize("candidates", [4, 8, 12])
def test_subset_selects_exactly_h_distinct_heads_in_slot_order(candidates: int) -> None:
    torch.manual_seed(0)
    phi = torch.randn(50, candidates)
    sel = select_heads(phi, H, "subset")
    assert sel.shape == (50, H)
    for t in range(50):
        row = sel[t].tolist()
        assert len(set(row)) == H and row == sorted(row, key=lambda c: (c % H, c))  # H distinct, by (slot, index)
        assert set(row) == set(phi[t].topk(H).indices.tolist())  # = the top H of φ


@pytest.mark.parametrize("candidates", [4, 8, 12])
def test_group_selects_one_head_from_each_strided_group(candidates: int) -> None:
    torch.manual_seed(0)
    phi = torch.randn(50, candidates)
    sel = select_heads(phi, H, "group")
    for t in range(50):
        for g, h in enumerate(sel[t].tolist()):
            group = list(range(g, candidates, H))  # {g, g + H, ...}
            assert h in group
            assert h == group[int(phi[t, group].argmax())]


@pytest.mark.parametrize("strategy", ["subset", "group"])
def test_module_eval_selection_is_deterministic_and_follows_the_logits(strategy: str) -> None:
    m = _module(strategy)
    first = m.selector.eval_selection()
    assert torch.equal(first, select_heads(m.selector.head_logits.detach(), H, strategy))
    x, mask = _batch([5, 3], 5)
    task = torch.tensor([0, 2])
    with torch.no_grad():
        out1 = m(x, mask, task=task).out
        out2 = m(x, mask, task=task).out
    assert torch.equal(out1, out2)  # no noise at evaluation
    assert torch.equal(m.selector.eval_selection(), first)
    # in training, every draw still has the exact counts
    m.train()
    for _ in range(20):
        idx, w = m.selector.sample()
        assert idx.shape == (T, H) and torch.equal(w, torch.ones_like(w))
        if strategy == "subset":
            assert all(r == sorted(set(r), key=lambda c: (c % H, c)) for r in idx.tolist())
        else:
            assert torch.equal(idx % H, torch.arange(H).expand(T, H))


# ----------------------------------------------------------------------------------------
# 2. Sampling: seeded, τ-invariant, and equal to the eval selection when the logit gaps are large
# ----------------------------------------------------------------------------------------


def test_sampling_is_seeded_one_draw_per_task_and_head_per_forward() -> None:
    m = _module("subset", train=True)
    x, mask = _batch([4, 4], 4)
    task = torch.tensor([0, 1])
    torch.manual_seed(5)
    m(x, mask, task=task)
    first = m.selector.last_selection.clone()
    # the forward pass draws ε (tasks, H') once from the global RNG, and selects by rank of φ + ε
    torch.manual_seed(5)
    eps = logistic_noise((T, 8), device=torch.device("cpu"), dtype=F64)
    assert torch.equal(first, select_heads(m.selector.head_logits.detach() + eps, H, "subset"))
    torch.manual_seed(5)
    m(x, mask, task=task)
    assert torch.equal(m.selector.last_selection, first)  # seeded u reproduces
    draws = {tuple(m.selector.sample()[0].flatten().tolist()) for _ in range(30)}
    assert len(draws) > 1  # and unseeded draws differ


@pytest.mark.parametrize("strategy", ["subset", "group"])
def test_sampled_selection_is_tau_invariant(strategy: str) -> None:
    m = _module(strategy, train=True)
    for seed in range(10):
        torch.manual_seed(seed)
        eps = logistic_noise((T, 8), device=torch.device("cpu"), dtype=F64)
        picks = []
        for tau in (0.5, 1.0, 5.0):
            m.selector.tau = tau
            picks.append(m.selector.sample(noise=eps)[0])
        assert torch.equal(picks[0], picks[1]) and torch.equal(picks[0], picks[2])


@pytest.mark.parametrize("strategy", ["subset", "group"])
def test_large_logit_gaps_make_training_selection_the_eval_selection(strategy: str) -> None:
    m = _module(strategy, train=True)
    with torch.no_grad():  # per task a random set of H "winners" (one per group) at +50, the rest at -50
        g = torch.Generator().manual_seed(0)
        member = torch.randint(0, 2, (T, H), generator=g)
        phi = torch.full((T, 8), -50.0, dtype=F64)
        phi.scatter_(1, member * H + torch.arange(H), 50.0)
        m.selector.head_logits.copy_(phi)
    want = m.selector.eval_selection()
    torch.manual_seed(0)
    for _ in range(100):
        assert torch.equal(m.selector.sample()[0], want)


# ----------------------------------------------------------------------------------------
# 3. Straight-through: weights exactly 1, gradient only at the selected heads, = σ'((φ+ε)/τ)/τ · ∂L/∂w
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["subset", "group"])
def test_straight_through_values_and_gradients(strategy: str) -> None:
    m = _module(strategy, train=True)
    m.selector.tau = 2.0
    x, mask = _batch([5, 4, 5], 5)
    task = torch.tensor([2, 0, 2])
    target = torch.randn(3, 5, D, generator=torch.Generator().manual_seed(9), dtype=F64)

    torch.manual_seed(11)
    eps = logistic_noise((T, 8), device=torch.device("cpu"), dtype=F64)
    idx, w = m.selector.sample(noise=eps)
    assert torch.equal(w, torch.ones_like(w))  # forward value exactly 1.0

    torch.manual_seed(11)  # the module's own draw is the same ε
    loss = (m(x, mask, task=task).out * target).sum()
    assert torch.equal(m.selector.last_selection, idx)
    loss.backward()
    auto = m.selector.head_logits.grad.clone()

    # manual: the same forward with the weights as a leaf of ones, ∂L/∂w by autograd, then the chain rule
    with torch.no_grad():
        q, k, v = m._project(x)
    sel = idx[task]
    gather = lambda t: t.gather(1, sel[:, :, None, None].expand(-1, -1, t.shape[2], DH))  # noqa: E731
    wleaf = torch.ones(T, H, dtype=F64, requires_grad=True)
    ctx, _ = FullAttention.attend(m, gather(q), gather(k), gather(v), mask)
    out = m.out_proj(m._merge(m.selector.slot_merge(ctx * wleaf[task][:, :, None, None], sel)))  # subset: slots c mod H
    (out * target).sum().backward()
    s = torch.sigmoid((m.selector.head_logits.detach() + eps) / m.selector.tau)
    manual = torch.zeros(T, 8, dtype=F64).scatter(1, idx, (s * (1 - s) / m.selector.tau).gather(1, idx) * wleaf.grad)
    torch.testing.assert_close(auto, manual, rtol=1e-10, atol=1e-12)
    unselected = torch.ones(T, 8, dtype=torch.bool).scatter(1, idx, False)
    assert torch.equal(auto[unselected], torch.zeros_like(auto[unselected]))
    # tasks 0 and 2 are in the batch: their selected heads get a gradient; task 1 gets none at all
    assert bool((auto[[0, 2]].gather(1, idx[[0, 2]]) != 0).all())
    assert torch.equal(auto[1], torch.zeros(8, dtype=F64))


# ----------------------------------------------------------------------------------------
# 4. H' = H is plain attention
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["subset", "group"])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("train", [False, True])
def test_no_selection_equals_plain_attention(strategy: str, window: int | None, train: bool) -> None:
    m = _module(strategy, candidates=H, window=window, train=train)
    plain = FullAttention(D, H, 0.0) if window is None else LocalAttention(D, H, 0.0, window=window)
    missing, unexpected = plain.load_state_dict(m.state_dict(), strict=False)
    assert unexpected == ["selector.head_logits"] and not missing
    plain = plain.to(F64).train(train)
    x, mask = _batch([6, 4], 6)
    task = torch.tensor([1, 2])
    a, b = m(x, mask, task=task, need_weights=True), plain(x, mask, need_weights=True)
    valid = ~mask
    torch.testing.assert_close(a.out[valid], b.out[valid], rtol=0, atol=1e-6)
    torch.testing.assert_close(a.weights, b.weights, rtol=0, atol=1e-6)
    assert torch.equal(m.selector.kl(), torch.zeros(T, H, dtype=F64))  # π = 1: nothing to learn


# ----------------------------------------------------------------------------------------
# 5. Mixed-task batches equal per-sample processing; padding invariance
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["subset", "group"])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("window", [None, 3])
def test_mixed_task_batch_equals_samples_alone(strategy: str, train: bool, window: int | None) -> None:
    m = _module(strategy, train=train, window=window)
    lengths, tasks = [7, 4, 6, 7], [2, 0, 1, 0]
    x, mask = _batch(lengths, 7)
    torch.manual_seed(3)  # the draw is (tasks, H') whatever the batch: the same seed, the same selection
    out = m(x, mask, task=torch.tensor(tasks), need_weights=True)
    for b, (n, t) in enumerate(zip(lengths, tasks)):
        torch.manual_seed(3)
        alone = m(x[b:b + 1, :n], None, task=torch.tensor([t]), need_weights=True)
        torch.testing.assert_close(out.out[b, :n], alone.out[0], rtol=0, atol=1e-5)
        torch.testing.assert_close(out.weights[b, :, :n, :n], alone.weights[0], rtol=0, atol=1e-5)
        assert torch.equal(out.weights[b, :, :n, n:], torch.zeros_like(out.weights[b, :, :n, n:]))


@pytest.mark.parametrize("train", [False, True])
def test_model_mixed_tasks_and_padding(train: bool) -> None:
    model = _model(enc="subset", dec="group").train(train)
    feats, lens = _feats([40, 28, 36])
    prev = _tokens([[EOS_ID, 5, 6, 7, 8], [EOS_ID, 9, 4], [EOS_ID, 7, 7, 7]])
    tasks = [1, 0, 2]
    torch.manual_seed(4)
    logits = model(feats, lens, prev, task=torch.tensor(tasks))
    for b, t in enumerate(tasks):
        n, L = int(lens[b]), int(prev[b].ne(PAD_ID).sum())
        torch.manual_seed(4)
        alone = model(feats[b:b + 1, :n], lens[b:b + 1], prev[b:b + 1, :L], task=torch.tensor([t]))
        torch.testing.assert_close(logits[b, :L], alone[0], rtol=0, atol=1e-5)


def test_task_ids_are_required_with_several_tasks() -> None:
    m = _module()
    x, mask = _batch([3], 3)
    with pytest.raises(ValueError, match="task ids"):
        m(x, mask)
    single = _module(tasks=1)
    torch.testing.assert_close(single(x, mask).out, single(x, mask, task=torch.tensor([0])).out, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------
# 6. KL against hand values; batch aggregation; the Criterion adds λ · KL and logs it
# ----------------------------------------------------------------------------------------


def test_kl_by_hand() -> None:
    assert float(bernoulli_kl(torch.tensor(0.0, dtype=F64), 0.5)) == pytest.approx(0.0, abs=1e-12)
    want = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert want == pytest.approx(0.130812, abs=1e-6)
    assert float(bernoulli_kl(torch.tensor(math.log(3.0), dtype=F64), 0.5)) == pytest.approx(want, abs=1e-12)
    # the module's prior is H / H' (B2): 4 of 8 -> π = 0.5
    m = _module(candidates=8)
    assert m.selector.prior == 0.5
    with torch.no_grad():
        m.selector.head_logits.fill_(math.log(3.0))
    torch.testing.assert_close(m.selector.kl(), torch.full((T, 8), want, dtype=F64))
    # π = 1/4 by hand: q = σ(0) = 1/2 -> 0.5 ln 2 + 0.5 ln(2/3)
    m16 = _module(candidates=16)
    with torch.no_grad():
        m16.selector.head_logits.zero_()
    torch.testing.assert_close(m16.selector.kl(), torch.full((T, 16), 0.5 * math.log(2) + 0.5 * math.log(2 / 3), dtype=F64))


def test_kl_batch_aggregation_equals_a_loop_over_samples_and_modules() -> None:
    model = _model(enc="group", dec="subset")
    task = torch.tensor([2, 0, 2, 1, 2])
    n_tokens = torch.tensor([5, 3, 7, 2, 4])
    sides = model.head_selection_layers()
    assert [layer for layer, _ in sides["encoder"]] == [1, 2] and [layer for layer, _ in sides["decoder"]] == [1, 2]
    lam = {"encoder": [0.1, 0.2, 0.3], "decoder": [1.0, 2.0, 3.0]}
    direct = plain = 0.0
    for b in range(5):
        t = int(task[b])
        for side, mods in sides.items():
            k_t = sum(float(m.kl().detach()[t].sum()) for _, m in mods) / sum(m.candidates for _, m in mods)
            direct += lam[side][t] * int(n_tokens[b]) * k_t
            plain += 0.5 * int(n_tokens[b]) * k_t
    with torch.no_grad():
        per_task = selection_kl_per_task(head_selectors(model))  # the criterion's collection from the modules
        assert float(head_selection_kl_term(per_task, task, n_tokens, weight=lam)) == pytest.approx(direct, rel=1e-12)
        assert float(head_selection_kl_term(per_task, task, n_tokens, weight=0.5)) == pytest.approx(plain, rel=1e-12)
    # it finds exactly the model's selectors, per side in layer order
    found = {side: [id(m) for _, m in mods] for side, mods in sides.items()}
    assert {side: [id(m) for m in mods] for side, mods in head_selectors(model).items()} == found
    wrapped = nn.Module()
    wrapped.module = model  # a wrapper's prefix (DDP: module., torch.compile: _orig_mod.) keeps the sides
    assert {side: [id(m) for m in mods] for side, mods in head_selectors(wrapped).items()} == found
    # the ELBO weights C_s / N_t (B4): 2 layers x 8 candidates per side
    assert elbo_kl_weights(model, [100, 200, 400]) == {"encoder": [0.16, 0.08, 0.04], "decoder": [0.16, 0.08, 0.04]}


def _fake_batch(task: Tensor | None) -> Batch:
    feats, lens = _feats([40, 28, 36])
    target = _tokens([[5, 6, 7, 8, EOS_ID], [9, 4, EOS_ID], [7, 7, 7, EOS_ID]])
    prev = _tokens([[EOS_ID, 5, 6, 7, 8], [EOS_ID, 9, 4], [EOS_ID, 7, 7, 7]])
    return Batch(["a", "b", "c"], feats, lens, prev, target, target.ne(PAD_ID).sum(1), ["", "", ""],
                 ["", "", ""], task)


def test_criterion_adds_the_weighted_kl_and_logs_it() -> None:
    model = _model().train()
    batch = _fake_batch(torch.tensor([0, 2, 2]))
    torch.manual_seed(2)
    loss0, parts0 = Criterion(model, 0.1, 0.0)(batch)
    torch.manual_seed(2)
    loss1, parts1 = Criterion(model, 0.1, 0.0, kl_weight=0.25)(batch)
    kl = float(head_selection_kl_term(selection_kl_per_task(head_selectors(model)), batch.task,
                                      batch.target_lengths).detach())
    assert parts0["kl"] == pytest.approx(kl, rel=1e-12) and parts1["kl"] == pytest.approx(kl, rel=1e-12)
    assert parts0["ce"] == parts1["ce"]
    assert float((loss1 - loss0).detach()) == pytest.approx(0.25 * kl, rel=1e-9)
    # the modules' KL is computed once per batch, for the logged part and the loss alike
    calls = []
    selector = model.encoder.layers[0].self_attn.selector
    selector.kl = lambda: calls.append(1) or type(selector).kl(selector)
    Criterion(model, 0.1, 0.0, kl_weight=0.25)(batch)
    del selector.kl
    assert len(calls) == 1
    with pytest.raises(ValueError, match="task ids"):
        Criterion(model, 0.1, 0.0)(_fake_batch(None))
    # a model without head selection: no kl part, the loss of old
    plain = _model(enc=None, dec=None).train()
    _, parts = Criterion(plain, 0.1, 0.0)(_fake_batch(None))
    assert "kl" not in parts


def test_the_kl_weights_reach_the_device_once_per_run_not_once_per_batch() -> None:
    """A float λ enters the term as a Python number and per-task weights are put on the KL's device on
    the first batch and kept: on CUDA the term then copies nothing from the host per batch (such a copy
    waits for the GPU). The loss is the one of a per-batch conversion, bit for bit."""
    model = _model().train()
    batch = _fake_batch(torch.tensor([0, 2, 2]))
    per_task = selection_kl_per_task(head_selectors(model))
    for w in (0.25, 1.0, 1e-3):
        as_tensor = sum((torch.as_tensor(w, dtype=k.dtype) * torch.zeros_like(k).index_add_(
            0, batch.task, batch.target_lengths.to(k)) * k).sum() for k in per_task.values())
        assert torch.equal(head_selection_kl_term(per_task, batch.task, batch.target_lengths, w), as_tensor)
    weights = {side: [0.5, 0.25, 2.0] for side in per_task}
    crit = Criterion(model, 0.1, 0.0, kl_weight=weights)
    first = crit._kl_weight_like(per_task)
    assert crit._kl_weight_like(per_task) is first  # kept, not converted again
    assert all(isinstance(t, torch.Tensor) and t.dtype == per_task[side].dtype for side, t in first.items())
    torch.manual_seed(2)
    loss, _ = crit(batch)
    torch.manual_seed(2)
    reference = Criterion(model, 0.1, 0.0)(batch)[0] + head_selection_kl_term(
        selection_kl_per_task(head_selectors(model)), batch.task, batch.target_lengths, weights)
    assert torch.equal(loss, reference)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("amp", ["fp32", "bf16"])
def test_cuda_head_selection_training_step_has_no_sync(amp: str) -> None:
    """A head-selection model's training step on CUDA (both sides selecting, per-task ELBO-style weights,
    the τ hook between steps) under torch.cuda.set_sync_debug_mode("error"): the draw, the selection,
    the KL term and the backward wait for nothing; the first step may copy the run's weights over."""
    from lib.train.criterion import HostCounts

    model = _model(enc="subset", dec="group").float().cuda().train()
    host_batch = _fake_batch(torch.tensor([0, 2, 2]))
    host = HostCounts.of(host_batch)
    batch = host_batch.to("cuda")
    crit = Criterion(model, 0.1, 0.0, kl_weight={"encoder": [0.5, 0.25, 2.0], "decoder": [1.0, 1.0, 0.5]})
    crit.host_parts = False
    dtype = torch.bfloat16 if amp == "bf16" else torch.float32

    def step() -> dict:
        with torch.autocast("cuda", dtype=dtype, enabled=amp == "bf16"):
            loss, parts = crit(batch, host)
        loss.backward()
        return parts

    # the KL term depends on φ and the weights only (not on the draw): its value in float64 on the CPU
    reference = copy.deepcopy(model).double().cpu()
    set_head_selection_tau(reference, 0.7)
    ref_crit = Criterion(reference, 0.1, 0.0, kl_weight={"encoder": [0.5, 0.25, 2.0], "decoder": [1.0, 1.0, 0.5]})
    ref_crit.host_parts = False
    ref_kl = float(ref_crit(host_batch, host)[1]["kl"])
    step()  # warm-up: kernels, and the weights' one copy to the card
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        set_head_selection_tau(model, 0.7)
        parts = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ref_kl > 1.0 and float(parts["kl"]) == pytest.approx(ref_kl, rel=1e-5)  # fp32 on a CPU: 2e-8
    phi = model.encoder.layers[0].self_attn.selector.head_logits
    assert phi.grad is not None and torch.isfinite(phi.grad).all() and phi.grad.abs().sum() > 0


# ----------------------------------------------------------------------------------------
# 7. τ schedule
# ----------------------------------------------------------------------------------------


def test_tau_schedule() -> None:
    assert head_selection_tau(0, 5.0, 0.5, 100) == pytest.approx(5.0)
    assert head_selection_tau(50, 5.0, 0.5, 100) == pytest.approx(1.5811, abs=1e-4)
    assert head_selection_tau(100, 5.0, 0.5, 100) == pytest.approx(0.5)
    assert head_selection_tau(200, 5.0, 0.5, 100) == 0.5
    assert all(head_selection_tau(u, 5.0, 5.0, 100) == 5.0 for u in (0, 50, 100, 1000))
    assert HeadSelectionTraining().tau(123) == 5.0  # the paper's code: constant 5
    model = _model()
    assert set_head_selection_tau(model, 0.7) == 4  # 2 encoder + 2 decoder modules
    assert all(m.tau == 0.7 for mods in model.head_selection_layers().values() for _, m in mods)
    with pytest.raises(ValueError):
        set_head_selection_tau(model, 0.0)


# ----------------------------------------------------------------------------------------
# 8. Inference cost independent of H'; pruned == unpruned
# ----------------------------------------------------------------------------------------


def _flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_eval_flops_do_not_grow_with_the_candidates() -> None:
    feats, lens = _feats([40, 33])
    task = torch.tensor([1, 1])  # one task per decode call
    prev = _tokens([[EOS_ID, 5, 6, 7], [EOS_ID, 9, 4, 4]])
    enc_flops, dec_flops = set(), set()
    for cand in (4, 8, 16):
        model = _model(candidates=cand)
        with torch.no_grad():
            enc_flops.add(_flops(lambda: model.encode(feats, lens, task=task)))
            enc = model.encode(feats, lens, task=task)
            dec_flops.add(_flops(lambda: model.decode(prev, enc)))
        assert all(m.computed_heads == H for mods in model.head_selection_layers().values() for _, m in mods)
    plain = _model(enc=None, dec=None)
    with torch.no_grad():
        plain_enc = _flops(lambda: plain.encode(feats, lens))
    assert len(enc_flops) == 1 and len(dec_flops) == 1  # exactly equal for H' = 4, 8, 16
    assert enc_flops == {plain_enc}  # = a plain H-head encoder
    # training projects all H' candidates
    model = _model(candidates=16).train()
    model.encode(feats, lens, task=task)
    assert all(m.computed_heads == 16 for _, m in model.head_selection_layers()["encoder"])


def test_pruned_inference_equals_unpruned() -> None:
    model = _model(enc="subset", dec="group")
    feats, lens = _feats([40, 28, 36])
    prev = _tokens([[EOS_ID, 5, 6, 7, 8], [EOS_ID, 9, 4], [EOS_ID, 7, 7, 7]])
    for task in (torch.tensor([1, 1, 1]), torch.tensor([2, 0, 1])):  # one task; mixed tasks
        with torch.no_grad():
            pruned = model(feats, lens, prev, task=task)
            for mods in model.head_selection_layers().values():
                for _, m in mods:
                    m.pruned_inference = False
            full = model(feats, lens, prev, task=task)
            for mods in model.head_selection_layers().values():
                for _, m in mods:
                    m.pruned_inference = True
        torch.testing.assert_close(pruned, full, rtol=0, atol=1e-6)


def test_pruned_cache_follows_the_weights() -> None:
    a, b = _model(seed=0), _model(seed=1)
    feats, lens = _feats([32])
    task = torch.tensor([2])
    with torch.inference_mode():
        a.encode(feats, lens, task=task)  # builds the per-task cache
        a.load_state_dict(b.state_dict())  # a new version of every parameter
        torch.testing.assert_close(a.encode(feats, lens, task=task).out, b.encode(feats, lens, task=task).out,
                                   rtol=0, atol=0)
    with torch.no_grad():
        a.encoder.layers[0].self_attn.selector.head_logits.add_(torch.randn(T, 8, dtype=F64))  # other heads selected
        b.encoder.layers[0].self_attn.selector.head_logits.copy_(a.encoder.layers[0].self_attn.selector.head_logits)
        torch.testing.assert_close(a.encode(feats, lens, task=task).out, b.encode(feats, lens, task=task).out,
                                   rtol=0, atol=0)
    # with autograd recording, evaluation is differentiable into the selected rows
    out = a.encode(feats, lens, task=task).out.sum()
    out.backward()
    assert a.encoder.layers[0].self_attn.q_proj.weight.grad is not None


def test_checkpoint_round_trip_with_weights_only() -> None:
    model = _model()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "config": model.cfg.to_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    again = S2TTransformer(ModelConfig.from_dict(state["config"])).to(F64).eval()
    again.load_state_dict(state["model"])
    feats, lens = _feats([30])
    prev = _tokens([[EOS_ID, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(again(feats, lens, prev, task=torch.tensor([1])),
                                   model(feats, lens, prev, task=torch.tensor([1])), rtol=0, atol=0)
    assert head_selections(again) == head_selections(model)
    sel = head_selections(model)
    assert sel["encoder"]["layers"] == [1, 2] and len(sel["encoder"]["selected"]) == T
    assert all(len(layer) == H for task in sel["decoder"]["selected"] for layer in task)


def test_the_selector_is_composed_and_checkpoints_of_before_still_load() -> None:
    """Each selecting attention holds a HeadSelector module (``selector``) that owns φ. φ keeps the place
    it had as the attention's own parameter, first among its parameters (the order of the optimizer's
    state and of the gradient norm's sum of earlier runs), and a checkpoint written then
    (``<attn>.head_logits``) loads, strictly, into ``<attn>.selector.head_logits``."""
    from lib.model.attention import HeadSelector

    model = _model(enc="subset", dec="group")
    for attn in (model.encoder.layers[0].self_attn, model.decoder.layers[1].self_attn):
        assert isinstance(attn.selector, HeadSelector)
        assert [n for n, _ in attn.named_parameters()][:2] == ["selector.head_logits", "q_proj.weight"]
    sd = model.state_dict()
    before = {k.replace(".selector.head_logits", ".head_logits"): v for k, v in sd.items()}
    assert len(before) == len(sd) and sum(k.endswith(".self_attn.head_logits") for k in before) == 4
    again = S2TTransformer(model.cfg).to(F64)
    again.load_state_dict(before)  # strict
    assert all(torch.equal(again.state_dict()[k], v) for k, v in sd.items())
    # the weight surgery reads such a file too (it does not go through load_state_dict's hook)
    fresh = S2TTransformer(model.cfg).to(F64)
    assert "layers.0.self_attn.selector.head_logits" in load_encoder(fresh, before).loaded
    assert torch.equal(fresh.encoder.layers[0].self_attn.selector.head_logits,
                       model.encoder.layers[0].self_attn.selector.head_logits)


def test_the_load_hook_and_the_model_file_rename_by_one_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The selecting attention's load hook and lib.model.checkpoint.upgrade_state_dict (averaging, weight
    surgery) ask the same function for a key's new name: a rule changed there reaches both."""
    from lib.model import checkpoint
    from lib.model.attention import base, head_selection

    assert base.renamed_parameter_key("module.encoder.layers.0.self_attn.head_logits") == \
        "module.encoder.layers.0.self_attn.selector.head_logits"
    assert base.renamed_parameter_key("encoder.layers.0.self_attn.selector.head_logits") is None
    assert base.renamed_parameter_key("encoder.layers.0.self_attn.q_proj.weight") is None
    model = _model(enc="subset", dec="group")
    before = {k.replace(".selector.head_logits", ".head_logits"): v for k, v in model.state_dict().items()}
    asked: list[str] = []

    def rule(key: str) -> str | None:
        asked.append(key)
        return base.renamed_parameter_key(key)

    monkeypatch.setattr(head_selection, "renamed_parameter_key", rule)
    S2TTransformer(model.cfg).to(F64).load_state_dict(before)
    assert "encoder.layers.0.self_attn.head_logits" in asked and "decoder.layers.1.self_attn.head_logits" in asked
    asked.clear()
    monkeypatch.setattr(checkpoint, "renamed_parameter_key", rule)
    assert set(checkpoint.upgrade_state_dict(before)) == set(model.state_dict())
    assert set(asked) == set(before)


# ----------------------------------------------------------------------------------------
# 9. Expanded ASR init + group selection reproduces the ASR encoder; parameter count
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("train", [False, True])
def test_tiled_asr_init_reproduces_the_asr_encoder(train: bool) -> None:
    torch.manual_seed(0)
    asr = S2TTransformer(_cfg(enc=None, dec=None, ctc_vocab_size=24)).to(F64).eval()
    st = _model(seed=3, enc="group", dec="group")
    buf = io.BytesIO()
    torch.save(asr.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    with pytest.raises(ValueError, match="q_proj.weight: shape"):
        load_encoder(st, state)
    report = load_encoder(st, state, expand_candidate_heads=True)
    assert report.expanded == sorted(f"layers.{i}.self_attn.{p}_proj.{t}" for i in range(2) for p in "qkv"
                                     for t in ("weight", "bias"))
    assert set(report.missing) == {"layers.0.self_attn.selector.head_logits", "layers.1.self_attn.selector.head_logits"}
    st.train(train)
    feats, lens = _feats([40, 31, 36])
    with torch.no_grad():
        want = asr.encode(feats, lens).out
        for t in range(T):  # every task, i.e. every (random) group selection
            torch.manual_seed(t)
            got = st.encode(feats, lens, task=torch.full((3,), t)).out
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        st.encoder.layers[0].self_attn.selector.head_logits.normal_()  # any other group selection
        torch.testing.assert_close(st.encode(feats, lens, task=torch.tensor([0, 1, 2])).out, want, rtol=0, atol=1e-6)


def test_parameter_count_grows_by_the_candidates_and_logits() -> None:
    for cand in (8, 12):
        plain = S2TTransformer(_cfg(enc=None, dec=None))
        hs = S2TTransformer(_cfg(enc="subset", dec="subset", candidates=cand))
        per_layer = 3 * (cand - H) * DH * (D + 1) + T * cand
        assert hs.num_parameters() - plain.num_parameters() == 4 * per_layer  # 2 encoder + 2 decoder layers


# ----------------------------------------------------------------------------------------
# 10. Incremental == full decoding; beam search reorders EncoderOutput.task; the tag as start token
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["subset", "group"])
def test_incremental_decoding_equals_full_decoding(strategy: str) -> None:
    model = _model(enc=None, dec=strategy)
    feats, lens = _feats([40, 28, 36])
    enc = model.encode(feats, lens, task=torch.tensor([2, 0, 1]))
    tokens = torch.tensor([[4, 5, 6, 7, 8, 9], [4, 9, 4, 10, 11, 12], [4, 7, 7, 7, 13, 14]])
    with torch.no_grad():
        full = model.decode(tokens, enc)
        state: dict = {}
        steps = [model.decode(tokens[:, : t + 1], enc, state) for t in range(tokens.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
    for layer_state in state.values():  # the cache holds the H selected heads only
        assert layer_state["self"]["k"].shape == (3, H, 6, DH)
    model.train()
    with pytest.raises(ValueError, match="eval mode"):
        model.decode(tokens[:, :1], enc, {})


def test_encoder_output_reorders_the_task() -> None:
    enc = EncoderOutput(out=torch.zeros(3, 2, 1), padding_mask=torch.zeros(3, 2, dtype=torch.bool),
                        lengths=torch.tensor([2, 2, 2]), task=torch.tensor([7, 8, 9]))
    assert enc.reorder(torch.tensor([2, 2, 0])).task.tolist() == [9, 9, 7]
    assert EncoderOutput(out=enc.out, padding_mask=enc.padding_mask, lengths=enc.lengths).reorder(
        torch.tensor([1])).task is None


def test_beam_search_with_mixed_tasks_equals_sentences_alone() -> None:
    model = _model(enc="subset", dec="group")
    feats, lens = _feats([40, 20, 36, 28])
    tasks = torch.tensor([2, 0, 1, 0])
    cfg = BeamSearchConfig(beam=3, max_len_b=6)
    hyps = beam_search(model, feats, lens, cfg, task=tasks)
    for b in range(4):
        n = int(lens[b])
        assert hyps[b] == beam_search(model, feats[b:b + 1, :n], lens[b:b + 1], cfg, task=tasks[b:b + 1])[0]
    assert greedy_search(model, feats, lens, 0.0, 6, task=tasks) == beam_search(
        model, feats, lens, BeamSearchConfig(beam=1, max_len_b=6), task=tasks)


class _Recorder(nn.Module):
    """Delegates the decoding API to a model and records the first decoder input of every call."""

    def __init__(self, model: S2TTransformer) -> None:
        super().__init__()
        self.model, self.cfg, self.first = model, model.cfg, []

    def encode(self, *args, **kw):
        return self.model.encode(*args, **kw)

    def decode(self, prev_tokens: Tensor, enc: EncoderOutput, state=None) -> Tensor:
        self.first.append(prev_tokens[:, 0].tolist())
        return self.model.decode(prev_tokens, enc, state)

    def reorder_incremental_state(self, state, order, *, cross=True):
        return self.model.reorder_incremental_state(state, order, cross=cross)


def test_tag_is_the_decoder_start_token_in_greedy_and_beam_search() -> None:
    model = _model(enc="group", dec="group", vocab_size=24)
    feats, lens = _feats([40, 36])
    tags = torch.tensor([5, 6])  # e.g. <lang:es>, <lang:it>
    task = torch.tensor([1, 2])
    rec = _Recorder(model)
    greedy = greedy_search(rec, feats, lens, 0.0, 5, task=task, bos=tags)
    assert rec.first[0] == [5, 6] and all(set(f) <= {5, 6} for f in rec.first)
    rec.first.clear()
    beam1 = beam_search(rec, feats, lens, BeamSearchConfig(beam=1, max_len_b=5), task=task, bos=tags)
    assert rec.first[0] == [5, 6]
    assert beam1 == greedy
    rec.first.clear()
    beam_search(rec, feats, lens, BeamSearchConfig(beam=3, max_len_b=5), task=task, bos=tags)
    assert rec.first[0] == [5, 5, 5, 6, 6, 6]
    # the same as argmax decoding by hand from the tag, and the tag is not part of the output
    with torch.no_grad():
        enc = model.encode(feats[:1, :40], lens[:1], task=task[:1])
        prefix = torch.tensor([[5]])
        for _ in range(5):
            lp = torch.log_softmax(model.decode(prefix, enc)[:, -1].float(), -1)
            lp[:, PAD_ID] = -math.inf
            if prefix.shape[1] == 1:
                lp[:, EOS_ID] = -math.inf  # min_len 1
            nxt = int(lp.argmax())
            if nxt == EOS_ID:
                break
            prefix = torch.cat([prefix, torch.tensor([[nxt]])], 1)
    assert greedy[0] == prefix[0, 1:].tolist()
    # an int tag for every sentence; default eos unchanged
    rec.first.clear()
    greedy_search(rec, feats, lens, 0.0, 2, task=task, bos=7)
    assert rec.first[0] == [7, 7]
    rec.first.clear()
    greedy_search(rec, feats, lens, 0.0, 2, task=task)
    assert rec.first[0] == [EOS_ID, EOS_ID]


# ----------------------------------------------------------------------------------------
# Task ids and start tokens from the dataset (docs/variants.md)
# ----------------------------------------------------------------------------------------


class _Data:
    """Duck-typed dataset with the collate hooks."""

    def __init__(self, task_ids=None, start_ids=None) -> None:
        self.targets = [[5, 6, EOS_ID], [7, EOS_ID], [8, 9, 10, EOS_ID]]
        self.rows = [{"id": f"u{i}", "src_text": "", "tgt_text": ""} for i in range(3)]
        self.task_ids, self.start_ids = task_ids, start_ids

    def features(self, i: int) -> Tensor:
        return torch.ones(4 + i, 2)


def test_collate_fills_task_and_start_tokens() -> None:
    plain = collate(_Data(), [2, 0])
    assert plain.task is None and plain.prev_tokens[:, 0].tolist() == [EOS_ID, EOS_ID]
    batch = collate(_Data(task_ids=[0, 1, 2], start_ids=[4, 5, 6]), [2, 0])
    assert batch.task.tolist() == [2, 0] and batch.task.dtype == torch.long
    assert batch.prev_tokens.tolist() == [[6, 8, 9, 10], [4, 5, 6, PAD_ID]]
    assert batch.target.tolist() == [[8, 9, 10, EOS_ID], [5, 6, EOS_ID, PAD_ID]]  # no loss on the tag
    assert batch.to("cpu").task.tolist() == [2, 0]


class _MemoryData:
    """An in-memory multilingual dataset with what the training loop reads (n_frames, features,
    targets, rows) plus the collate hooks (task_ids, tag start_ids)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.n_frames = [int(x) for x in torch.randint(24, 48, (n,), generator=g)]
        self.feats = [torch.randn(f, 80, generator=g) for f in self.n_frames]
        self.task_ids = [i % T for i in range(n)]
        self.start_ids = [4 + t for t in self.task_ids]  # the tags <lang:..> as ids 4-6
        self.targets = [[7 + t] + [int(x) for x in torch.randint(10, 24, (3,), generator=g)] + [EOS_ID]
                        for t in self.task_ids]
        self.rows = [{"id": f"u{i}", "src_text": "", "tgt_text": ""} for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def features(self, i: int) -> Tensor:
        return self.feats[i]


class _Live:
    def __init__(self) -> None:
        self.step, self.rows = 0, []

    def log_metric(self, name: str, value: float) -> None:
        self.rows.append((self.step, name, value))

    def next_step(self) -> None:
        pass


def test_training_loop_sets_tau_and_logs_the_kl(tmp_path, monkeypatch) -> None:
    """The loop anneals τ through its update hook, trains φ, and logs each update's criterion parts
    per unit: train/kl and train/loss per target token (eos included), train/ctc per CTC label (the
    targets without their eos) -- checked against the parts the criterion returned for the update's
    batches (a spy on Criterion.forward) and the token counts read here from the targets."""
    from lib.params import TrainConfig
    from lib.train import criterion as criterion_module
    from lib.train.loop import train

    torch.manual_seed(0)
    model = S2TTransformer(_cfg(enc="group", dec="subset", ctc_vocab_size=24))
    phi0 = model.encoder.layers[0].self_attn.selector.head_logits.detach().clone()
    hs = HeadSelectionTraining(tau_start=5.0, tau_end=0.5, anneal_updates=4, kl_weight=0.1)
    cfg = TrainConfig(lr=1e-2, warmup_updates=1, max_updates=4, max_frames=200, update_freq=1, eval_every=2,
                      save_every=2, average_last=2, specaugment=False, ctc_weight=0.3)
    updates: list[list[tuple[Batch, dict[str, float]]]] = []  # per update: (batch, parts) of its batches
    real_forward = criterion_module.Criterion.forward

    def forward(self, batch, host=None):
        loss, parts = real_forward(self, batch, host)
        updates[-1].append((batch, {k: float(v) for k, v in parts.items()}))
        return loss, parts

    monkeypatch.setattr(criterion_module.Criterion, "forward", forward)
    live = _Live()
    summary = train(model, cfg, _MemoryData(12, 0), _MemoryData(4, 1), tmp_path, run_config={"hs": "test"},
                    progress=False, live=live, kl_weight=hs.kl_weight,
                    update_hooks=[lambda u: hs.set_num_updates(model, u), lambda u: updates.append([])])
    assert summary["updates"] == 4
    # τ of the last update = τ(3 completed updates)
    assert all(m.tau == pytest.approx(hs.tau(3)) for mods in model.head_selection_layers().values() for _, m in mods)
    kl = [v for _, name, v in live.rows if name == "train/kl"]
    assert len(kl) == 4 and all(v > 0 for v in kl)
    assert not torch.equal(model.encoder.layers[0].self_attn.selector.head_logits.detach(), phi0)  # φ is trained
    logged = {}
    for step, name, v in live.rows:
        logged.setdefault(step, {})[name] = v
    assert sorted(logged) == [1, 2, 3, 4] and len(updates) == 4
    for step, seen in zip(sorted(logged), updates):
        assert len(seen) == 1  # update_freq 1, never folded
        tokens = sum(int(b.target.ne(PAD_ID).sum()) for b, _ in seen)  # eos included
        labels = tokens - sum(len(b.ids) for b, _ in seen)  # one eos per target
        parts = {k: sum(p[k] for _, p in seen) for k in ("ce", "ctc", "kl")}
        assert labels > 0 and parts["ctc"] > 0
        row = logged[step]
        assert row["train/loss"] == pytest.approx(parts["ce"] / tokens, rel=1e-9)
        assert row["train/kl"] == pytest.approx(parts["kl"] / tokens, rel=1e-9)
        assert row["train/ctc"] == pytest.approx(parts["ctc"] / labels, rel=1e-9)


@pytest.mark.parametrize("fold_update", ["on", "auto"])
def test_the_training_loop_never_folds_a_head_selection_model(tmp_path, fold_update: str) -> None:
    """The loop reads from the model that it selects heads, and folding is refused (``on``) or never
    chosen (``auto``): one Gumbel draw per forward would make a folded update another update than the
    accumulated one. A model whose selection the loop fails to see would fold here."""
    from lib.params import TrainConfig
    from lib.train import loop
    from lib.train.loop import train

    torch.manual_seed(0)
    model = S2TTransformer(_cfg(enc="group", dec="subset"))
    cfg = TrainConfig(lr=1e-3, warmup_updates=1, max_updates=2, max_frames=200, update_freq=2, eval_every=2,
                      save_every=2, average_last=1, specaugment=False, fold_update=fold_update)
    made = []
    real = loop.FoldPolicy

    def policy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    import unittest.mock as mock

    with mock.patch.object(loop, "FoldPolicy", policy):
        if fold_update == "on":
            with pytest.raises(ValueError, match="this model selects heads"):
                train(model, cfg, _MemoryData(12, 0), _MemoryData(4, 1), tmp_path, run_config={"hs": "fold"},
                      progress=False, live=_Live())
            return
        train(model, cfg, _MemoryData(12, 0), _MemoryData(4, 1), tmp_path, run_config={"hs": "fold"},
              progress=False, live=_Live())
    assert len(made) == 1 and made[0].exact is False


def test_training_loop_with_the_gumbel_estimator_and_variant_lr(tmp_path) -> None:
    """The loop sets the noise scale of every update (s(3 completed) after the last) and steps the logits
    in their own group at variant_lr, outside encoder_lr_scale."""
    from lib.params import TrainConfig
    from lib.train.loop import train

    torch.manual_seed(0)
    model = S2TTransformer(_cfg(enc="subset", dec="group"))
    for mods in model.head_selection_layers().values():
        for _, m in mods:
            m.estimator = "gumbel"
    phi0 = model.encoder.layers[0].self_attn.selector.head_logits.detach().clone()
    hs = HeadSelectionTraining(anneal_updates=4, noise_start=1.0, noise_end=0.1)
    cfg = TrainConfig(lr=1e-3, warmup_updates=1, max_updates=4, max_frames=200, update_freq=1, eval_every=2,
                      save_every=2, average_last=2, specaugment=False, encoder_lr_scale=0.2, variant_lr=0.05)
    summary = train(model, cfg, _MemoryData(12, 0), _MemoryData(4, 1), tmp_path, run_config={"hs": "gumbel"},
                    progress=False, live=_Live(), update_hooks=[lambda u: hs.set_num_updates(model, u)])
    assert summary["updates"] == 4
    assert all(m.noise_scale == pytest.approx(hs.noise(3)) for mods in model.head_selection_layers().values()
               for _, m in mods)
    moved = (model.encoder.layers[0].self_attn.selector.head_logits.detach() - phi0).abs()
    # 4 Adam steps at <= 0.05 each (warm-up 1, then inverse_sqrt): far more than the encoder group's 0.2 x 1e-3
    assert float(moved.max()) > 4 * 0.2 * 1e-3 and float(moved.max()) <= 4 * 0.05 + 1e-6


# ----------------------------------------------------------------------------------------
# 11. Specs and configs: bad values rejected naming their key
# ----------------------------------------------------------------------------------------

GOOD = {"strategy": "group", "candidates": 8}


@pytest.mark.parametrize(("hdef", "tasks", "needle"), [
    ({**GOOD, "strategy": "random"}, 3, "multi.head_selection.strategy"),
    ({"candidates": 8}, 3, "multi.head_selection.strategy"),
    ({**GOOD, "candidates": 2}, 3, "multi.head_selection.candidates"),
    ({**GOOD, "candidates": 6}, 3, "multi.head_selection.candidates"),  # group: not a multiple of H = 4
    ({**GOOD, "candidates": "8"}, 3, "multi.head_selection.candidates"),
    (GOOD, 0, "multi.head_selection.tasks"),
    ({**GOOD, "apply_to": ["cross"]}, 3, "multi.head_selection.apply_to"),
    ({**GOOD, "apply_to": []}, 3, "multi.head_selection.apply_to"),
    ({**GOOD, "apply_to": "encoder_self"}, 3, "multi.head_selection.apply_to"),
    ({**GOOD, "tau_start": 0}, 3, "multi.head_selection.tau_start"),
    ({**GOOD, "tau_end": 6.0}, 3, "multi.head_selection.tau_end"),
    ({**GOOD, "anneal_updates": -1}, 3, "multi.head_selection.anneal_updates"),
    ({**GOOD, "kl_weight": -0.1}, 3, "multi.head_selection.kl_weight"),
    ({**GOOD, "kl_weight": "big"}, 3, "multi.head_selection.kl_weight"),
    ({**GOOD, "heads": 4}, 3, "multi.head_selection: unknown key"),
])
def test_head_selection_spec_errors_name_the_key(hdef: dict, tasks: int, needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        head_selection_spec([{"type": "full"}] * 4, hdef, 4, n_heads=H, tasks=tasks)
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        decoder_head_selection_spec(hdef, 2, n_heads=H, tasks=tasks)


def test_head_selection_spec_overlay() -> None:
    base = local_attention_spec(4, 2, [3, 5])
    spec = head_selection_spec(base, {"strategy": "subset", "candidates": 8, "kl_weight": "elbo"}, 4, n_heads=H,
                               tasks=3)
    sel = {"type": "head_select", "strategy": "subset", "candidates": 8, "tasks": 3}
    assert spec == [sel, sel, {**sel, "window": 3}, {**sel, "window": 5}]
    assert decoder_head_selection_spec(GOOD, 2, n_heads=H, tasks=3) == {"decoder_self_attention": {
        "type": "head_select", "strategy": "group", "candidates": 8, "tasks": 3, "layers": [1, 2]}}
    only_dec = {**GOOD, "apply_to": ["decoder_self"]}  # the paper-faithful O2M ablation (B1)
    assert head_selection_spec(base, only_dec, 4, n_heads=H, tasks=3) == base
    assert decoder_head_selection_spec({**GOOD, "apply_to": ["encoder_self"]}, 2, n_heads=H, tasks=3) == {
        "decoder_self_attention": None}
    # what the spec builds, the model takes
    cfg = model_config("tiny", n_heads=H, encoder_layers=4, encoder_attention=spec,
                       **decoder_head_selection_spec(GOOD, 1, n_heads=H, tasks=3))
    model = S2TTransformer(cfg)
    assert [layer for layer, _ in model.head_selection_layers()["encoder"]] == [1, 2, 3, 4]
    assert isinstance(model.decoder.layers[0].self_attn, HeadSelectionMultiheadAttention)
    assert model.encoder.layers[3].self_attn.window == 5


@pytest.mark.parametrize(("over", "needle"), [
    ({"decoder_self_attention": {"type": "head_select", "strategy": "group", "candidates": 6, "tasks": 3}},
     "decoder_self_attention.candidates"),
    ({"decoder_self_attention": {"type": "head_select", "strategy": "group", "tasks": 3}},
     "decoder_self_attention.candidates: missing"),
    ({"decoder_self_attention": {"type": "head_select", "strategy": "group", "candidates": 8, "tasks": 3,
                                 "window": 3}}, "decoder_self_attention: unknown key"),
    ({"decoder_self_attention": {"type": "head_select", "strategy": "group", "candidates": 8, "tasks": 3,
                                 "layers": [3]}}, "decoder_self_attention.layers"),
    ({"cross_attention": {"type": "head_select", "strategy": "group", "candidates": 8, "tasks": 3}},
     "cross_attention: head selection applies to self-attention only"),
    ({"encoder_attention": [{"type": "head_select", "strategy": "best", "candidates": 8, "tasks": 3}] * 2},
     r"encoder_attention\[0\].strategy"),
    ({"encoder_attention": [{"type": "head_select", "strategy": "group", "candidates": 8, "tasks": 3}] * 2,
      "decoder_self_attention": {"type": "head_select", "strategy": "group", "candidates": 8, "tasks": 2}},
     "tasks: head-selection layers disagree"),
    ({"encoder_attention": [{"type": "head_select", "strategy": "group", "candidates": 8, "tasks": 3}] * 2,
      "rel_pos_bias": 2}, r"encoder_attention\[0\]: the relative-position bias"),
])
def test_model_config_rejects_bad_head_selection(over: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        model_config("tiny", n_heads=H, **over)


def test_module_spec_keys() -> None:
    with pytest.raises(ValueError, match=r"missing key\(s\) \['tasks'\]"):
        build_attention({"type": "head_select", "strategy": "group", "candidates": 8}, D, H, 0.0)
    with pytest.raises(ValueError, match="head_select.window"):
        build_attention({"type": "head_select", "strategy": "group", "candidates": 8, "tasks": 1, "window": 4}, D,
                        H, 0.0)
    with pytest.raises(ValueError, match="head_select.candidates"):
        build_attention({"type": "head_select", "strategy": "subset", "candidates": 3, "tasks": 1}, D, H, 0.0)


# ----------------------------------------------------------------------------------------
# Selection that can choose: aligned subset slots, the Gumbel-softmax estimator, the noise schedule
# ----------------------------------------------------------------------------------------


def _asr_and_tiled(strategy: str, estimator: str) -> tuple[S2TTransformer, S2TTransformer]:
    """A plain float64 model (the ASR) and a head-selecting one (both sides) at its initialisation,
    loaded from it as train_multi does (tiled candidates, the decoder's layers too)."""
    torch.manual_seed(0)
    asr = S2TTransformer(_cfg(enc=None, dec=None)).to(F64).eval()
    spec = {"type": "head_select", "strategy": strategy, "candidates": 8, "tasks": T, "estimator": estimator}
    cfg = model_config("tiny", n_heads=H, decoder_layers=2, vocab_size=24, dropout=0.0, attention_dropout=0.0,
                       activation_dropout=0.0, encoder_attention=[spec] * 2, decoder_self_attention=spec)
    torch.manual_seed(3)
    st = S2TTransformer(cfg).to(F64)  # the logits at their own initialisation (not _model's random ones)
    load_encoder(st, asr.state_dict(), expand_candidate_heads=True)
    load_decoder_layers(st, asr.state_dict(), expand_candidate_heads=True)
    # the rest of the decoder (embeddings, output projection) too: the whole model is the ASR model's
    target = st.state_dict()
    st.load_state_dict({k: v for k, v in asr.state_dict().items() if k.startswith("decoder.")
                        and target[k].shape == v.shape}, strict=False)
    return asr, st


@pytest.mark.parametrize("estimator", ["paper", "gumbel"])
@pytest.mark.parametrize("train", [False, True])
def test_subset_aligned_initialisation_reproduces_the_asr_model(estimator: str, train: bool) -> None:
    """Subset at initialisation: per task the evaluated top-H holds one candidate per out_proj slot
    (c mod H), leading every other candidate by >= SUBSET_INIT_GAP, so the tiled model computes exactly
    what the ASR model computes (the seed's index-ordered slots moved tiled heads into other heads'
    slots: only 5 of 70 subsets kept them). In training the draws start there too (noise vs the gap)."""
    from lib.model.attention import SUBSET_INIT_GAP

    asr, st = _asr_and_tiled("subset", estimator)
    for mods in st.head_selection_layers().values():
        for _, m in mods:
            sel = m.eval_selection()
            assert torch.equal((sel % H).sort(dim=-1).values, torch.arange(H).expand(T, H))  # one per slot
            phi = m.head_logits.detach()
            chosen = torch.zeros_like(phi, dtype=torch.bool).scatter(1, sel, True)
            gap = phi.masked_fill(~chosen, float("inf")).min(1).values - phi.masked_fill(chosen, -float("inf")).max(1).values
            assert bool((gap >= SUBSET_INIT_GAP).all())
    feats, lens = _feats([40, 31, 36])
    tokens = _tokens([[EOS_ID, 5, 6, 7], [EOS_ID, 8, 9], [EOS_ID, 10, 11, 12]])
    with torch.no_grad():
        want = asr(feats, lens, tokens)
        st.eval()
        for t in range(T):
            assert torch.equal(st(feats, lens, tokens, task=torch.full((3,), t)), want)  # exactly
        # dropout 0, gumbel at the end of its noise schedule: the training draws are the aligned subset
        # too (the paper's unit logistic noise, std 1.81, can draw across the gap: no such claim)
        if train and estimator == "gumbel":
            st.train()
            set_head_selection_noise(st, 0.1)
            torch.manual_seed(0)
            torch.testing.assert_close(st(feats, lens, tokens, task=torch.tensor([0, 1, 2])), want,
                                       rtol=0, atol=1e-10)


@pytest.mark.parametrize("lead", [0.1, 0.5])
def test_subset_init_lead_sets_the_margin_and_keeps_the_asr_model(lead: float) -> None:
    """multi.head_selection.subset_init_lead: the aligned subset still wins (so the model is still the ASR
    model), by exactly ``lead`` over each task's best unselected candidate instead of the 1.8-6 logits of
    the aligned start, which a run's logits do not move across."""
    from lib.model.attention import set_subset_lead

    asr, st = _asr_and_tiled("subset", "gumbel")
    before = {name: [m.eval_selection().clone() for _, m in mods] for name, mods in st.head_selection_layers().items()}
    assert set_subset_lead(st, lead) == 4  # 2 encoder + 2 decoder layers
    for name, mods in st.head_selection_layers().items():
        for (_, m), sel0 in zip(mods, before[name]):
            m._pruned = None  # the cached eval projections were built for the old logits
            sel = m.eval_selection()
            assert torch.equal(sel.sort(dim=-1).values, sel0.sort(dim=-1).values)
            phi = m.head_logits.detach()
            chosen = torch.zeros_like(phi, dtype=torch.bool).scatter(1, sel, True)
            low = phi.masked_fill(~chosen, float("inf")).min(1).values
            high = phi.masked_fill(~chosen, -float("inf")).max(1).values
            best_other = phi.masked_fill(chosen, -float("inf")).max(1).values
            torch.testing.assert_close(low - best_other, torch.full_like(low, lead))
            assert torch.equal(low, high)  # the selected candidates tie, at the lead
    feats, lens = _feats([40, 31, 36])
    tokens = _tokens([[EOS_ID, 5, 6, 7], [EOS_ID, 8, 9], [EOS_ID, 10, 11, 12]])
    with torch.no_grad():
        want = asr(feats, lens, tokens)
        st.eval()
        assert torch.equal(st(feats, lens, tokens, task=torch.full((3,), 1)), want)


def test_subset_slots_follow_the_candidates_not_the_index_order() -> None:
    """A subset with two candidates of one slot adds them in that slot; the slot without any is 0."""
    m = _module("subset")
    x, mask = _batch([5, 5], 5)
    task = torch.tensor([0, 0])
    with torch.no_grad():
        m.selector.head_logits.fill_(-5.0)
        m.selector.head_logits[0, [0, 4, 1, 2]] = 5.0  # candidates 0 and 4 both feed slot 0; slot 3 is empty
        out = m(x, mask, task=task).out
        q, k, v = m._project(x)
        heads, _ = FullAttention.attend(m, q, k, v, mask)  # every candidate, (B, 8, N, dh)
        slots = torch.stack([heads[:, 0] + heads[:, 4], heads[:, 1], heads[:, 2], torch.zeros_like(heads[:, 0])], 1)
        torch.testing.assert_close(out, m.out_proj(m._merge(slots)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("strategy", ["subset", "group"])
def test_gumbel_estimator_gradients_reach_unselected_candidates(strategy: str) -> None:
    """estimator gumbel: the forward pass is exactly the drawn selection (unselected candidates × 0),
    and every candidate's logit gets ∂L/∂φ = J_yᵀ ∂L/∂w with ∂L/∂w_c = ⟨∂L/∂slot(c), head_c⟩ and y the
    relaxed selection (the paper's estimator gives unselected candidates nothing)."""
    from lib.model.attention import gumbel_noise, relaxed_selection

    m = _module(strategy, train=True)
    m.selector.estimator, m.selector.tau, m.selector.noise_scale = "gumbel", 2.0, 0.5
    x, mask = _batch([5, 4, 5], 5)
    task = torch.tensor([2, 0, 1])
    target = torch.randn(3, 5, D, generator=torch.Generator().manual_seed(9), dtype=F64)
    torch.manual_seed(11)
    g = gumbel_noise((T, 8), device=torch.device("cpu"), dtype=F64)
    idx, w = m.selector.sample(noise=g)
    hard = torch.zeros(T, 8, dtype=F64).scatter(1, idx, 1.0)
    assert torch.equal(w.detach(), hard)  # forward value exactly 0 / 1
    assert torch.equal(idx, select_heads(m.selector.head_logits.detach() + 0.5 * g, H, strategy))
    torch.manual_seed(11)  # the module's own draw is the same g
    out = m(x, mask, task=task).out
    assert torch.equal(m.selector.last_selection, idx)
    (out * target).sum().backward()
    auto = m.selector.head_logits.grad.clone()
    # forward: what the selected heads alone compute, in their slots
    with torch.no_grad():
        q, k, v = m._project(x)
    sel = idx[task]
    ctx_sel, _ = FullAttention.attend(m, gather_heads(q, sel), gather_heads(k, sel), gather_heads(v, sel), mask)
    torch.testing.assert_close(out, m.out_proj(m._merge(merge_slots(ctx_sel, sel % H, H))), rtol=0, atol=1e-12)
    # backward by hand: w as a leaf over every candidate, then the relaxation's Jacobian
    wleaf = hard.clone().requires_grad_(True)
    heads, _ = FullAttention.attend(m, q, k, v, mask)  # (B, 8, N, dh)
    slotted = merge_slots(heads * wleaf[task][:, :, None, None], candidate_slots(8, H), H)
    (m.out_proj(m._merge(slotted)) * target).sum().backward()
    phi = m.selector.head_logits.detach().clone().requires_grad_(True)
    y = relaxed_selection((phi + 0.5 * g) / 2.0, H, strategy)
    manual, = torch.autograd.grad(y, phi, grad_outputs=wleaf.grad)
    torch.testing.assert_close(auto, manual, rtol=1e-9, atol=1e-12)
    unselected = hard == 0
    assert bool((auto[unselected] != 0).all())  # every unselected candidate of every task gets a gradient
    assert bool((auto[~unselected] != 0).all())


def test_gumbel_noise_schedule_anneals_to_the_evaluated_selection() -> None:
    """s(u) falls geometrically from noise_start to noise_end over anneal_updates; the training loop's
    HeadSelectionTraining gives it per update; at s = 0.1 the draws are the evaluated selection."""
    from lib.train.head_selection import head_selection_noise

    assert head_selection_noise(0, 1.0, 0.1, 1080) == 1.0
    assert head_selection_noise(540, 1.0, 0.1, 1080) == pytest.approx(0.1 ** 0.5)
    assert head_selection_noise(1080, 1.0, 0.1, 1080) == pytest.approx(0.1)
    assert head_selection_noise(5000, 1.0, 0.1, 1080) == pytest.approx(0.1)
    assert head_selection_noise(50, 1.0, 0.0, 100) == pytest.approx(0.5)  # a zero end: linear
    hst = HeadSelectionTraining(anneal_updates=100, noise_start=1.0, noise_end=0.1)
    assert [round(hst.noise(u), 4) for u in (0, 50, 100)] == [1.0, 0.3162, 0.1]
    assert HeadSelectionTraining().noise(7) == 1.0  # default: constant unit noise
    model = _model()
    assert set_head_selection_noise(model, 0.25) == 4
    assert all(m.noise_scale == 0.25 for mods in model.head_selection_layers().values() for _, m in mods)
    with pytest.raises(ValueError):
        set_head_selection_noise(model, -1.0)
    _, st = _asr_and_tiled("subset", "gumbel")
    m = st.encoder.layers[0].self_attn.train()
    want = m.selector.eval_selection()
    torch.manual_seed(0)
    m.selector.noise_scale = 1.0
    early = sum(torch.equal(m.selector.sample()[0], want) for _ in range(200))
    m.selector.noise_scale = 0.1
    late = sum(torch.equal(m.selector.sample()[0], want) for _ in range(200))
    assert late == 200 and early < 200
