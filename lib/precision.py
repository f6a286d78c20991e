"""Mixed precision: which one a run uses (``amp`` param) and the autocast context for it.

Shared by training (lib/train/) and decoding (lib/decode/beam_search.py); torch and params only.

``amp: auto`` on a CPU with native bf16 (AVX-512 BF16 or AMX) resolves per phase:

* decoding: bf16 (beam-5 decoding measured 1.24x faster on a 2-core AMD EPYC, 1.56x on a 2-core
  Intel Xeon with AMX: ``benchmarks/train_throughput.py``);
* training: by CPU kind (:func:`cpu_trains_faster_in_bf16`), a rule fixed by whole runs, so every run
  on a kind of CPU trains in the same precision. bf16 on a CPU with AVX-512 BF16 and no AMX: on a
  2-core AMD EPYC the default's shared ASR model trained in 13.0-13.4 min in bf16 against
  22.1-23.8 min in fp32, and the whole default 1.4x sooner. fp32 on a CPU with AMX: on a 2-core
  Intel Xeon the same ASR model trained in 33.3 min in bf16 against 24.3 min in fp32 (oneDNN's bf16
  matmuls on the demo's small shapes, plus the casts), and ST steps were 3-13 % slower in bf16.
  The rule replaced a per-machine timing probe as ``auto``: on the Intel Xeon the probe picked bf16
  at 1.37x for an ASR model that then trained slower than in fp32, and an hour later picked fp32
  (1.04x) on the same host, so two runs of one default trained two different draws.

``amp: probe`` keeps that measurement for a CPU kind the rule has not seen: lib/train/precision.py.
Runs record the precision they used in their metrics (``precision``, ``decode_precision``) and in
their checkpoint's fingerprint, so a run never resumes in another precision.
"""
from __future__ import annotations

import os

import torch

from lib.params import AMP_MODES

# autocast's dtype per resolved ``amp``; None: autocast off (``fp64`` runs a float64 model instead:
# lib.train.run.execute converts it, and the model casts its input features to its own dtype)
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": None}

# oneDNN keeps the kernels it builds per shape in a cache of 1024 by default. A bf16 training run on
# CPU sees new batch shapes every update and fills it within ~30 updates; from then on it rebuilds
# evicted kernels: ST bf16 steps went from 177 to 211-223 ms after update 32 (fp32 steady at 168;
# 2-core Xeon with AMX, demo model), and at 16384 stayed at 172-180 ms. Read by oneDNN when it builds
# its first kernel, so set at import, before any training; the environment variable overrides it.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16384")


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 BF16 or AMX): then autocast to bf16 speeds
    up training and decoding (1.5x per demo training step measured on a 2-core AMD EPYC); without
    it bf16 is emulated and no faster."""
    try:
        if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
            return True
    except AttributeError:  # private helpers of torch.cpu; fall back to the kernel's CPU flags
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Xeon Sapphire Rapids and later)."""
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except AttributeError:
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return "amx_tile" in f.read()
    except OSError:
        return False


def cpu_trains_faster_in_bf16() -> bool:
    """``amp: auto``'s training precision on a CPU: bf16 where the CPU computes bf16 natively without AMX
    (AVX-512 BF16: the AMD EPYC, where whole runs train 1.4-1.7x sooner in bf16), fp32 on an AMX CPU (the
    Intel Xeon, where whole runs train slower in bf16) or without native bf16. Module docstring."""
    return cpu_has_bf16() and not cpu_has_amx()


def resolve_amp(amp: str, device: torch.device) -> str:
    """The precision a run decodes in: ``auto`` (and ``probe``) -> ``bf16`` on a CUDA device that computes it
    natively (compute capability 8.0 or later; fp32, with TF32, on older cards) or on a CPU with native
    bf16 (:func:`cpu_has_bf16`), else ``none``; other values are returned unchanged (``fp16`` on CPU is
    refused: autocast has no fp16 CPU kernels worth using)."""
    if amp not in AMP_MODES:
        raise ValueError(f"amp must be one of {list(AMP_MODES)}, got {amp!r}")
    if amp == "fp16" and device.type != "cuda":
        raise ValueError("amp: fp16 needs a CUDA device (use bf16 or auto on CPU)")
    if amp not in ("auto", "probe"):
        return amp
    if device.type == "cuda":
        # Native bf16 only (compute capability 8.0 and later: A100, H100, ...). torch.cuda.is_bf16_supported()
        # also says yes where bf16 is emulated (V100, T4, RTX 2080 Ti) and runs slower than fp32 there.
        native = bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8
        return "bf16" if native else "none"
    return "bf16" if device.type == "cpu" and cpu_has_bf16() else "none"


def configure_cuda() -> None:
    """Backend choices for CUDA runs (called wherever a run picks a CUDA device; idempotent).

    cuDNN's fused attention (one of SDPA's backends, preferred on Hopper) is switched off: it
    builds a cuDNN graph for every new (batch, length) shape, and this pipeline's batches have a
    new shape almost every update. On an H100 (torch 2.11, demo model, bf16, 200 updates of 3000
    frames) training took 43.5 s with it and 20.6 s without, decoding 1.8 s and 0.4 s. SDPA then
    uses its flash / memory-efficient kernels (or the math one where a mask rules them out)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def autocast(device: torch.device, amp: str):
    """``torch.autocast`` for a resolved ``amp`` (``none`` -> disabled)."""
    dtype = AMP_DTYPES[amp]
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


# What ``pad_frames_to / pad_tokens_to: auto`` means for a run that trains in bf16 on a CPU. oneDNN
# builds a bf16 kernel per matrix shape, and unpadded batches bring a new shape at nearly every
# update; rounded up to 64 frames / 8 tokens, a run meets a few dozen shapes (+7 % padded frames).
# en-de batches, 60 updates, one process per row (benchmarks/train_real_batches.py, 2-core AMD EPYC):
# ASR bf16 318 ms unpadded, 234 padded, fp32 325 / 344; ST bf16 182 / 142, fp32 168 / 177 ms. fp32
# kernels are not per shape, so padding only costs fp32 the extra frames: auto leaves it at 1 there.
BF16_PAD_TO = (64, 8)


def resolve_padding(pad_frames_to: int | str, pad_tokens_to: int | str, amp: str,
                    device: torch.device) -> tuple[int, int]:
    """The batch padding (frames, target tokens) a run uses: explicit integers as given, ``auto``
    -> :data:`BF16_PAD_TO` when it trains in bf16 (``amp`` resolved) on a CPU, else 1."""
    auto = amp == "bf16" and device.type == "cpu"
    return tuple(int(BF16_PAD_TO[i] if auto else 1) if value == "auto" else int(value)
                 for i, value in enumerate((pad_frames_to, pad_tokens_to)))
