"""The ``smoothing`` section of params.yaml: attention smoothing with priors
(Maekaku et al.; docs/variants.md), an opt-in variant.

Importing this module registers the section (``register_variant_section`` at the end; why a variant's section
lives outside load_params: lib/params/__init__.py). Importers: train_asr_smoothing, train_smoothing, the
report and scripts/repro.py."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from lib.params.base import PAIR_PATTERN, ParamError, model_config_of, register_variant_section



SMOOTHING_SYSTEM_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _default_smoothing_defs() -> dict[str, dict[str, Any]]:
    """The paper's systems (docs/variants.md): γ = 0.1, k = 13 (reading A7: the paper gives no values)."""
    return {
        "relaxed_enc": {"prior": "uniform", "gamma": 0.1, "train_only": True, "where": ["encoder"]},
        "relaxed_cross": {"prior": "uniform", "gamma": 0.1, "train_only": True, "where": ["cross"]},
        "band": {"prior": "band", "gamma": 0.1, "k": 13, "where": ["encoder"]},
        "prev": {"prior": "prev", "recursive": False, "gamma": 0.1, "where": ["encoder"]},
        "rec": {"prior": "prev", "recursive": True, "gamma": 0.1, "where": ["encoder"]},
        "rec_all": {"prior": "prev", "recursive": True, "gamma": 0.1, "where": ["encoder", "decoder_self", "cross"]},
        "rec_pred_all": {"prior": "prev", "recursive": True, "gamma": "predicted",
                         "where": ["encoder", "decoder_self", "cross"]},
    }


@dataclass(frozen=True)
class SmoothingParams:
    """``smoothing``: attention smoothing with priors (Maekaku et al.; docs/variants.md), opt-in.

    ``systems`` names entries of ``defs`` to train (stage train_smoothing, one run per system x pair x
    seed, same ASR model and ``train_st`` hyperparameters as the baseline of the same seed); [] (the
    default) creates no stage at all. ``asr_systems``: systems whose ASR model is also pretrained
    with the same smoothing (stage train_asr_smoothing); the others start from runs/asr/<pair>.
    ``defs``: name -> smoothing definition (keys of :data:`lib.model.spec.SMOOTHING_KEYS`), checked
    here against the model's depth, so a bad definition stops before any training.

    ``variant_lr``: the peak lr of the priors' own parameters (band logits, the predicted gate's vector
    and bias), in an optimizer group of their own (``TrainConfig.variant_lr``, lib.train.loop.make_optimizer):
    not under ``train_st.encoder_lr_scale`` (meant for the pretrained encoder, not for parameters that
    start from their initialisation) and without weight decay. Default 0.025: under Adam a parameter
    moves at most about Σ_t lr_t over a run, which is 204 × the peak lr on the ST schedule (360 updates,
    warm-up 60, inverse_sqrt) -- 0.06 at the encoder's 0.2 × 1.5e-3, too little to move the gate's
    bias from logit(0.1) = -2.2 to logit(0.5) = 0 or a band logit of ln 100 = 4.6 (a gate that moved
    at most 0.18). 0.025 gives a cap of 5.1 logit units: either can move when the gradient keeps its
    sign, while gradient noise alone moves a logit by about the peak lr × sqrt(Σ_t (lr_t / lr)²) =
    0.025 × 11.3 = 0.28 (the random walk of Adam's normalised steps)."""

    systems: list[str] = field(default_factory=list)
    pairs: list[str] = field(default_factory=lambda: ["en-de"])
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    asr_systems: list[str] = field(default_factory=list)
    defs: dict[str, dict[str, Any]] = field(default_factory=_default_smoothing_defs)
    variant_lr: float = 0.025

    def validate(self, prefix: str) -> None:
        if not self.variant_lr > 0:
            raise ParamError(f"{prefix}.variant_lr: must be > 0, got {self.variant_lr}")
        for name in self.defs:
            if not SMOOTHING_SYSTEM_NAME.match(name):
                raise ParamError(f"{prefix}.defs.{name}: a system name must be lower-case letters, digits and "
                                 f"'_' (it names folders and metrics keys)")
        for key in ("systems", "asr_systems"):
            values = getattr(self, key)
            for i, name in enumerate(values):
                if name not in self.defs:
                    raise ParamError(f"{prefix}.{key}[{i}]: unknown system {name!r}; defined in "
                                     f"{prefix}.defs: {sorted(self.defs)}")
            if len(set(values)) != len(values):
                raise ParamError(f"{prefix}.{key}: duplicates in {values}")
        for i, name in enumerate(self.asr_systems):
            if name not in self.systems:
                raise ParamError(f"{prefix}.asr_systems[{i}]: {name!r} is not in {prefix}.systems {self.systems} "
                                 f"(its smoothed ASR model would train for nothing)")
        for i, pair in enumerate(self.pairs):
            if not PAIR_PATTERN.match(pair):
                raise ParamError(f"{prefix}.pairs[{i}]: expected a pair like 'en-de', got {pair!r}")
        if len(set(self.pairs)) != len(self.pairs) or len(set(self.seeds)) != len(self.seeds):
            raise ParamError(f"{prefix}: duplicates in pairs {self.pairs} or seeds {self.seeds}")

    def check_defs(self, encoder_layers: int, decoder_layers: int, prefix: str = "smoothing") -> None:
        """Every definition against the model's depth (ValueError -> ParamError naming the key)."""
        from lib.model.spec import smoothing_model_specs

        for name, sdef in self.defs.items():
            try:
                smoothing_model_specs([{"type": "full"}] * encoder_layers, sdef, decoder_layers,
                                      key=f"{prefix}.defs.{name}")
            except ValueError as e:
                raise ParamError(str(e)) from None


def check_smoothing(p, s: SmoothingParams) -> None:
    """``smoothing`` against the rest of the params (``p``, a :class:`lib.params.Params`): its pairs and seeds
    among the pipeline's (checked only when a system runs: ``-S seeds=[1]`` must not trip over an unused
    opt-in section), and every definition against the model's depth."""
    for i, pair in enumerate(s.pairs if s.systems else []):
        if pair not in p.pairs:
            raise ParamError(f"smoothing.pairs[{i}]: {pair!r} is not in pairs {p.pairs} (its baseline is "
                             f"the comparison)")
    for i, seed in enumerate(s.seeds if s.systems else []):
        if seed not in p.seeds:
            raise ParamError(f"smoothing.seeds[{i}]: {seed} is not in seeds {p.seeds} (the baseline of the "
                             f"same seed is the comparison)")
    cfg = model_config_of(p)
    if cfg is not None:
        s.check_defs(cfg.encoder_layers, cfg.decoder_layers)


register_variant_section("smoothing", SmoothingParams, check_smoothing)
