"""Folded updates (lib/train/loop.py: merge_batches, FoldPolicy) and the training step without a host
sync per batch (_forward_backward, _read_parts); the Criterion below the loop (lib/train/criterion.py)."""

from __future__ import annotations

import ast
import copy
import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lib.data.dataset import PAD_ID, Batch
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.params import TrainConfig
from lib.train.criterion import Criterion, HostCounts
from lib.train.fold import FoldPolicy, _forward_backward, merge_batches
from lib.train.loop import RunState, _read_parts, train_config_dict

REPO = Path(__file__).resolve().parents[2]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _batch(lengths, tgt_lengths, seed, dtype=torch.float64, task=None, prefix="u"):
    g = torch.Generator().manual_seed(seed)
    t, l_max = max(lengths), max(tgt_lengths)
    feats = torch.randn(len(lengths), t, 80, generator=g, dtype=dtype)
    feats = feats.masked_fill((torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None])[..., None], 0.0)
    target = torch.full((len(lengths), l_max), PAD_ID, dtype=torch.long)
    prev = torch.full_like(target, PAD_ID)
    for i, n in enumerate(tgt_lengths):
        tok = torch.randint(4, 11, (n,), generator=g)
        tok[-1] = 2  # eos
        target[i, :n] = tok
        prev[i, 0] = 2
        prev[i, 1:n] = tok[:-1]
    ids = [f"{prefix}{seed}_{i}" for i in range(len(lengths))]
    return Batch(ids, feats, torch.tensor(lengths), prev, target, torch.tensor(tgt_lengths),
                 [f"src {i}" for i in ids], [f"tgt {i}" for i in ids], task)


def _batches(dtype=torch.float64):
    return [_batch([50, 47, 30], [5, 7, 3], 1, dtype), _batch([71, 20], [9, 2], 2, dtype),
            _batch([33, 33, 12, 64], [4, 4, 2, 6], 3, dtype)]


def test_merge_batches_sorts_and_pads():
    bs = _batches()
    m = merge_batches(bs)
    assert m.feat_lengths.tolist() == [71, 64, 50, 47, 33, 33, 30, 20, 12]
    assert m.ids == ["u2_0", "u3_3", "u1_0", "u1_1", "u3_0", "u3_1", "u1_2", "u2_1", "u3_2"]  # stable
    assert m.feats.shape == (9, 71, 80) and m.target.shape == (9, 9)
    assert torch.equal(m.feats[1, :64], bs[2].feats[3, :64]) and torch.equal(m.feats[2, 50:], torch.zeros(21, 80))
    assert torch.equal(m.target[2, :7], bs[0].target[0]) and (m.target[2, 5:] == PAD_ID).all()
    assert m.src_texts[0] == "src u2_0" and m.tgt_texts[-1] == "tgt u3_2"
    assert m.n_target_tokens == sum(b.n_target_tokens for b in bs) and m.n_frames == sum(b.n_frames for b in bs)
    assert merge_batches(bs[:1]) is bs[0]
    tasks = [_batch([5], [2], 7, task=torch.tensor([1])), _batch([9], [3], 8, task=torch.tensor([0]))]
    assert merge_batches(tasks).task.tolist() == [0, 1]
    with pytest.raises(ValueError, match="task ids"):
        merge_batches([tasks[0], _batch([5], [2], 9)])


def _grads(model, batches, fold, ctc_weight=0.0):
    model.zero_grad(set_to_none=True)
    crit = Criterion(model, 0.1, ctc_weight)
    crit.host_parts = False
    tokens = torch.tensor(float(sum(b.n_target_tokens for b in batches)), dtype=torch.float64)
    steps = [merge_batches(batches)] if fold else batches
    policy = FoldPolicy("on" if fold else "off", torch.device("cpu"), len(batches))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    pending = _forward_backward(crit, steps, tokens, 1, torch.device("cpu"), "none", scaler, policy)
    logged = _read_parts(pending, RunState())
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, logged


