"""The ``model.pt`` format and everything that moves weights between models: its one owner.

A model file is ``{"model": state_dict, "model_config": ModelConfig.to_dict(), **meta}`` (meta: the
task, the pair, scores, provenance; whatever the writer adds). :func:`save_model` writes one,
:func:`load_model` rebuilds the model from the config it carries (nanoGPT's rule: the checkpoint holds
its model args, one function rebuilds it), :func:`read_model_state` reads one without building it.
Weight surgery lives here too: :func:`load_encoder` (ST from an ASR model, with head expansion for head
selection) and :func:`load_decoder_layers`.

:func:`save` and :func:`load` are the file-level primitives every checkpoint in the project goes
through: atomic writes (a kill never leaves a truncated file) and ``torch.load(weights_only=True)``.
Training state (``last.pt``, snapshots, averaging, fingerprints) is lib/train/checkpoint.py's.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lib.io import InputError, atomic_write_bytes
from lib.model.attention.base import renamed_parameter_key
from lib.model.s2t_transformer import ModelConfig, S2TTransformer


def save(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """``torch.save`` to a temporary file, then rename: a kill never leaves a truncated checkpoint."""
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())


class CheckpointError(InputError, RuntimeError):
    """A checkpoint file that torch cannot load (truncated, corrupt). An :class:`lib.io.InputError`, so a
    stage prints it as one line, and a RuntimeError, as torch's own load errors are."""


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu", *,
         producer: str | None = None) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (no arbitrary code from pickles). An unreadable
    file raises :class:`CheckpointError` naming it and (``producer``) the stage to rerun."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - re-raised with the file named
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        # a plain `dvc repro` sees the damaged output and writes it again (from the run-cache, or by
        # rerunning that stage); `-f` would also force every stage upstream of it
        remedy = f"; it is written by the {producer} stage: `dvc repro` writes it again" if producer else ""
        raise CheckpointError(f"{path}: cannot load checkpoint ({reason}){remedy}") from e


def build_model(model_config: ModelConfig | dict[str, Any]) -> S2TTransformer:
    """A freshly initialised model of ``model_config`` (a ``ModelConfig`` or its ``to_dict()``)."""
    cfg = model_config if isinstance(model_config, ModelConfig) else ModelConfig.from_dict(model_config)
    return S2TTransformer(cfg)


def save_model(path: str | os.PathLike, model: nn.Module | dict[str, Tensor], model_config: ModelConfig,
               **meta: Any) -> None:
    """Write a model file: ``model``'s weights (a module or a state dict), its config, ``meta``."""
    weights = model.state_dict() if isinstance(model, nn.Module) else model
    save(path, {"model": weights, "model_config": model_config.to_dict(), **meta})


