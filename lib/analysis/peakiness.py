"""How peaky the encoder self-attention is: the effect Maekaku et al. describe for smoothing (its Fig. 3, Q6:
vanilla self-attention is sharply concentrated on the diagonal; recursive smoothing makes it less so).

Per encoder layer, over the valid query rows of the first ``n`` sentences of a split (one sentence at a
time: no padding), in eval mode, on the *effective* weights A' that multiplied the values (what
``S2TTransformer.encode(..., need_weights=True)`` returns):

    diag     mean_i A'[h, i, i]                         (averaged over heads and rows)
    entropy  mean_i -sum_j A'[h, i, j] log A'[h, i, j]  (nats; 0 log 0 = 0)

plus, for smoothing modules, what they learned: ``band_logits`` per layer, and the predicted
coefficient g = σ(q · c) per layer (mean and std over heads, rows and sentences).

Baseline and smoothed models are measured on the same sentences by the same code, so the two rows
of the report differ in the model only. Training-only relaxed attention is the plain attention at
eval, so its rows measure what the relaxed training left in the raw weights.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor

__all__ = ["PEAKINESS_SENTENCES", "attention_peakiness", "layer_means", "row_entropy"]

PEAKINESS_SENTENCES = 100  # the first 100 tst-COMMON sentences (docs/variants.md), as Fig. 3's 100 samples


def row_entropy(attn: Tensor) -> Tensor:
    """-Σ_j A[..., j] log A[..., j] per row (0 log 0 = 0): (..., N, N) -> (..., N)."""
    a = attn.clamp_min(0)
    return -(torch.where(a > 0, a * torch.log(a), torch.zeros_like(a))).sum(-1)


@torch.no_grad()
def attention_peakiness(model: torch.nn.Module, dataset: Any, n: int,
                        device: torch.device | str = "cpu") -> dict[str, Any]:
    """Per-layer mean diagonal weight and row entropy of the encoder self-attention on the first
    ``n`` sentences of ``dataset`` (``features(i)`` -> (T, n_mels)), plus the smoothing modules' learned
    band logits and predicted-g statistics. Lists are indexed by layer (layer 1 first); layers
    without a band / gate get None. The model's training mode is restored afterwards."""
    count = min(n, len(dataset))
    if count < 1:
        raise ValueError("attention_peakiness: the dataset has no sentences")
    layers = model.encoder.layers
    L = len(layers)
    diag_sum, ent_sum, rows = [0.0] * L, [0.0] * L, [0] * L
    uniform_ent, uniform_rows = 0.0, 0  # Σ m log m: the entropy of uniform attention, for scale
    gates: list[list[Tensor]] = [[] for _ in range(L)]
    patched = []
    for li, layer in enumerate(layers):
        sa = layer.self_attn
        if getattr(sa, "gate_vector", None) is not None:
            original = sa.gate

            def recording_gate(q: Tensor, original=original, li=li) -> Tensor:
                g = original(q)
                gates[li].append(g.detach().flatten().float().cpu())
                return g

            sa.gate = recording_gate  # instance attribute: shadows the method for this pass only
            patched.append(sa)
    was_training = model.training
    model.eval()
    try:
        for i in range(count):
            feats = dataset.features(i).to(device=device, dtype=torch.float32)[None]
            enc = model.encode(feats, torch.tensor([feats.shape[1]], device=device), need_weights=True)
            m = int(enc.lengths[0])
            uniform_ent, uniform_rows = uniform_ent + m * math.log(m), uniform_rows + m
            for li, w in enumerate(enc.attn_weights):
                a = w[0, :, :m, :m].double()  # (H, m, m)
                diag_sum[li] += float(torch.diagonal(a, dim1=-2, dim2=-1).mean(0).sum())
                ent_sum[li] += float(row_entropy(a).mean(0).sum())
                rows[li] += m
    finally:
        for sa in patched:
            del sa.gate
        model.train(was_training)

    def band(sa: Any) -> list[float] | list[list[float]] | None:
        b = getattr(sa, "band_logits", None)
        return None if b is None else [_r(x) for x in b.detach().cpu().tolist()] if b.dim() == 1 else \
            [[_r(x) for x in row] for row in b.detach().cpu().tolist()]

    gate_mean = [None if not g else _r(float(torch.cat(g).mean())) for g in gates]
    gate_std = [None if not g else _r(float(torch.cat(g).std(unbiased=False))) for g in gates]
    return {
        "sentences": count,
        "attn_diag": [_r(d / r) for d, r in zip(diag_sum, rows)],
        "attn_entropy": [_r(e / r) for e, r in zip(ent_sum, rows)],
        "uniform_entropy": _r(uniform_ent / uniform_rows),
        "band_logits": [band(layer.self_attn) for layer in layers],
        "gate_mean": gate_mean,
        "gate_std": gate_std,
    }


def _r(v: float, nd: int = 5) -> float:
    return round(float(v), nd)


def layer_means(values: Sequence[float | None], layers: Sequence[int]) -> float | None:
    """Mean of ``values`` over the 1-based ``layers`` (None when none has a value)."""
    picked = [values[li - 1] for li in layers if 0 < li <= len(values) and values[li - 1] is not None]
    return sum(picked) / len(picked) if picked else None