@pytest.mark.parametrize("attention", ["full", "local"])
def test_folded_gradient_equals_accumulated_fp64(attention):
    """Same gradient (normalised by the update's tokens) and the same logged sums, up to float rounding."""
    specs = [{"type": "full"}, {"type": "local", "window": 3}] if attention == "local" else None
    cfg = model_config("tiny", vocab_size=11, encoder_attention=specs)
    torch.manual_seed(0)
    model = S2TTransformer(cfg).double().eval()  # no dropout: the two orders draw no random numbers
    acc, logged_acc = _grads(model, _batches(), fold=False)
    fold, logged_fold = _grads(model, _batches(), fold=True)
    assert acc.keys() == fold.keys() and len(acc) > 10
    for name in acc:
        torch.testing.assert_close(fold[name], acc[name], atol=1e-12, rtol=1e-9, msg=name)
    assert logged_fold.keys() == logged_acc.keys() == {"nll", "ce"}
    for k in logged_acc:  # (the loss is summed in fp32: lib.train.objectives.label_smoothed_nll_loss)
        assert logged_fold[k] == pytest.approx(logged_acc[k], rel=1e-6)


def test_folded_gradient_equals_accumulated_with_ctc_fp64():
    """With CTC the folded update is the accumulated one too: each utterance keeps its own batch's
    tokens / labels factor (Batch.ctc_scale), which differs between the batches (here 1.5 to 1.7)."""
    cfg = model_config("tiny", vocab_size=11, ctc_vocab_size=11)
    torch.manual_seed(0)
    model = S2TTransformer(cfg).double().eval()
    factors = {round(b.n_target_tokens / (b.n_target_tokens - len(b.ids)), 3) for b in _batches()}
    assert len(factors) == 3  # one factor per batch: one factor for the merged batch would be wrong
    acc, logged_acc = _grads(model, _batches(), fold=False, ctc_weight=0.3)
    fold, logged_fold = _grads(model, _batches(), fold=True, ctc_weight=0.3)
    assert acc.keys() == fold.keys() and any("ctc" in n for n in acc)
    for name in acc:  # CTC runs in fp32 (lib.train.objectives.ctc_loss): fp32 rounding, where one factor
        # for the merged batch is off by 1e-3 and more
        torch.testing.assert_close(fold[name], acc[name], atol=1e-8, rtol=1e-5,
                                   msg=name)
    assert logged_fold.keys() == logged_acc.keys() == {"nll", "ce", "ctc"}
    assert logged_fold["ctc"] == pytest.approx(logged_acc["ctc"], rel=1e-6)


class _FoldingStub(FoldPolicy):
    """A policy that folds on a CPU (as auto does on a card that has room)."""

    def __init__(self):
        super().__init__("auto", torch.device("cpu"), 3)

    def decide(self, batches):
        return len(batches) > 1


def test_out_of_memory_of_a_folded_update_retries_accumulated_with_the_failure_released(monkeypatch):
    """The fallback runs after the handler: no exception is being handled, and the merged batch and the
    failed forward's tensors are garbage by then (a retry inside `except` would keep them on the card)."""
    import gc
    import sys
    import weakref

    from lib.train import fold as fold_module

    held, calls = [], []

    def forward_backward(net, steps, tokens, world, device, amp, scaler, folding):
        calls.append(len(steps))
        if len(steps) == 1:  # the folded update: allocate, then run out of memory
            activations = torch.ones(1000)
            held.append(weakref.ref(activations))
            held.append(weakref.ref(steps[0].feats))
            raise torch.cuda.OutOfMemoryError("simulated")
        gc.collect()
        assert sys.exc_info() == (None, None, None), "the retry runs inside the except block"
        assert all(ref() is None for ref in held), "the failed update's tensors are still referenced"
        return [(b.ids, {}) for b in steps]

    monkeypatch.setattr(fold_module, "_forward_backward", forward_backward)
    said = []
    policy = _FoldingStub()
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    pending = fold_module._update_gradients(None, _batches(), torch.tensor(10.0), 1, torch.device("cpu"), "none",
                                            None, policy, opt, said.append)
    assert calls == [1, 3] and len(pending) == 3 and policy.gave_up
    assert all(p.grad is None for p in model.parameters())  # the failed update's partial gradients dropped
    assert said == ["fold_update: auto: a folded update ran out of GPU memory; accumulating from now on"]
    assert policy.decide(_batches()) is True  # (the stub ignores gave_up; the real auto does not)
    assert FoldPolicy("auto", torch.device("cuda"), 3).state() is None


