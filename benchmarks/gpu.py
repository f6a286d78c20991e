"""Benchmark: the paper's model on one GPU -- local attention, the encoder, the update, a short run.

One run, side by side, one JSON line per figure on stdout (docs/gpu.md, "Measured figures"):

1. ``op``: the attention op, forward + backward, as the encoder calls it, at (B, N) = (60, 166)
   (MuST-C's mean length), (9, 1052) and (8, 1052) (its longest), H = 4, dh = 64, w = 13, with
   padding (one sequence of N, the others shorter; lengths drawn once from a fixed seed), in bf16 and
   fp32: ``full_sdpa`` (full attention as FullAttention runs it: SDPA with an additive padding bias,
   the baseline), ``blocked`` (lib/model/local_attention.py's kernel), ``sdpa_band`` (SDPA with a band
   AND padding mask) and ``flash`` (FlashAttention-2 with a window on tensors already packed in the
   varlen layout; bf16 only). ``ratio`` = time / full_sdpa's; ``max_diff`` = largest |out - fp64
   reference| on the valid rows.
2. ``encoder``: the 12-layer encoder at paper size (d = 256, 4 heads, FFN 2048, subsampler included),
   forward + backward in training mode, ``full`` (12 full layers) vs ``paper`` (layers 1-3 full, 4-12
   local with the paper's En-De windows), each in the layout the encoder picks (bf16: packed, FA2) and
   forced padded (``*_padded``: SDPA, band-masked for local layers); ``ratio`` = time / full's.
3. ``update``: one paper update (size s, 8000-token vocabulary, update_freq 8 x a 60 x 650-frame
   batch, fused Adam, clipping) as ``accumulated_synced`` (8 batches, reading the loss after each: the
   loop before this change), ``accumulated`` (8 batches, read once per update) and ``folded`` (one batch
   of the 480 utterances sorted by length), bf16 and fp32, with the peak GPU memory of the update;
   ``ratio`` = time / accumulated_synced's.
   ``fp32_tf32``: the ``update`` figure once more in fp32 with TF32 matmuls and convolutions, as an fp32
   training run on a card computes (lib/train/run.py); measured last, after the short run.
   ``update_mix``: the same update on a MuST-C-like length mix (log-normal utterance lengths, 50-3000
   frames, 40k-frame batches as the loop builds them), its 8 batches grouped as the loop groups them
   (``update_grouping`` length, the default, or shuffled), bf16: accumulated and folded, with the
   folded batch's padding (slots per valid frame).
4. ``training``: a short run of the paper-size local model on the folded path (bf16, two fixed update
   groups of synthetic utterances and targets, seen in turn): the loss of every update, first to last.

Time: median of ``--reps`` timed repetitions after warm-up, each synchronised (``torch.cuda.synchronize``).
The whole run stays within ``--budget`` seconds (default 220): a part that would start past it prints
``{"figure": ..., "skipped": "time budget"}`` instead. On a machine without CUDA it prints a message and
exits 0; ``--cpu-smoke`` runs every part on the CPU at tiny shapes (a check of the script, no figures).

Usage:  python benchmarks/gpu.py [--reps 10] [--budget 220] [--cpu-smoke]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lib.data.dataset import PAD_ID, Batch  # noqa: E402
from lib.model import cuda_attention as ca  # noqa: E402
from lib.model import local_attention as la  # noqa: E402
from lib.model.s2t_transformer import S2TTransformer, model_config  # noqa: E402
from lib.paper import EN_DE_WINDOWS, FULL_LAYERS  # noqa: E402
from lib.params import TrainConfig  # noqa: E402
from lib.precision import autocast, configure_cuda  # noqa: E402
from lib.train.criterion import Criterion  # noqa: E402
from lib.train.loop import FoldPolicy, RunState, _forward_backward, _read_parts, make_optimizer, merge_batches  # noqa: E402
from lib.train.objectives import learning_rate  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# The update figures' precisions: autocast to bf16, or fp32 ("fp32_tf32": with TF32 matmuls and convolutions,
# as lib/train/run.py sets them for an fp32 run on a card; plain "fp32" leaves matmuls in full fp32).
UPDATE_PRECISIONS = ("bf16", "fp32", "fp32_tf32")
START = time.perf_counter()


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, reps: int, warmup: int = 2) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` synchronised calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def over_budget(args, figure: str) -> bool:
    if time.perf_counter() - START > args.budget:
        emit(figure=figure, skipped="time budget", elapsed_s=round(time.perf_counter() - START, 1))
        return True
    return False


def lengths_for(b: int, n: int, seed: int = 0) -> list[int]:
    """One sequence of n, the others n - U[0, 0.35 n) (a fixed draw): about MuST-C's padding at (60, 166)."""
    g = torch.Generator().manual_seed(seed + 1000 * b + n)
    rest = (n - torch.randint(0, max(1, int(0.35 * n)), (b - 1,), generator=g)).tolist()
    return [n] + [int(x) for x in rest]


