"""Fast CPU dropout (lib/model/dropout.py): F.dropout's semantics, seeded by torch's RNG."""
from __future__ import annotations

import pytest
import torch

from lib.model.dropout import Dropout, dropout, keep_mask, scaled_keep_mask


def test_keep_probability_and_scale_are_exact_in_expectation():
    keep, scale = keep_mask((1000, 1000), 0.1, seed=3)
    rate = keep.float().mean().item()
    assert rate == pytest.approx(0.9, abs=2e-3)  # 1e6 draws: std 3e-4
    assert scale == pytest.approx(65536 / (65536 - round(0.1 * 65536)))
    assert scale * (65536 - round(0.1 * 65536)) / 65536 == pytest.approx(1.0)


def test_same_torch_seed_same_mask_and_fresh_masks_per_call():
    x = torch.ones(64, 32)
    torch.manual_seed(5)
    a, b = dropout(x, 0.3, True), dropout(x, 0.3, True)
    torch.manual_seed(5)
    a2 = dropout(x, 0.3, True)
    assert torch.equal(a, a2) and not torch.equal(a, b)
    kept = a[a != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 65536 / (65536 - round(0.3 * 65536))))


def test_eval_and_zero_probability_are_identity_and_gradients_flow():
    x = torch.randn(8, 8, requires_grad=True)
    m = Dropout(0.5).eval()
    assert m(x) is x and dropout(x, 0.0, True) is x
    torch.manual_seed(0)
    y = Dropout(0.5).train()(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() * 2.0)  # p = 0.5: scale 65536 / 32768
    with pytest.raises(ValueError):
        Dropout(1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_numpy_built_mask_is_bit_identical_to_the_bool_mask_times_scale(dtype, p):
    """The fast mask equals ``keep.to(dtype) * scale`` (the torch version's mask) bit for bit, so
    dropout's output and gradients are unchanged by how the mask is built."""
    shape = (7, 5, 33)  # odd sizes: the last uint64 of random bits is only partly used
    keep, scale = keep_mask(shape, p, seed=11)
    fast = scaled_keep_mask(shape, p, seed=11, dtype=dtype)
    assert fast.dtype == dtype and fast.shape == shape
    assert torch.equal(fast.view(-1).view(torch.uint8), (keep.to(dtype) * scale).view(-1).view(torch.uint8))
    assert (fast != 0).sum() == keep.sum() > 0