def test_fold_policy_state_survives_a_resume_and_head_selection_is_not_folded():
    policy = FoldPolicy("auto", torch.device("cuda"), 2)
    assert policy.state() is None  # nothing learnt: last.pt gets no "fold" key (always so on a CPU)
    policy.per_slot = 1234.5
    resumed = FoldPolicy("auto", torch.device("cuda"), 2)
    resumed.load_state(policy.state())
    assert resumed.per_slot == 1234.5 and not resumed.measuring() and not resumed.gave_up
    policy.gave_up = True
    resumed.load_state(policy.state())
    assert resumed.gave_up
    with pytest.raises(ValueError, match="fold_update: on: this model selects heads"):
        FoldPolicy("on", torch.device("cuda"), 2, exact=False)
    inexact = FoldPolicy("auto", torch.device("cuda"), 2, exact=False)
    inexact.per_slot = 1.0
    assert not inexact.measuring() and inexact.decide([_batch([10], [2], 1), _batch([10], [2], 2)]) is False


def test_read_parts_sums_as_reading_each_part_did():
    parts = [{"nll": torch.tensor(1.1, dtype=torch.float32), "ce": torch.tensor(2.3, dtype=torch.float32)},
             {"nll": torch.tensor(0.7, dtype=torch.float32), "ce": torch.tensor(1e-3, dtype=torch.float32)}]
    logged = _read_parts([(["a"], parts[0]), (["b"], parts[1])], RunState())
    expected = {}
    for p in parts:
        for k, v in p.items():
            expected[k] = expected.get(k, 0.0) + v.item()
    assert logged == expected  # bit for bit
    bad = {"nll": torch.tensor(1.0), "ce": torch.tensor(float("nan"))}
    with pytest.raises(FloatingPointError, match=r"update 4 .*\['x1'"):
        _read_parts([(["a"], parts[0]), (["x1", "x2"], bad)], RunState(update=3))
    bad_ctc = {"nll": torch.tensor(1.0), "ce": torch.tensor(1.0), "ctc": torch.tensor(float("inf"))}
    with pytest.raises(FloatingPointError):
        _read_parts([(["a"], bad_ctc)], RunState())


@pytest.mark.parametrize("mode, device, k, expected", [
    ("off", "cpu", 4, False), ("on", "cpu", 4, True), ("auto", "cpu", 4, False),
    ("on", "cpu", 1, False), ("auto", "cuda", 1, False), ("off", "cuda", 8, False),
])
def test_fold_policy_table(mode, device, k, expected):
    policy = FoldPolicy(mode, torch.device(device), k)
    batches = [_batch([10], [2], i) for i in range(k)]
    assert policy.decide(batches) is expected


def test_fold_policy_auto_on_cuda_waits_for_a_measurement():
    policy = FoldPolicy("auto", torch.device("cuda"), 2)
    assert policy.measuring() and policy.decide([_batch([10], [2], 1), _batch([10], [2], 2)]) is False
    policy.gave_up = True
    assert not policy.measuring()


def test_fold_update_is_validated_and_neutral_in_the_fingerprint():
    with pytest.raises(ValueError, match="train.fold_update"):
        TrainConfig(fold_update="yes").validate()
    assert "fold_update" not in train_config_dict(TrainConfig())  # auto: the fingerprints of earlier runs
    assert train_config_dict(TrainConfig(fold_update="off"))["fold_update"] == "off"


