"""Contribution matrices of a trained S2T Transformer encoder, read off the model's own modules.

:func:`lib.analysis.contributions.contributions` is a pure function of one layer's tensors; this
module supplies those tensors from a real model, without re-implementing any part of it:

* the encoder runs once per utterance (batch of 1, no padding, ``model.eval()``, ``no_grad``)
  through ``S2TTransformer.encode(..., need_weights=True)``, which returns per layer the residual
  stream ``x`` before the pre-LN (``EncoderOutput.layer_inputs``) and the post-softmax,
  pre-dropout attention weights ``A`` (``EncoderOutput.attn_weights``) of the very modules that
  trained (any registered attention variant, e.g. local attention, whose weights are dense
  (B, H, N, N));
* forward hooks on ``layer.self_attn_layer_norm`` and ``layer.self_attn`` capture, during that
  same pass, ``LN(x)`` and the attention module's output ``MHA(LN(x))``, so the block output
  ``x̂ = x + MHA(LN(x))`` that the contributions must add up to (Eq. 4) is the module's, not ours;
* LN weight/bias/eps, ``W_V, b_V`` (``self_attn.v_proj``) and ``W_O, b_O`` (``self_attn.out_proj``)
  are the modules' parameters, in ``torch.nn.Linear`` convention ((out, in) weights).

Entry points (a model comes from lib/model/checkpoint.py's ``load_model``): :func:`layer_tensors`
(all layers' tensors of one utterance), :func:`contribution_matrices` (C of every layer),
:func:`iter_contribution_matrices` (one layer at a time, for streaming), and
:func:`save_transparency_npz` (the raw tensors and C of one utterance as a plain ``.npz`` that
anyone can recompute C from with numpy; its ``README`` entry spells out the formula).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from lib.analysis.contributions import contribution_vectors, contributions
from lib.model.s2t_transformer import S2TTransformer

__all__ = [
    "LayerTensors",
    "NPZ_README",
    "UtteranceTensors",
    "check_identity",
    "contribution_matrices",
    "iter_contribution_matrices",
    "layer_contributions",
    "layer_tensors",
    "save_transparency_npz",
]


@dataclass
class LayerTensors:
    """Everything Eq. 3-5 needs for one encoder layer and one utterance (no batch dimension).

    ``x``: (N, d) layer input; ``ln_x``: (N, d) ``self_attn_layer_norm(x)`` as the module computed it;
    ``attn``: (H, N, N) ``A[h, i, j]`` (query i, key j); ``attn_out``: (N, d) the attention module's
    output ``MHA(LN(x))`` (so the block output is ``x + attn_out``); LN and projection parameters as
    stored in the modules (``nn.Linear`` convention). All tensors are detached CPU copies.
    """

    x: Tensor
    ln_x: Tensor
    attn: Tensor
    attn_out: Tensor
    ln_weight: Tensor
    ln_bias: Tensor
    ln_eps: float
    v_weight: Tensor
    v_bias: Tensor | None
    out_weight: Tensor
    out_bias: Tensor | None

    @property
    def block_out(self) -> Tensor:
        """The module's attention-block output ``x + MHA(LN(x))`` (N, d)."""
        return self.x + self.attn_out

    def args(self) -> tuple:
        """Positional arguments of :func:`lib.analysis.contributions.contributions`."""
        return (self.x, self.attn, self.ln_weight, self.ln_bias, self.ln_eps, self.v_weight, self.v_bias,
                self.out_weight, self.out_bias)


@dataclass
class UtteranceTensors:
    """One utterance's encoder pass: ``feats`` (T, n_mels) as fed to the model, N = encoder length."""

    feats: Tensor
    layers: list[LayerTensors]

    @property
    def n_tokens(self) -> int:
        return int(self.layers[0].x.shape[0]) if self.layers else 0


def _check_standard_attention(model: S2TTransformer) -> None:
    for li, layer in enumerate(model.encoder.layers):
        sa = layer.self_attn
        d = sa.d_model
        if sa.v_proj.weight.shape != (d, d) or sa.out_proj.weight.shape != (d, d):
            raise ValueError(
                f"encoder layer {li + 1} ({type(sa).__name__}): v_proj {tuple(sa.v_proj.weight.shape)} / out_proj "
                f"{tuple(sa.out_proj.weight.shape)} are not (d, d) = ({d}, {d}); Eq. 3 needs H heads of width d/H")