# ----------------------------------------------------------------------------- 1. the op


def op_figures(args, device: torch.device, shapes, dtypes, h: int, dh: int, w: int) -> None:
    flash_ok = ca.flash_supported(device)
    for b, n in shapes:
        if over_budget(args, "op"):
            return
        lengths = lengths_for(b, n)
        kpm = (torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]).to(device)
        packing = ca.Packing.build(lengths, n, device)
        g = torch.Generator().manual_seed(0)
        base = [torch.randn(b, h, n, dh, generator=g).to(device) for _ in range(3)]
        valid = (~kpm)[:, None, :, None].expand(b, h, n, dh)
        ref = la.banded_reference(*(t.double() for t in base), w, kpm)
        bias = torch.zeros(b, 1, 1, n, device=device).masked_fill(kpm[:, None, None, :], torch.finfo(torch.float32).min / 2)
        band_bool = la.band_mask(n, w, device=device)[None, None] & (~kpm)[:, None, None, :]
        band_bool = band_bool | ~band_bool.any(-1, keepdim=True)
        band_bias = torch.zeros(band_bool.shape, device=device).masked_fill(~band_bool, torch.finfo(torch.float32).min / 2)
        for name in dtypes:
            dtype = DTYPES[name]
            q, k, v = (t.to(dtype).requires_grad_(True) for t in base)
            go = torch.randn(b, h, n, dh, generator=torch.Generator().manual_seed(1)).to(device, dtype)
            qp, kp, vp = (packing.pack(t.detach().transpose(1, 2)).requires_grad_(True) for t in (q, k, v))
            gop = packing.pack(go.transpose(1, 2))
            paths = {
                "full_sdpa": (lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(dtype)),
                              (q, k, v), go),
                "blocked": (lambda: la.local_attention(q, k, v, w, kpm), (q, k, v), go),
                "sdpa_band": (lambda: ca.sdpa_band_attention(q, k, v, w, kpm), (q, k, v), go),
                # diagnostics: the same SDPA call with its mask built beforehand (bool, then additive),
                # to split sdpa_band's time into building the mask and the masked kernel
                "sdpa_band_mask_prebuilt": (lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=band_bool), (q, k, v), go),
                "sdpa_band_bias_prebuilt": (lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=band_bias.to(dtype)), (q, k, v), go),
            }
            if flash_ok and dtype in la.FLASH_DTYPES:
                paths["flash"] = (lambda: ca.packed_attention(qp, kp, vp, packing, w), (qp, kp, vp), gop)
            base_ms = None
            for path, (fwd, inputs, grad_out) in paths.items():
                ms = timed(lambda: torch.autograd.grad(fwd(), inputs, grad_out), device, args.reps)
                with torch.no_grad():
                    out = fwd()
                    if path == "flash":
                        out = packing.unpack(out).transpose(1, 2)
                    diff = None if path == "full_sdpa" else float((out.double() - ref)[valid].abs().max())
                base_ms = ms if path == "full_sdpa" else base_ms
                emit(figure="op", B=b, N=n, H=h, dh=dh, w=w, dtype=name, path=path, ms=round(ms, 4),
                     ratio=round(ms / base_ms, 3), max_diff_valid=diff, padded_share=round(1 - sum(lengths) / (b * n), 3),
                     **({"ran": packing.path} if path == "flash" else {}))
            if not flash_ok and dtype in la.FLASH_DTYPES:
                emit(figure="op", B=b, N=n, dtype=name, path="flash", skipped="FlashAttention-2 not usable here")