def test_criterion_host_counts_and_parts():
    cfg = model_config("tiny", vocab_size=11, ctc_vocab_size=11)
    torch.manual_seed(0)
    model = S2TTransformer(cfg).double().eval()
    b = _batches()[0]
    crit = Criterion(model, 0.1, 0.3)
    loss, parts = crit(b)
    assert isinstance(parts["ce"], float) and isinstance(parts["ctc"], float)
    host = HostCounts.of(b)
    assert host == HostCounts([50, 47, 30], 15, b.target_lengths.tolist())
    crit.host_parts = False
    loss2, parts2 = crit(b, host)
    assert torch.equal(loss, loss2) and isinstance(parts2["ce"], torch.Tensor) and parts2["ce"].item() == parts["ce"]
    assert parts2["ctc"].item() == parts["ctc"]


@pytest.mark.parametrize("fold", [False, True])
def test_ctc_reads_its_lengths_from_the_host_counts(monkeypatch, fold):
    """With host counts, CTC gets its length vectors as CPU tensors built from them (F.ctc_loss copies
    device lengths to the host, a wait for the GPU on CUDA), equal to the encoder's own lengths, and the
    loss and gradients are those of the device lengths, bit for bit; folded batches too."""
    import lib.train.objectives as objectives

    cfg = model_config("tiny", vocab_size=11, ctc_vocab_size=11)
    torch.manual_seed(0)
    model = S2TTransformer(cfg).double().train()
    b = merge_batches(_batches()) if fold else _batches()[0]
    seen = []
    real = objectives.F.ctc_loss

    def spy(lprobs, target, input_lengths, target_lengths, **kw):
        seen.append((input_lengths, target_lengths))
        return real(lprobs, target, input_lengths, target_lengths, **kw)

    monkeypatch.setattr(objectives.F, "ctc_loss", spy)
    encoded = []  # each forward's encoder lengths, the device tensor CTC would otherwise get
    model.encoder.register_forward_hook(lambda module, args, output: encoded.append(output.lengths))
    out = []
    for host in (None, HostCounts.of(b)):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout draws
        loss, _ = Criterion(model, 0.1, 0.3)(b, host)
        loss.backward()
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (dev_in, dev_tgt), (host_in, host_tgt) = seen
    enc_lengths = model.encoder.output_lengths(b.feat_lengths)
    assert torch.equal(host_in, enc_lengths) and torch.equal(host_tgt, b.target_lengths - 1)
    assert torch.equal(dev_in, host_in) and torch.equal(dev_tgt, host_tgt)
    # the host call's lengths are built from the host counts, not the encoder's (on CUDA those are on the card)
    assert dev_in is encoded[0] and host_in is not encoded[1] and host_in.data_ptr() != encoded[1].data_ptr()
    assert torch.equal(out[0][0], out[1][0])
    assert out[0][1].keys() == out[1][1].keys()
    for name in out[0][1]:
        assert torch.equal(out[0][1][name], out[1][1][name]), name


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (lazy imports inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_precision_does_not_import_the_training_loop():
    """No import circle: the `amp: probe` probe (lib/train/precision.py) builds its Criterion from
    lib/train/criterion.py, which imports neither the loop nor the probe; the loop imports both."""
    assert "lib.train.loop" not in _imports(REPO / "lib" / "train" / "precision.py")
    assert "lib.train.criterion" in _imports(REPO / "lib" / "train" / "precision.py")
    assert not {"lib.train.loop", "lib.train.precision"} & _imports(REPO / "lib" / "train" / "criterion.py")
    code = "import lib.train.precision, sys; assert 'lib.train.loop' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# ----------------------------------------------------------------------------- CUDA twins


@CUDA
def test_cuda_folded_gradient_equals_accumulated_fp32():
    cfg = model_config("tiny", vocab_size=11, encoder_attention=[{"type": "full"}, {"type": "local", "window": 3}])
    torch.manual_seed(0)
    model = S2TTransformer(cfg).cuda().eval()
    grads = {}
    for fold in (False, True):
        model.zero_grad(set_to_none=True)
        batches = _batches(torch.float32)
        crit = Criterion(model, 0.1, 0.0)
        crit.host_parts = False
        tokens = torch.tensor(float(sum(b.n_target_tokens for b in batches))).to("cuda", non_blocking=True)
        steps = [merge_batches(batches)] if fold else batches
        policy = FoldPolicy("on" if fold else "off", torch.device("cuda"), 3)
        _forward_backward(crit, steps, tokens, 1, torch.device("cuda"), "none",
                          torch.amp.GradScaler("cuda", enabled=False), policy)
        grads[fold] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for name in grads[False]:
        torch.testing.assert_close(grads[True][name], grads[False][name], atol=1e-5, rtol=1e-3, msg=name)


@CUDA
@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("ctc_weight", [0.0, 0.3])
def test_cuda_training_step_has_no_sync_per_batch(fold, ctc_weight):
    """The batches' forward and backward (bf16 autocast, packed encoder where FA2 is usable; with and
    without CTC, whose lengths come from the host counts) under torch.cuda.set_sync_debug_mode("warn"):
    nothing waits for the GPU until _read_parts but F.ctc_loss itself. Its CUDA kernel copies the
    targets' batch offsets and the lengths from pageable host memory, in the forward and in the
    backward (aten's LossCTC.cu, with any lengths: CPU ones spare only the reads of CUDA ones), and
    each such copy waits for the stream: 5 + 3 waits per call on an H200 with torch 2.11. The step
    must wait exactly as often, at the same places, as F.ctc_loss alone on that many batches. The
    paper trains without CTC (ctc_weight 0); the demo's ASR model uses it."""
    cfg = model_config("tiny", vocab_size=11, ctc_vocab_size=11,
                       encoder_attention=[{"type": "full"}, {"type": "local", "window": 3}])
    torch.manual_seed(0)
    model = S2TTransformer(cfg).cuda().train()
    crit = Criterion(model, 0.1, ctc_weight)
    crit.host_parts = False
    batches = _batches(torch.float32)
    tokens = torch.tensor(float(sum(b.n_target_tokens for b in batches))).to("cuda", non_blocking=True)
    steps = [merge_batches(batches)] if fold else batches
    policy = FoldPolicy("on" if fold else "off", torch.device("cuda"), 3)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    _forward_backward(crit, steps, tokens, 1, torch.device("cuda"), "bf16", scaler, policy)  # warm-up
    torch.cuda.synchronize()
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pending = _forward_backward(crit, steps, tokens, 1, torch.device("cuda"), "bf16", scaler, policy)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
    if ctc_weight == 0:
        assert syncs == []
    else:  # F.ctc_loss alone, forward and backward, on random log-probabilities of one batch's shapes
        from lib.train.objectives import ctc_loss
        b = steps[0]
        logits = torch.randn(b.feats.shape[0], 8, 11, device="cuda", requires_grad=True)
        enc_lengths, target = torch.full((b.feats.shape[0],), 8), b.target.cuda()  # (a copy that waits)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as alone:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                ctc_loss(logits, enc_lengths, target, b.target_lengths, blank=0).backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        own = [f"{Path(w.filename).name}:{w.lineno}" for w in alone if "synchroniz" in str(w.message)]
        print(f"syncs per batch: F.ctc_loss alone {len(own)} {own}; the step {len(syncs) / len(steps)}")
        assert own and len(syncs) == len(steps) * len(own) and set(syncs) == set(own), (syncs, own)
    logged = _read_parts(pending, RunState())
    assert math.isfinite(logged["ce"])


# Against float64 on the CPU: the losses (relative) and every gradient (absolute, in units of the
# largest gradient). fp32 on a CPU is within 1e-7 / 1e-6 of it, bf16 autocast within 3e-4 / 7e-3; the
# bounds leave room for a card's other kernels (cuDNN's CTC, its convolutions, SDPA), not for a wrong
# length, mask or scale, which moves the CTC or CE term by a percent or more.
TOLERANCE = {"none": (1e-5, 1e-4), "bf16": (5e-3, 5e-2)}


def _update_on(model, device, amp, ctc_weight, fold, dtype=torch.float32):
    """One update (the three _batches(), folded or not) of a copy of ``model`` (eval: no dropout) on
    ``device`` in ``dtype`` with ``amp``: the logged parts, and every gradient as float64 on the CPU.
    The batches are drawn in float64 and cast, so every precision sees the same inputs."""
    model = copy.deepcopy(model).to(device=device, dtype=dtype).eval()
    crit = Criterion(model, 0.1, ctc_weight)
    crit.host_parts = False
    batches = [dataclasses.replace(b, feats=b.feats.to(dtype)) for b in _batches(torch.float64)]
    tokens = torch.tensor(float(sum(b.n_target_tokens for b in batches)), dtype=dtype).to(device)
    steps = [merge_batches(batches)] if fold else batches
    policy = FoldPolicy("on" if fold else "off", device, len(batches))
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    logged = _read_parts(_forward_backward(crit, steps, tokens, 1, device, amp, scaler, policy), RunState())
    return logged, {n: p.grad.detach().to("cpu", torch.float64) for n, p in model.named_parameters()
                    if p.grad is not None}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("amp", ["none", "bf16"])
@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("ctc_weight", [0.0, 0.3])
def test_update_matches_the_cpu_fp64_one(device, amp, fold, ctc_weight):
    """The update's numbers, not only their finiteness: the CE, NLL and CTC parts and the gradients of
    an fp32 or bf16-autocast update, accumulated or folded, against the same update in float64 on the
    CPU. On a card this checks its CTC (lengths from the host counts) and attention paths; TF32 is off
    for fp32, as an exact reference needs."""
    cfg = model_config("tiny", vocab_size=11, ctc_vocab_size=11,
                       encoder_attention=[{"type": "full"}, {"type": "local", "window": 3}])
    torch.manual_seed(0)
    model = S2TTransformer(cfg)
    ref_logged, ref = _update_on(model, torch.device("cpu"), "none", ctc_weight, fold, torch.float64)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        logged, grads = _update_on(model, torch.device(device), amp, ctc_weight, fold)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    loss_rel, grad_abs = TOLERANCE[amp]
    assert logged.keys() == ref_logged.keys() == ({"nll", "ce", "ctc"} if ctc_weight else {"nll", "ce"})
    for k in ref_logged:
        assert logged[k] == pytest.approx(ref_logged[k], rel=loss_rel), k
    scale = max(g.abs().max().item() for g in ref.values())
    assert grads.keys() == ref.keys() and len(ref) > 60 and scale > 0.1
    for name in ref:
        torch.testing.assert_close(grads[name], ref[name], atol=grad_abs * scale, rtol=0, msg=name)


@CUDA
def test_cuda_fold_auto_measures_then_decides():
    policy = FoldPolicy("auto", torch.device("cuda"), 2)
    cfg = model_config("tiny", vocab_size=11)
    model = S2TTransformer(cfg).cuda().train()
    crit = Criterion(model, 0.1, 0.0)
    crit.host_parts = False
    batches = _batches(torch.float32)[:2]
    tokens = torch.tensor(float(sum(b.n_target_tokens for b in batches))).to("cuda", non_blocking=True)
    assert policy.decide(batches) is False  # not measured yet: accumulate
    _forward_backward(crit, batches, tokens, 1, torch.device("cuda"), "none",
                      torch.amp.GradScaler("cuda", enabled=False), policy)
    assert policy.per_slot is not None and policy.per_slot > 0
    assert policy.decide(batches) is True  # a tiny model fits on any card


def test_update_freq_is_the_whole_update_split_among_processes():
    from lib.train.loop import batches_per_process

    assert batches_per_process(8, 1) == 8 and batches_per_process(8, 4) == 2 and batches_per_process(8, 8) == 1
    with pytest.raises(ValueError, match=r"update_freq: 8 batches per update do not split evenly over 3 processes.*"
                                         r"e\.g\. 1, 2, 4, 8"):
        batches_per_process(8, 3)


def test_fold_policy_auto_keeps_learning_from_every_batch(monkeypatch):
    """The per-slot peak is measured on the first update and raised by any later batch, folded or not,
    that needed more: a fold whose attention grew faster than linearly makes the next decisions careful."""
    mem = {"allocated": 1000, "peak": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: mem.update(peak=mem["allocated"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: mem["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: mem["peak"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: type("P", (), {"total_memory": 10**6}))
    policy = FoldPolicy("auto", torch.device("cuda"), 2)
    batches = [_batch([10, 10], [2, 2], 1), _batch([10, 10], [2, 2], 2)]  # 2 x 10 slots each, 40 folded

    def run(steps, bytes_per_slot, policy=policy):
        for i, b in enumerate(steps):
            policy.before_batch()
            mem["peak"] = mem["allocated"] + bytes_per_slot * FoldPolicy.slots(b)
            policy.after_batch(b, i == len(steps) - 1)

    assert policy.decide(batches) is False  # nothing measured yet: accumulate the first update
    run(batches, 100)
    assert policy.per_slot == 100 and policy.decide(batches) is True  # 1000 + 40 x 100 x 1.25 fits in 850k
    run([merge_batches(batches)], 20_000)  # the folded batch needed 200 x more per slot
    assert policy.per_slot == 20_000
    assert policy.decide(batches) is False  # 1000 + 40 x 20k x 1.25 = 1.0 M > 0.85 x 1 M: accumulate
    # A run resumed from last.pt decides its next updates as the uninterrupted one does: the peak it
    # learnt is not lowered by the smaller batches that follow the resume.
    resumed = FoldPolicy("auto", torch.device("cuda"), 2)
    resumed.load_state(policy.state())
    for p in (policy, resumed):
        run(batches, 100, p)
        assert p.per_slot == 20_000 and p.decide(batches) is False


def test_update_grouping_by_length_pads_folds_less_and_changes_nothing_with_update_freq_1():
    import numpy as np

    from lib.train.loop import _update_groups

    rng = np.random.default_rng(0)
    ds = type("DS", (), {"n_frames": rng.integers(50, 3000, size=2000)})()  # a MuST-C-like spread of lengths

    def padding(groups):
        slots = sum(sum(len(b) for b in g) * max(int(ds.n_frames[i]) for b in g for i in b) for g in groups)
        return slots / sum(int(ds.n_frames[i]) for g in groups for b in g for i in b)

    one = TrainConfig(update_freq=1, max_frames=12000)
    assert _update_groups(ds, one, 0) == _update_groups(ds, dataclasses.replace(one, update_grouping="shuffled"), 0)
    k = TrainConfig(update_freq=8, max_frames=12000)
    by_length, shuffled = _update_groups(ds, k, 0), _update_groups(ds, dataclasses.replace(k, update_grouping="shuffled"), 0)
    from lib.data.dataset import batch_by_frames

    every = {tuple(b) for b in batch_by_frames(ds.n_frames, k.max_frames, shuffle=True, seed=k.seed, epoch=0)}
    used = [tuple(b) for g in by_length for b in g]
    assert set(used) <= every and len(set(used)) == len(used)  # the epoch's batches, each once
    assert len(by_length) == len(shuffled) and all(len(g) == 8 for g in by_length)
    assert padding(by_length) < 0.6 * padding(shuffled)  # (1.05 against 1.82 here)
    assert _update_groups(ds, k, 0) == by_length and _update_groups(ds, k, 1) != by_length  # seeded by the epoch
    with pytest.raises(ValueError, match="train.update_grouping"):
        TrainConfig(update_grouping="random").validate()
    assert "update_grouping" not in train_config_dict(TrainConfig())  # length: earlier fingerprints kept


def test_a_run_out_of_memory_in_a_folded_update_goes_on_with_an_accumulating_runs_weights(prepared, tmp_path,
                                                                                           monkeypatch, capsys):
    """The whole run: fold_update auto is made to fold on this CPU, and its first folded update runs out
    of memory after its forward and backward (dropout drawn, gradients written). The run goes on,
    accumulating, says so once, and ends with the weights of a run that accumulated from the start, bit
    for bit (dropout on: the failed attempt's draws are given back)."""
    import _driver
    from lib.train import fold as fold_module

    train = {"update_freq": 2, "max_updates": 6, "eval_every": 3, "save_every": 3}
    ref, ref_summary = _driver.run_training(prepared, tmp_path / "accumulated", train_overrides={**train, "fold_update": "off"})

    calls = {"folded": 0, "accumulated": 0}
    real = fold_module._forward_backward

    def forward_backward(net, steps, *args):
        if len(steps) == 1:  # the merged batch
            calls["folded"] += 1
            real(net, steps, *args)  # draws dropout and writes gradients, as a forward that fails late would
            raise torch.cuda.OutOfMemoryError("simulated")
        calls["accumulated"] += 1
        return real(net, steps, *args)

    monkeypatch.setattr(fold_module.FoldPolicy, "decide", lambda self, batches: not self.gave_up)
    monkeypatch.setattr(fold_module, "_forward_backward", forward_backward)
    capsys.readouterr()
    net, summary = _driver.run_training(prepared, tmp_path / "folded", train_overrides={**train, "fold_update": "auto"})
    assert calls == {"folded": 1, "accumulated": 6}  # one failed fold, then every update accumulated
    assert capsys.readouterr().out.count("ran out of GPU memory; accumulating from now on") == 1
    assert summary["updates"] == 6
    for name, value in ref.state_dict().items():
        assert torch.equal(value, net.state_dict()[name]), name
    assert [r["dev/loss"] for r in summary["history"]] == [r["dev/loss"] for r in ref_summary["history"]]
    state = torch.load(tmp_path / "folded/checkpoints/last.pt", weights_only=True)
    assert state["fold"]["gave_up"] is True  # a resumed run keeps accumulating


def test_criterion_loss_over_real_tokens_equals_the_whole_logits_loss_with_ctc():
    """The CE over the real tokens (the CUDA path, forced here on the CPU) gives the whole-logits loss
    and the same gradient in every parameter, CTC included; the default on the CPU is the reference."""
    cfg = model_config("tiny", vocab_size=11, ctc_vocab_size=11)
    torch.manual_seed(0)
    model = S2TTransformer(cfg).double().eval()
    b = _batches()[2]
    out = {}
    for nonpad in (None, False, True):
        model.zero_grad(set_to_none=True)
        crit = Criterion(model, 0.1, 0.3)
        crit.nonpad_loss = nonpad
        loss, parts = crit(b, HostCounts.of(b))
        loss.backward()
        out[nonpad] = loss.detach(), parts, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert torch.equal(out[None][0], out[False][0]) and out[None][1] == out[False][1]
    assert out[True][0].item() == pytest.approx(out[False][0].item(), rel=1e-6)
    assert out[True][1]["nll"] == pytest.approx(out[False][1]["nll"], rel=1e-6)
    assert len(out[True][2]) > 10
    for name, grad in out[False][2].items():  # the reference rounds the logits to fp32; the other keeps fp64
        torch.testing.assert_close(out[True][2][name], grad, rtol=1e-5, atol=1e-7, msg=name)