def read_model_state(path: str | os.PathLike, *, producer: str | None = None,
                     map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A model file's dict, checked to be one. A missing file raises FileNotFoundError naming the file
    and, when given, the stage that produces it (``producer``, e.g. ``"train_asr"``)."""
    path = Path(path)
    if not path.is_file():
        hint = f" (produced by the `{producer}` stage: run `dvc repro {producer}` first)" if producer else ""
        raise FileNotFoundError(f"{path}: model checkpoint not found{hint}")
    state = load(path, map_location=map_location, producer=producer)
    remedy = f"; it is written by the {producer} stage: `dvc repro` writes it again" if producer else ""
    if not isinstance(state, dict):
        raise InputError(f"{path}: not a model checkpoint (a {type(state).__name__}, not a mapping){remedy}")
    for key in ("model", "model_config"):
        if not isinstance(state.get(key), dict):
            what = state.get("unused") or f"no {key!r} entry; keys: {sorted(map(str, state))}"
            raise InputError(f"{path}: not a model checkpoint ({what}){remedy}")
    return state


def load_model(path: str | os.PathLike, *, producer: str | None = None, device: str | torch.device = "cpu"
               ) -> tuple[S2TTransformer, dict]:
    """Rebuild the model of a model file, in eval mode on ``device``. Returns ``(model, meta)``: meta is
    the file's other entries plus ``model_config`` (as a dict). Errors as :func:`read_model_state`, and
    :class:`lib.io.InputError` naming the file when its config or weights do not build one model (a
    file edited by hand, or written by another version of the code)."""
    state = read_model_state(path, producer=producer)
    try:  # built and loaded on the CPU (as model_from_state does before moving it): an error here is the file's
        model, meta = model_from_state(state, device="cpu")
    except (RuntimeError, TypeError, ValueError, KeyError) as e:
        reason = " ".join(str(e).split())[:300] or type(e).__name__
        remedy = f"; it is written by the {producer} stage: `dvc repro` writes it again" if producer else ""
        raise InputError(f"{path}: its weights and config do not build a model ({type(e).__name__}: "
                         f"{reason}){remedy}") from e
    return model.to(device).eval(), meta


def model_from_state(state: dict[str, Any], *, device: str | torch.device = "cpu") -> tuple[S2TTransformer, dict]:
    """:func:`load_model` on a model file's dict already read (:func:`read_model_state` or :func:`load`)."""
    cfg = ModelConfig.from_dict(state["model_config"])
    model = S2TTransformer(cfg)
    model.load_state_dict(state["model"])
    model.to(device).eval()
    meta = {k: v for k, v in state.items() if k not in ("model", "model_config")}
    meta["model_config"] = cfg.to_dict()
    return model, meta


def upgrade_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A model state dict with the keys of earlier versions of this code renamed to today's, for code
    that reads weights without ``load_state_dict`` (snapshot averaging, the weight surgery below; a
    module's ``load_state_dict`` upgrades them itself), by the one rule of
    :func:`lib.model.attention.base.renamed_parameter_key`. A dict without such keys comes back as it is
    (the same object)."""
    renamed = {k: new for k in state_dict if (new := renamed_parameter_key(k)) is not None}
    if not renamed:
        return state_dict
    return {renamed.get(k, k): v for k, v in state_dict.items()}


def rebuilt_with(model: S2TTransformer, **config: Any) -> S2TTransformer:
    """A copy of ``model`` with ``config`` fields of its ModelConfig replaced (e.g. another
    ``encoder_attention``), the same weights, on the same device, in eval mode. The plain kinds (full,
    local, banded) have the same parameters, so a change between them loads the weights as they are;
    a change that adds or drops parameters (a variant's own) is refused by the strict load."""
    copy = build_model({**model.cfg.to_dict(), **config})
    copy.load_state_dict(model.state_dict())
    return copy.to(next(model.parameters()).device).eval()


# ----------------------------------------------------------------------------------------
# Weight surgery
# ----------------------------------------------------------------------------------------


@dataclass
class LoadReport:
    loaded: list[str]  # target keys that received a value
    skipped: list[str]  # source keys not loaded (CTC head / variant-specific attention params)
    missing: list[str]  # target keys left at their initialisation (same categories only)
    expanded: list[str] = field(default_factory=list)  # target keys filled by tiling H source heads into H' candidates



def load_encoder(model: S2TTransformer, state_dict: dict[str, Tensor], *, expand_candidate_heads: bool = False) -> LoadReport:
    """Initialise the encoder (subsampler + layers + final LN) from another checkpoint,
    e.g. ST from a pre-trained ASR model (the decoder stays randomly initialised).

    ``state_dict`` is a full ``S2TTransformer`` state dict (``encoder.*`` keys are used), a
    bare encoder state dict, or a checkpoint dict with a ``"model"`` entry. All core keys
    must match in name and shape (ValueError otherwise). Tolerated differences: the CTC head
    (loaded only if both have one of the same shape) and attention parameters specific to a
    variant (anything under ``.self_attn.`` other than q/k/v/out_proj, e.g. ``head_logits``).

    ``expand_candidate_heads`` (head selection, docs/variants.md): a target
    ``q/k/v_proj`` weight of shape (H' · dh, d) (bias (H' · dh,)) whose source has H · dh rows is
    filled by tiling, candidate row-block j <- source head (j mod H); ``out_proj`` loads
    unchanged. With strided groups every group then holds copies of one source head, so any
    group selection reproduces the source encoder exactly. Such keys are listed in
    ``LoadReport.expanded`` (and in ``loaded``).
    """
    if "model" in state_dict and isinstance(state_dict["model"], dict):
        state_dict = state_dict["model"]
    state_dict = upgrade_state_dict(state_dict)
    if any(k.startswith("encoder.") for k in state_dict):
        src = {k[len("encoder.") :]: v for k, v in state_dict.items() if k.startswith("encoder.")}
    else:
        src = dict(state_dict)
    target = model.encoder.state_dict()

    def optional(key: str) -> bool:
        if key.startswith("ctc_proj."):
            return True
        if ".self_attn." in key:
            return key.split(".self_attn.", 1)[1].split(".")[0] not in (
                "q_proj",
                "k_proj",
                "v_proj",
                "out_proj",
            )
        return False

    def expandable(key: str, val: Tensor) -> bool:
        """A q/k/v projection whose target has a whole multiple of the source's heads."""
        if not expand_candidate_heads or ".self_attn." not in key:
            return False
        if key.split(".self_attn.", 1)[1] not in {f"{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")}:
            return False
        tgt = target[key]
        return (tgt.dim() == val.dim() and tgt.shape[1:] == val.shape[1:] and val.shape[0] > 0
                and tgt.shape[0] > val.shape[0] and tgt.shape[0] % val.shape[0] == 0)

    to_load, skipped, expanded, errors = {}, [], [], []
    for key, val in src.items():
        if key in target and target[key].shape == val.shape:
            to_load[key] = val
        elif key in target and expandable(key, val):
            # rows are [head 0 | head 1 | ...] blocks of dh: repeating the whole matrix r times
            # puts source head (j mod H) into candidate j
            to_load[key] = val.repeat(target[key].shape[0] // val.shape[0], *([1] * (val.dim() - 1)))
            expanded.append(key)
        elif optional(key):
            skipped.append(key)
        elif key in target:
            errors.append(f"{key}: shape {tuple(val.shape)} vs {tuple(target[key].shape)}")
        else:
            errors.append(f"{key}: unexpected")
    missing = [k for k in target if k not in to_load]
    errors += [f"{k}: missing" for k in missing if not optional(k)]
    if errors:
        raise ValueError("encoder state dict does not match: " + "; ".join(errors))
    model.encoder.load_state_dict(to_load, strict=False)
    return LoadReport(loaded=sorted(to_load), skipped=sorted(skipped), missing=sorted(missing),
                      expanded=sorted(expanded))


def load_decoder_layers(model: S2TTransformer, state_dict: dict[str, Tensor], *,
                        expand_candidate_heads: bool = False) -> list[str]:
    """Initialise the decoder's layers and final LayerNorm from another model's (e.g. the ASR
    model's, whose decoder has learned to align with the encoder), leaving the token embedding
    and the output projection (vocabulary-specific) at their initialisation. A demo option
    (``train_st.init_decoder``), not in the paper. Returns the keys loaded; ValueError when the
    shapes differ. Parameters of decoder attention variants (anything under ``.self_attn.`` /
    ``.encoder_attn.`` other than q/k/v/out_proj, e.g. ``gate_vector``) may be absent from the
    source and keep their initialisation. ``expand_candidate_heads``: the q/k/v rows of selecting
    decoder self-attention layers are tiled from the source's H heads to the target's H' candidates,
    as :func:`load_encoder` does (:func:`_tiled_decoder_state`)."""
    if "model" in state_dict and isinstance(state_dict["model"], dict):
        state_dict = state_dict["model"]
    state_dict = upgrade_state_dict(state_dict)
    if expand_candidate_heads:
        state_dict = _tiled_decoder_state(model, state_dict)
    target = model.decoder.state_dict()
    wanted = [k for k in target if k.startswith(("layers.", "layer_norm."))]
    src = {k: state_dict[f"decoder.{k}"] for k in wanted if f"decoder.{k}" in state_dict}

    def optional(key: str) -> bool:
        for sub in (".self_attn.", ".encoder_attn."):
            if sub in key:
                return key.split(sub, 1)[1].split(".")[0] not in ("q_proj", "k_proj", "v_proj", "out_proj")
        return False

    errors = [f"{k}: missing" for k in wanted if k not in src and not optional(k)]
    errors += [f"{k}: shape {tuple(v.shape)} vs {tuple(target[k].shape)}" for k, v in src.items()
               if v.shape != target[k].shape]
    if errors:
        raise ValueError("decoder state dict does not match: " + "; ".join(errors))
    model.decoder.load_state_dict(src, strict=False)
    return sorted(src)


def _tiled_decoder_state(model: S2TTransformer, source: dict[str, Tensor]) -> dict[str, Tensor]:
    """The source's decoder entries with the q/k/v rows of selecting decoder self-attention layers
    tiled to the target's H' candidate heads (candidate j <- source head j mod H), as the encoder's
    ``expand_candidate_heads`` does."""
    target = model.state_dict()
    out = dict(source)
    for key, val in source.items():
        if not key.startswith("decoder.") or ".self_attn." not in key or key not in target:
            continue
        tgt = target[key]
        if (tgt.shape != val.shape and tgt.dim() == val.dim() and tgt.shape[1:] == val.shape[1:]
                and tgt.shape[0] % val.shape[0] == 0):
            out[key] = val.repeat(tgt.shape[0] // val.shape[0], *([1] * (val.dim() - 1)))
    return out