# ----------------------------------------------------------------------------- 2. the encoder


def _feats(lengths_frames: list[int], device: torch.device, n_mels: int = 80) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    t = max(lengths_frames)
    feats = torch.randn(len(lengths_frames), t, n_mels, generator=g)
    feats = feats.masked_fill((torch.arange(t)[None, :] >= torch.tensor(lengths_frames)[:, None])[..., None], 0.0)
    return feats.to(device), torch.tensor(lengths_frames).to(device)


def encoder_figures(args, device: torch.device, size: str, shapes, dtypes, vocab: int) -> None:
    layers = model_config(size, vocab_size=vocab).encoder_layers
    specs = {"full": [{"type": "full"}] * layers,
             "paper": [{"type": "full"}] * FULL_LAYERS + [{"type": "local", "window": w} for w in EN_DE_WINDOWS]}
    specs["paper"] = specs["paper"][:layers] + [{"type": "full"}] * (layers - len(specs["paper"]))
    torch.manual_seed(0)
    models = {name: S2TTransformer(model_config(size, vocab_size=vocab, encoder_attention=spec)).encoder.to(device).train()
              for name, spec in specs.items()}
    models["paper"].load_state_dict(models["full"].state_dict())
    for b, n in shapes:
        if over_budget(args, "encoder"):
            return
        frames = [4 * x for x in lengths_for(b, n)]  # the subsampler divides by 4
        feats, lens = _feats(frames, device)
        for name in dtypes:
            amp = "bf16" if name == "bf16" else "none"
            base_ms = None
            for config in ("full", "paper", "full_padded", "paper_padded"):
                enc = models[config.split("_")[0]]
                if config.endswith("_padded"):
                    enc.packing_path = lambda content, need_weights: None  # this instance: the padded layout
                params = [p for p in enc.parameters()]

                def step():
                    with autocast(device, amp):
                        out = enc(feats, lens, feat_lengths_host=frames).out
                    torch.autograd.grad(out.float().square().mean(), params, allow_unused=True)

                with autocast(device, amp):
                    with torch.no_grad():
                        layout = enc.packing_path(enc.embed(feats, lens)[0], False) or "padded"
                ms = timed(step, device, args.reps)
                if config.endswith("_padded"):
                    del enc.packing_path
                base_ms = ms if config == "full" else base_ms
                emit(figure="encoder", size=size, layers=layers, B=b, N=n, dtype=name, config=config, layout=layout,
                     ms=round(ms, 3), ratio=round(ms / base_ms, 3))


# ----------------------------------------------------------------------------- 3. the update


