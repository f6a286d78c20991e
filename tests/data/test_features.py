"""fbank / CMVN / SpecAugment."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchaudio.compliance.kaldi as kaldi

from lib.data.features import fbank, num_frames, spec_augment, utterance_cmvn


@pytest.fixture
def wave(audio_factory) -> np.ndarray:
    return audio_factory(1.37, seed=3)


def test_fbank_shape_and_num_frames(wave: np.ndarray) -> None:
    f = fbank(wave)
    assert f.dtype == np.float32 and f.shape == (num_frames(len(wave)), 80)
    assert np.isfinite(f).all()
    assert fbank(wave, n_mels=40).shape == (num_frames(len(wave)), 40)


@pytest.mark.parametrize("n", [400, 401, 559, 560, 561, 16000, 16001, 23456])
def test_num_frames_matches_fbank(n: int, audio_factory) -> None:
    w = audio_factory(n / 16000, seed=n)[:n]
    assert len(w) == n
    assert fbank(w).shape[0] == num_frames(n) == 1 + (n - 400) // 160


@pytest.mark.parametrize("n", [0, 1, 399])
def test_shorter_than_a_window(n: int) -> None:
    assert num_frames(n) == 0
    assert fbank(np.zeros(n, dtype=np.float32)).shape == (0, 80)


def test_fbank_deterministic(wave: np.ndarray) -> None:
    np.testing.assert_array_equal(fbank(wave), fbank(wave.copy()))


def test_fbank_equals_fairseq_recipe(wave: np.ndarray) -> None:
    # fairseq's extract_fbank_features: waveform * (1 << 15), kaldi.fbank(..., num_mel_bins, sample_frequency)
    ref = kaldi.fbank(torch.from_numpy(wave * (1 << 15))[None], num_mel_bins=80, sample_frequency=16000).numpy()
    np.testing.assert_array_equal(fbank(wave), ref)


def test_fbank_rejects_multichannel(wave: np.ndarray) -> None:
    with pytest.raises(ValueError):
        fbank(np.stack([wave, wave], axis=1))


def test_cmvn_numpy_and_torch(wave: np.ndarray) -> None:
    f = fbank(wave)
    out = utterance_cmvn(f)
    assert isinstance(out, np.ndarray) and out.shape == f.shape and out.dtype == np.float32
    np.testing.assert_allclose(out.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.std(axis=0), 1.0, atol=1e-3)
    t = utterance_cmvn(torch.from_numpy(f))
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), out, atol=1e-5)


def test_cmvn_constant_dimension_does_not_blow_up() -> None:
    x = np.ones((10, 3), dtype=np.float32)
    x[:, 1] = np.arange(10)
    out = utterance_cmvn(x)
    assert np.isfinite(out).all() and np.all(out[:, 0] == 0)
    assert utterance_cmvn(np.zeros((0, 3), dtype=np.float32)).shape == (0, 3)


def _masked(out: torch.Tensor, fill: float) -> tuple[np.ndarray, np.ndarray]:
    eq = (out == fill).numpy()
    return np.where(eq.all(axis=0))[0], np.where(eq.all(axis=1))[0]


def _expected_masks(gen: torch.Generator, T: int, n_mels: int, F: int, Tm: int, p: float):
    f = int(torch.randint(0, F, (1,), generator=gen))
    f0 = int(torch.randint(0, n_mels - f, (1,), generator=gen))
    max_t = min(Tm, math.floor(T * p))
    t = int(torch.randint(0, max_t, (1,), generator=gen))
    t0 = int(torch.randint(0, T - t, (1,), generator=gen))
    return (f0, f), (t0, t)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("T,p", [(300, 1.0), (50, 1.0), (300, 0.2)])
def test_spec_augment_mask_extents(seed: int, T: int, p: float) -> None:
    x = torch.randn(T, 80, generator=torch.Generator().manual_seed(100 + seed))
    fill = float(x.mean())
    out = spec_augment(x, torch.Generator().manual_seed(seed), time_mask_p=p)
    (f0, f), (t0, t) = _expected_masks(torch.Generator().manual_seed(seed), T, 80, 27, 100, p)
    cols, rows = _masked(out, fill)
    assert list(cols) == list(range(f0, f0 + f))
    assert list(rows) == list(range(t0, t0 + t))
    assert f <= 26 and t <= min(99, math.floor(T * p) - 1)
    # everything outside the masks is untouched
    keep = torch.ones(T, 80, dtype=torch.bool)
    keep[:, f0 : f0 + f] = False
    keep[t0 : t0 + t, :] = False
    assert torch.equal(out[keep], x[keep])


def test_spec_augment_deterministic_and_pure() -> None:
    x = torch.randn(200, 80)
    x0 = x.clone()
    a = spec_augment(x, torch.Generator().manual_seed(7))
    b = spec_augment(x, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and torch.equal(x, x0)
    gen = torch.Generator().manual_seed(7)
    outs = [spec_augment(x, gen) for _ in range(5)]
    assert any(not torch.equal(outs[0], o) for o in outs[1:])  # the generator advances


def test_spec_augment_widths_bounded_over_many_draws() -> None:
    x = torch.arange(120 * 80, dtype=torch.float32).reshape(120, 80) + 1.0
    gen = torch.Generator().manual_seed(0)
    max_f = max_t = 0
    for _ in range(300):
        out = spec_augment(x, gen, mask_value=0.0)
        cols, rows = _masked(out, 0.0)
        max_f, max_t = max(max_f, len(cols)), max(max_t, len(rows))
        for idx in (cols, rows):  # one contiguous block each
            assert len(idx) == 0 or idx[-1] - idx[0] + 1 == len(idx)
    assert max_f <= 26 and max_t <= 99 and max_f >= 20 and max_t >= 80


def test_spec_augment_edge_cases() -> None:
    gen = torch.Generator().manual_seed(0)
    assert spec_augment(torch.zeros(0, 80), gen).shape == (0, 80)
    small = torch.randn(10, 20)  # fewer bins than F: unchanged, as fairseq
    assert torch.equal(spec_augment(small, gen), small)
    tiny = torch.randn(1, 80)  # max time width floor(1 * p) = 1 -> t in [0, 1) -> no time mask
    out = spec_augment(tiny, gen, freq_mask_N=0)
    assert torch.equal(out, tiny)


@pytest.mark.parametrize("T, p", [(57, 0.1), (25, 0.1)])
def test_time_mask_cap_rounds_the_share_down(T: int, p: float) -> None:
    """The time mask's width is drawn from [0, floor(p * T)): 5.7 -> at most 4 rows, 2.5 -> at most 1."""
    x = torch.arange(T * 80, dtype=torch.float32).reshape(T, 80) + 1.0
    gen = torch.Generator().manual_seed(0)
    widths = set()
    for _ in range(300):
        _, rows = _masked(spec_augment(x, gen, freq_mask_N=0, time_mask_p=p, mask_value=0.0), 0.0)
        widths.add(len(rows))
    assert widths == set(range(math.floor(T * p)))


def test_frequency_mask_applies_when_the_bins_equal_f() -> None:
    """fairseq skips SpecAugment only for fewer bins than F: 27 bins with F = 27 are masked."""
    x = torch.arange(40 * 27, dtype=torch.float32).reshape(40, 27) + 1.0
    masked = []
    for seed in range(6):
        out = spec_augment(x, torch.Generator().manual_seed(seed), time_mask_N=0, mask_value=0.0)
        (f0, f), _ = _expected_masks(torch.Generator().manual_seed(seed), 40, 27, 27, 100, 1.0)
        cols, rows = _masked(out, 0.0)
        assert list(cols) == list(range(f0, f0 + f)) and len(rows) == 0
        masked.append(f)
    assert max(masked) > 0