@torch.no_grad()
def layer_tensors(model: S2TTransformer, feats: Tensor, *, task: Tensor | None = None,
                  layers: Sequence[int] | None = None) -> UtteranceTensors:
    """Run the encoder on one utterance (``feats`` (T, n_mels), already CMVN'd as in training) and
    collect every layer's :class:`LayerTensors` (0-based ``layers``, default all).

    The model is switched to eval mode (dropout off, so the weights returned pre-dropout are the ones
    used) and restored afterwards. Batch of one, no padding: the weights' rows sum to 1."""
    if feats.dim() != 2:
        raise ValueError(f"feats must be (T, n_mels), got shape {tuple(feats.shape)}")
    _check_standard_attention(model)
    enc_layers = model.encoder.layers
    wanted = list(range(len(enc_layers))) if layers is None else [int(li) for li in layers]
    for li in wanted:
        if not 0 <= li < len(enc_layers):
            raise ValueError(f"layer index {li} out of range for {len(enc_layers)} encoder layers")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    captured: dict[tuple[int, str], Tensor] = {}
    handles = []
    for li in wanted:
        layer = enc_layers[li]
        handles.append(layer.self_attn_layer_norm.register_forward_hook(
            lambda _m, _i, out, li=li: captured.__setitem__((li, "ln_x"), out.detach())))
        handles.append(layer.self_attn.register_forward_hook(
            lambda _m, _i, out, li=li: captured.__setitem__((li, "attn_out"), out.out.detach())))
    try:
        feats_b = feats.to(device=device, dtype=torch.float32)[None]
        lengths = torch.tensor([feats.shape[0]], device=device)
        enc = model.encode(feats_b, lengths, task=task, need_weights=True)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    n = int(enc.lengths[0])
    out = []
    for li in wanted:
        layer = enc_layers[li]
        ln, sa = layer.self_attn_layer_norm, layer.self_attn
        x = enc.layer_inputs[li][0, :n]
        attn = enc.attn_weights[li]
        if attn is None:
            raise RuntimeError(f"encoder layer {li + 1} returned no attention weights with need_weights=True")
        attn = attn[0, :, :n, :n]

        def cpu(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().to("cpu").clone()

        out.append(LayerTensors(
            x=cpu(x), ln_x=cpu(captured[(li, "ln_x")][0, :n]), attn=cpu(attn),
            attn_out=cpu(captured[(li, "attn_out")][0, :n]),
            ln_weight=cpu(ln.weight), ln_bias=cpu(ln.bias), ln_eps=float(ln.eps),
            v_weight=cpu(sa.v_proj.weight), v_bias=cpu(sa.v_proj.bias),
            out_weight=cpu(sa.out_proj.weight), out_bias=cpu(sa.out_proj.bias),
        ))
    return UtteranceTensors(feats=feats.detach().to("cpu"), layers=out)


def layer_contributions(t: LayerTensors, *, value_bias: str = "bias", residual: bool = True,
                        normalize: bool = True) -> Tensor:
    """C (N, N) float64 of one layer (:func:`lib.analysis.contributions.contributions`)."""
    return contributions(*t.args(), value_bias=value_bias, residual=residual, normalize=normalize)


def iter_contribution_matrices(model: S2TTransformer, feats: Tensor, *, value_bias: str = "bias",
                               residual: bool = True, normalize: bool = True,
                               layers: Sequence[int] | None = None) -> Iterator[Tensor]:
    """C of each requested layer in turn (one encoder pass); each layer's tensors are dropped once
    its C is yielded, so a consumer that keeps only summaries holds one (N, N) matrix at a time
    (plus the encoder's per-layer weights of this one utterance)."""
    ut = layer_tensors(model, feats, layers=layers)
    tensors = ut.layers
    ut.layers = []
    while tensors:
        t = tensors.pop(0)
        yield layer_contributions(t, value_bias=value_bias, residual=residual, normalize=normalize)
        del t


def contribution_matrices(model: S2TTransformer, feats: Tensor, **kwargs) -> list[Tensor]:
    """C (N, N) float64 of every encoder layer (or ``layers=[...]``) for one utterance."""
    return list(iter_contribution_matrices(model, feats, **kwargs))


def check_identity(t: LayerTensors, *, value_bias: str = "bias", residual: bool = True) -> float:
    """Max |Σ_j F_i(x_j) + b − x̂_i| against the module's own block output (small N only: builds
    the (N, N, d) tensor). With ``residual=False`` x is added separately."""
    fv, b = contribution_vectors(*t.args(), value_bias=value_bias, residual=residual)
    total = fv.sum(1) + b
    if not residual:
        total = total + t.x.double()
    return float((total - t.block_out.double()).abs().max())


NPZ_README = """\
Contribution matrices of one utterance, all encoder layers (Alastruey et al. 2022, Eq. 3-5;
Kobayashi et al. 2021), with every tensor needed to recompute them. Arrays, l = layer (0-based):
  feats (T, n_mels)     encoder input features (utterance-CMVN'd log-mel fbank)
  x (L, N, d)           layer input: residual stream before the pre-attention LayerNorm
  ln_x (L, N, d)        LN(x) as computed by the model's LayerNorm module
  attn (L, H, N, N)     A[l, h, i, j]: post-softmax attention of head h, query i, key j
  attn_out (L, N, d)    the attention module's output MHA(LN(x)); block output = x + attn_out
  ln_weight, ln_bias (L, d), ln_eps (L,)       LN(x) = (x - mean) / sqrt(var + eps) * w + b
                                               (mean/var over the last axis, biased variance)
  v_weight (L, d, d), v_bias (L, d)            value projection, v = LN(x) @ v_weight.T + v_bias
  out_weight (L, d, d), out_bias (L, d)        output projection, y = ctx @ out_weight.T + out_bias
  C (L, N, N)           contribution matrix (float64)
  meta                  JSON: id, model, value_bias, residual, normalize, n_heads, ...
Head h owns features h*dh:(h+1)*dh of v (dh = d/H): W_V^h = v_weight[h*dh:(h+1)*dh].T,
W_O^h = out_weight[:, h*dh:(h+1)*dh].T.
  F_i(x_j) = sum_h A[h,i,j] * (LN(x_j) W_V^h [+ v_bias^h if value_bias == "token"]) W_O^h
             (+ x_i when j == i and residual)
  C[i, j]  = ||F_i(x_j)||_2, divided by sum_j C[i, j] when normalize.
  Check:  sum_j F_i(x_j) + b == x_i + attn_out_i, b = out_bias (+ out_weight @ v_bias if "bias").
"""


def save_transparency_npz(path: str | Path, ut: UtteranceTensors, matrices: Sequence[Tensor], meta: dict) -> Path:
    """Write one utterance's raw tensors and its C matrices (all layers of ``ut``) to ``path``
    (``np.savez``, written to a temporary name and renamed). See :data:`NPZ_README`."""
    path = Path(path)
    if len(matrices) != len(ut.layers):
        raise ValueError(f"{len(matrices)} matrices for {len(ut.layers)} layers")

    def stack(name: str) -> np.ndarray:
        vals = [getattr(t, name) for t in ut.layers]
        if any(v is None for v in vals):
            d = ut.layers[0].x.shape[1]
            vals = [torch.zeros(d) if v is None else v for v in vals]
        return torch.stack([v.detach().cpu() for v in vals]).numpy()

    arrays = {name: stack(name) for name in ("x", "ln_x", "attn", "attn_out", "ln_weight", "ln_bias", "v_weight",
                                             "v_bias", "out_weight", "out_bias")}
    arrays["ln_eps"] = np.array([t.ln_eps for t in ut.layers], dtype=np.float64)
    arrays["C"] = torch.stack([c.detach().cpu().to(torch.float64) for c in matrices]).numpy()
    arrays["feats"] = ut.feats.detach().cpu().numpy()
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    arrays["README"] = np.array(NPZ_README)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    tmp.replace(path)
    return path