def synthetic_batches(k: int, b: int, frames: int, vocab: int, seed: int, max_tokens: int = 40) -> list[Batch]:
    """k host batches of b utterances of about ``frames`` frames (the longest exactly) and 15-``max_tokens``
    random target tokens (ids 4..vocab-1, eos 2)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(k):
        lens = [frames] + (frames - torch.randint(0, max(1, frames // 5), (b - 1,), generator=g)).tolist()
        tl = torch.randint(min(15, max_tokens), max_tokens + 1, (b,), generator=g).tolist()
        out.append(random_batch(lens, tl, vocab, g, f"b{seed}_{i}"))
    return out


def random_batch(lens: list[int], tl: list[int], vocab: int, g: torch.Generator, name: str) -> Batch:
    """A host batch of utterances of ``lens`` frames (random features, zero past each length) with random
    targets of ``tl`` tokens (ids 4..vocab-1, eos 2), drawn from ``g``."""
    b, frames = len(lens), max(lens)
    feats = torch.randn(b, frames, 80, generator=g)
    feats = feats.masked_fill((torch.arange(frames)[None, :] >= torch.tensor(lens)[:, None])[..., None], 0.0)
    target = torch.full((b, max(tl)), PAD_ID, dtype=torch.long)
    prev = torch.full_like(target, PAD_ID)
    for j, n in enumerate(tl):
        tok = torch.randint(4, vocab, (n,), generator=g)
        tok[-1] = 2
        target[j, :n], prev[j, 0], prev[j, 1:n] = tok, 2, tok[:-1]
    ids = [f"{name}_{j}" for j in range(b)]
    return Batch(ids, feats, torch.tensor(lens), prev, target, torch.tensor(tl), ids, ids)


def run_update(crit: Criterion, opt, model, batches: list[Batch], device: torch.device, amp: str, mode: str,
               lr: float = 1e-4) -> float:
    """One update: forward and backward of ``batches`` (``mode``: accumulated_synced / accumulated /
    folded), clipping at 10, fused Adam. Returns the summed CE of the update (read once)."""
    opt.zero_grad(set_to_none=True)
    tokens = torch.tensor(float(sum(x.n_target_tokens for x in batches))).to(device, non_blocking=True)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    policy = FoldPolicy("on" if mode == "folded" else "off", device, len(batches))
    steps = [merge_batches(batches, device)] if mode == "folded" else batches
    if mode == "accumulated_synced":  # the loop before: the loss parts read after every batch
        logged = 0.0
        for cpu_batch in steps:
            pending = _forward_backward(crit, [cpu_batch], tokens, 1, device, amp, scaler, policy)
            logged += _read_parts(pending, RunState())["ce"]
    else:
        logged = _read_parts(_forward_backward(crit, steps, tokens, 1, device, amp, scaler, policy), RunState())["ce"]
    float(torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0))
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    return logged / max(1, sum(x.n_target_tokens for x in batches))


def update_model(size: str, vocab: int, device: torch.device):
    """(model, criterion, optimizer) of the update figures: the ``size`` model from seed 0, fused Adam."""
    torch.manual_seed(0)
    model = S2TTransformer(model_config(size, vocab_size=vocab)).to(device).train()
    crit = Criterion(model, 0.1, 0.0)
    crit.host_parts = False
    return model, crit, make_optimizer(model, TrainConfig())


@contextlib.contextmanager
def tf32(enabled: bool):
    """TF32 for CUDA matmuls and convolutions inside the block (as lib/train/run.py sets them for an fp32
    run); the flags as they were afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if enabled:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def time_update_modes(args, device: torch.device, model, crit, opt, updates: list[list[Batch]], name: str,
                      figure: str, reps: int, warmup: int, fields: dict, skip_fields: dict) -> bool:
    """One ``figure`` line per mode (accumulated_synced, accumulated, folded) in precision ``name``, each
    timing ``updates`` in turn from the first; ``ratio`` = time / accumulated_synced's. False when the
    time budget ran out (the caller stops)."""
    if name not in UPDATE_PRECISIONS:
        raise ValueError(f"update precision {name!r}: one of {UPDATE_PRECISIONS}")
    amp = "bf16" if name == "bf16" else "none"
    base_ms = None
    for mode in ("accumulated_synced", "accumulated", "folded"):
        if over_budget(args, figure):
            return False
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        turn = iter(range(10**9))
        try:
            with tf32(name == "fp32_tf32"):
                ms = timed(lambda: run_update(crit, opt, model, updates[next(turn) % len(updates)], device, amp, mode),
                           device, reps, warmup=warmup)
        except torch.cuda.OutOfMemoryError as e:
            opt.zero_grad(set_to_none=True)
            emit(figure=figure, **skip_fields, dtype=name, mode=mode, skipped=f"out of memory: {str(e).splitlines()[0]}")
            continue
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        base_ms = ms if mode == "accumulated_synced" else base_ms
        emit(figure=figure, **fields, dtype=name, mode=mode, ms=round(ms, 2), ratio=round(ms / base_ms, 3),
             peak_gib=None if peak is None else round(peak, 2))
    return True


