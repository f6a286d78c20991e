"""Log mel filter bank features, utterance CMVN and SpecAugment, as in fairseq's S2T MuST-C recipe.

* :func:`fbank`: 80-dim Kaldi-compatible log mel filter banks (25 ms window, 10 ms shift,
  no dither) of 16-bit-scaled samples (``examples/speech_to_text/data_utils.extract_fbank_features``).
* :func:`utterance_cmvn`: fairseq's ``UtteranceCMVN`` transform (per-utterance mean/variance).
* :func:`spec_augment`: fairseq's ``SpecAugmentTransform`` with the LB policy defaults used for
  MuST-C (F=27, mF=1, T=100, mT=1, p=1.0, no time warping), but drawing from an explicit
  ``torch.Generator`` so that augmentation is reproducible.
"""
from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import torch
import torchaudio.compliance.kaldi as kaldi

FRAME_LENGTH_MS = 25.0
FRAME_SHIFT_MS = 10.0

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)


def fbank(wave: np.ndarray, sample_rate: int = 16000, n_mels: int = 80) -> np.ndarray:
    """Log mel filter banks ``(T, n_mels)`` float32 of float samples in [-1, 1], exactly as fairseq.

    Samples are scaled by 2**15 (to the PCM16 range, as Kaldi expects) and passed to
    ``torchaudio.compliance.kaldi.fbank`` with its defaults stated explicitly: 25 ms Povey window,
    10 ms shift, dither 0, snip_edges (``T == num_frames(len(wave))``). A wave shorter than one
    window gives ``T == 0`` (Kaldi would assert).
    """
    wave = np.asarray(wave, dtype=np.float32)
    if wave.ndim != 1:
        raise ValueError(f"fbank expects 1-D mono samples, got shape {wave.shape}")
    if num_frames(len(wave), sample_rate) == 0:
        return np.zeros((0, n_mels), dtype=np.float32)
    feats = kaldi.fbank(
        torch.from_numpy(wave * 2**15)[None],
        num_mel_bins=n_mels,
        sample_frequency=float(sample_rate),
        frame_length=FRAME_LENGTH_MS,
        frame_shift=FRAME_SHIFT_MS,
        dither=0.0,
        snip_edges=True,
    )
    return feats.numpy()


def num_frames(num_samples: int, sample_rate: int = 16000) -> int:
    """Number of fbank frames of ``num_samples`` samples (Kaldi snip_edges: whole windows only)."""
    win = int(sample_rate * FRAME_LENGTH_MS / 1000)
    shift = int(sample_rate * FRAME_SHIFT_MS / 1000)
    if num_samples < win:
        return 0
    return 1 + (num_samples - win) // shift


def utterance_cmvn(feats: ArrayT) -> ArrayT:
    """Per-utterance mean and variance normalisation over time, as fairseq's ``UtteranceCMVN``.

    ``(x - mean) / sqrt(max(var, 1e-10))`` per feature dimension with ``var = E[x^2] - mean^2``,
    fairseq's formula, but accumulated in float64 (fairseq's float32 loses ~1e-3 of the std to
    cancellation) and returned in the input's dtype. Works on numpy arrays and torch tensors of
    shape ``(T, n_mels)`` and returns the same type; ``T == 0`` is returned unchanged.
    """
    if feats.shape[0] == 0:
        return feats
    if isinstance(feats, torch.Tensor):
        x = feats.double()
        mean = x.mean(dim=0)
        var = (x**2).sum(dim=0) / x.shape[0] - mean**2
        return ((x - mean) / torch.sqrt(torch.clamp(var, min=1e-10))).to(feats.dtype)
    x = np.asarray(feats)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=0)
    var = (x64**2).sum(axis=0) / x64.shape[0] - mean**2
    return ((x64 - mean) / np.sqrt(np.maximum(var, 1e-10))).astype(x.dtype)


def _randint(low: int, high: int, generator: torch.Generator) -> int:
    """Uniform integer in ``[low, high)`` (as ``np.random.randint``), drawn from ``generator``."""
    return int(torch.randint(low, high, (1,), generator=generator).item())


def spec_augment(
    feats: torch.Tensor,
    generator: torch.Generator,
    freq_mask_F: int = 27,
    freq_mask_N: int = 1,
    time_mask_T: int = 100,
    time_mask_N: int = 1,
    time_mask_p: float = 1.0,
    *,
    mask_value: float | None = None,
) -> torch.Tensor:
    """SpecAugment masking of ``feats`` ``(T, n_mels)``; returns a new tensor, input unchanged.

    A port of fairseq's ``SpecAugmentTransform.__call__`` (LB policy defaults, no time warping)
    with every draw taken from ``generator``, so the result is a function of the generator state:

    * ``freq_mask_N`` times: width ``f ~ U[0, F)``, start ``f0 ~ U[0, n_mels - f)``; mask columns
      ``[f0, f0 + f)``.
    * ``time_mask_N`` times: width ``t ~ U[0, min(T, floor(p * T_len)))``, start
      ``t0 ~ U[0, T_len - t)``; mask rows ``[t0, t0 + t)``.

    The fill value: ``mask_value=None`` (the default, as fairseq's config for MuST-C, which sets
    none) uses the mean of the input features. fairseq applies SpecAugment after utterance CMVN,
    where that mean is ~0, so this equals zero-filling of normalised features up to rounding.
    As in fairseq, nothing is masked for ``T_len == 0`` or when ``n_mels < F``.
    """
    if feats.dim() != 2:
        raise ValueError(f"spec_augment expects a 2-D (T, n_mels) tensor, got shape {tuple(feats.shape)}")
    if freq_mask_N > 0 and freq_mask_F <= 0:
        raise ValueError(f"freq_mask_F ({freq_mask_F}) must be > 0 when freq_mask_N > 0")
    if time_mask_N > 0 and time_mask_T <= 0:
        raise ValueError(f"time_mask_T ({time_mask_T}) must be > 0 when time_mask_N > 0")
    n_frames, n_freqs = feats.shape
    out = feats.clone()
    if n_frames == 0 or n_freqs < freq_mask_F:
        return out
    fill = feats.mean() if mask_value is None else torch.tensor(mask_value, dtype=feats.dtype)
    for _ in range(freq_mask_N):
        f = _randint(0, freq_mask_F, generator)
        f0 = _randint(0, n_freqs - f, generator)
        if f != 0:
            out[:, f0 : f0 + f] = fill
    max_t = min(time_mask_T, math.floor(n_frames * time_mask_p))
    if max_t < 1:
        return out
    for _ in range(time_mask_N):
        t = _randint(0, max_t, generator)
        t0 = _randint(0, n_frames - t, generator)
        if t != 0:
            out[t0 : t0 + t, :] = fill
    return out