def update_figures(args, device: torch.device, size: str, k: int, b: int, frames: int, vocab: int, dtypes) -> None:
    model, crit, opt = update_model(size, vocab, device)
    batches = synthetic_batches(k, b, frames, vocab, seed=1)
    fields = dict(size=size, params=sum(p.numel() for p in model.parameters()), update_freq=k, B=b, frames=frames)
    for name in dtypes:
        if not time_update_modes(args, device, model, crit, opt, [batches], name, "update",
                                 max(3, args.reps // 2), 1, fields, {}):
            return


def batches_of(lengths: list[list[int]], vocab: int, seed: int, frames_per_token: int = 20) -> list[Batch]:
    """Host batches of utterances of these frame lengths (one list per batch), random features, and
    about one random target token per ``frames_per_token`` frames (3-200 tokens; ids 4..vocab-1, eos 2)."""
    g = torch.Generator().manual_seed(seed)
    return [random_batch(lens, [min(200, max(3, n // frames_per_token)) for n in lens], vocab, g, f"m{seed}_{i}")
            for i, lens in enumerate(lengths)]


def mustc_like_lengths(n: int, seed: int, median: float = 550.0, sigma: float = 0.6,
                       lo: int = 50, hi: int = 3000) -> list[int]:
    """Utterance lengths in frames with MuST-C's shape: log-normal around a 5.5 s median, from 0.5 s to
    the recipe's 3000-frame cap (MuST-C En-De train: median about 5 s, a long tail to 30 s)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.exp(torch.randn(n, generator=g, dtype=torch.float64) * sigma) * median
    return x.round().clamp(lo, hi).long().tolist()


def mustc_like_updates(k: int, max_frames: int, vocab: int, grouping: str, n_utts: int, updates: int = 2,
                       seed: int = 3) -> tuple[list[list[Batch]], float]:
    """``updates`` updates of ``k`` batches as the training loop groups them (``update_grouping``,
    lib.train.loop._update_groups) from an epoch of :func:`mustc_like_lengths`; and the folded padding of
    those updates: padded frame slots of each update's merged batch / its valid frames."""
    from types import SimpleNamespace

    from lib.train.loop import _update_groups

    n_frames = mustc_like_lengths(n_utts, seed)
    cfg = TrainConfig(max_frames=max_frames, update_freq=k, update_grouping=grouping, seed=seed)
    groups = _update_groups(SimpleNamespace(n_frames=n_frames), cfg, epoch=1)[:updates]
    out, slots, valid = [], 0, 0
    for u, group in enumerate(groups):
        lengths = [[n_frames[i] for i in batch] for batch in group]
        out.append(batches_of(lengths, vocab, seed=100 + u))
        flat = [x for lens in lengths for x in lens]
        slots, valid = slots + len(flat) * max(flat), valid + sum(flat)
    return out, slots / valid


def mix_figures(args, device: torch.device, size: str, k: int, max_frames: int, vocab: int, n_utts: int,
                dtypes) -> None:
    """The update on a MuST-C-like length mix: each update's k batches as the loop groups them, by length
    (the default) or shuffled (fairseq's), accumulated and folded; ``ratio`` = time / accumulated_synced's
    on the same grouping, ``fold_padding`` = slots of the folded batch per valid frame."""
    model, crit, opt = update_model(size, vocab, device)
    for grouping in ("length", "shuffled"):
        updates, padding = mustc_like_updates(k, max_frames, vocab, grouping, n_utts)
        fields = dict(size=size, update_freq=k, max_frames=max_frames, grouping=grouping,
                      fold_padding=round(padding, 3))
        for name in dtypes:
            if not time_update_modes(args, device, model, crit, opt, updates, name, "update_mix", max(4, args.reps // 2), 2, fields, {"grouping": grouping}):
                return


# ----------------------------------------------------------------------------- 4. a short run


def training_figure(args, device: torch.device, size: str, k: int, b: int, frames: int, vocab: int,
                    updates: int) -> None:
    if over_budget(args, "training"):
        return
    layers = model_config(size, vocab_size=vocab).encoder_layers
    spec = ([{"type": "full"}] * FULL_LAYERS + [{"type": "local", "window": w} for w in EN_DE_WINDOWS])[:layers]
    spec += [{"type": "full"}] * (layers - len(spec))
    torch.manual_seed(0)
    model = S2TTransformer(model_config(size, vocab_size=vocab, encoder_attention=spec)).to(device).train()
    crit = Criterion(model, 0.1, 0.0)
    crit.host_parts = False
    opt = make_optimizer(model, TrainConfig())
    groups = [synthetic_batches(k, b, frames, vocab, seed=s, max_tokens=25) for s in (11, 12)]
    amp = "bf16" if device.type == "cuda" else "none"
    losses = []
    t0 = time.perf_counter()
    for u in range(updates):
        lr = learning_rate(u, "inverse_sqrt", 2e-3, max(1, updates // 4), updates, 1e-7)
        losses.append(round(run_update(crit, opt, model, groups[u % 2], device, amp, "folded", lr=lr), 4))
    sync(device)
    emit(figure="training", size=size, model="paper windows", dtype=amp, update_freq=k, B=b, frames=frames,
         updates=updates, seconds=round(time.perf_counter() - t0, 1), losses=losses,
         first_two=losses[:2], last_two=losses[-2:], went_down=min(losses[-2:]) < min(losses[:2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget", type=float, default=220.0, help="seconds; later parts are skipped past it")
    ap.add_argument("--cpu-smoke", action="store_true", help="every part on the CPU at tiny shapes (no figures)")
    args = ap.parse_args()
    if args.cpu_smoke:
        device = torch.device("cpu")
        args.reps = min(args.reps, 2)
        emit(figure="env", device="cpu (smoke test: tiny shapes, no figures)", torch=torch.__version__)
        op_figures(args, device, [(3, 20), (2, 37)], ("bf16", "fp32"), h=2, dh=8, w=5)
        encoder_figures(args, device, "tiny", [(3, 20)], ("fp32",), vocab=50)
        update_figures(args, device, "tiny", k=2, b=3, frames=80, vocab=50, dtypes=("fp32",))
        mix_figures(args, device, "tiny", k=2, max_frames=600, vocab=50, n_utts=40, dtypes=("fp32",))
        training_figure(args, device, "tiny", k=2, b=3, frames=80, vocab=50, updates=6)
        update_figures(args, device, "tiny", k=2, b=3, frames=80, vocab=50, dtypes=("fp32_tf32",))
        return 0
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device here; nothing measured (run it on a GPU machine, or "
              "--cpu-smoke to check the script on the CPU)", file=sys.stderr)
        return 0
    device = torch.device("cuda")
    configure_cuda()
    props = torch.cuda.get_device_properties(device)
    emit(figure="env", device=props.name, memory_gib=round(props.total_memory / 2**30, 1), torch=torch.__version__,
         cuda=torch.version.cuda, flash_usable=ca.flash_supported(device))
    op_figures(args, device, [(60, 166), (9, 1052), (8, 1052)], ("bf16", "fp32"), h=4, dh=64, w=13)
    encoder_figures(args, device, "s", [(60, 166), (9, 1052)], ("bf16", "fp32"), vocab=8000)
    update_figures(args, device, "s", k=8, b=60, frames=650, vocab=8000, dtypes=("bf16", "fp32"))
    mix_figures(args, device, "s", k=8, max_frames=40000, vocab=8000, n_utts=6000, dtypes=("bf16",))
    training_figure(args, device, "s", k=8, b=60, frames=650, vocab=8000, updates=30)
    # fp32 as a training run on a card computes it (TF32), last: the figures above come first
    update_figures(args, device, "s", k=8, b=60, frames=650, vocab=8000, dtypes=("fp32_tf32",))
    emit(figure="done", seconds=round(time.perf_counter() - START, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
