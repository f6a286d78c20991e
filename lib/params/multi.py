"""The ``multi`` section of params.yaml: the multilingual model and its head selection
(Gong et al.; docs/variants.md), an opt-in variant.

Importing this module registers the section (``register_variant_section`` at the end; why a variant's section
lives outside load_params: lib/params/__init__.py). Importers: prepare_multi, train_multi, the report and
scripts/repro.py."""
from __future__ import annotations

from dataclasses import dataclass, field

from lib.params.base import PAIR_PATTERN, ParamError, model_config_of, register_variant_section



MULTI_SYSTEMS = ("baseline", "subset", "group", "baseline_h8")
SELECTION_SYSTEMS = ("subset", "group")  # the multi.systems that select heads (multi.head_selection)
HEAD_SELECTION_SIDES = ("encoder_self", "decoder_self")


@dataclass(frozen=True)
class HeadSelectionParams:
    """``multi.head_selection`` (Gong et al.; docs/variants.md): H' candidate heads per layer of
    which each task (target language) selects the model's H (``model`` size's n_heads).

    ``estimator``: ``gumbel`` (default) = straight-through Gumbel-softmax whose backward pass compares
    every candidate with the selected one (within each group for ``group``, over all candidates for
    ``subset``), Gumbel noise scaled from ``noise_start`` to ``noise_end`` (geometric, over
    ``anneal_updates``) so that late training draws are the evaluated selection; ``paper`` = the paper's
    Gumbel-sigmoid straight-through (selected heads only, unit logistic noise; the noise keys are
    ignored). ``anneal_updates`` null: the run's length (``multi.max_updates``).

    ``variant_lr``: the peak lr of the selection logits, an optimizer group of their own outside
    ``train_st.encoder_lr_scale`` and weight decay (``TrainConfig.variant_lr``). Default 0.025: Adam
    moves a logit at most about Σ_t lr_t = 419 × the peak lr over 1080 updates (3 × 360, warm-up 60,
    inverse_sqrt), i.e. 0.63 at train_st's 1.5e-3 and 0.13 for the encoder's logits at 0.2 × that,
    against a median gap of 1.35 between the two members of a group at initialisation
    (|u1 - u2|, u ~ U(ln 0.01, 0)); 0.025 gives a cap of 10.5, several gaps for a gradient that keeps
    its sign, while gradient noise alone moves a logit by about 0.025 × sqrt(Σ_t (lr_t / lr)²) =
    0.025 × 13.9 = 0.35, a quarter of the median gap.

    ``subset_init_lead``: null keeps subset's aligned start (:func:`lib.model.attention.aligned_subset_logits_`),
    whose selected candidates lead the best unselected one by 1.8-6 logits (median 4.6 in the demo's
    runs), more than a run moves them; a number sets every task's selected candidates to exactly that
    lead over its best unselected candidate (:func:`lib.model.attention.set_subset_lead_`), so that the
    selection can change. The first evaluated selection is the aligned one either way."""

    candidates: int = 8  # H'
    apply_to: list[str] = field(default_factory=lambda: list(HEAD_SELECTION_SIDES))
    tau_start: float = 5.0  # temperature of the relaxation, annealed geometrically over anneal_updates
    tau_end: float = 5.0
    anneal_updates: int | None = None  # null: the run's length
    kl_weight: float | str = 0.0  # λ of the KL to the prior p(z=1) = H/H'; "elbo": the paper's Eq. 3 weight
    estimator: str = "gumbel"  # gumbel | paper
    noise_start: float = 1.0  # Gumbel noise scale (gumbel estimator), annealed to noise_end
    noise_end: float = 0.1
    variant_lr: float = 0.025
    subset_init_lead: float | None = None  # null: subset's aligned start as lib.model.attention builds it

    def validate(self, prefix: str) -> None:
        if self.candidates < 1:
            raise ParamError(f"{prefix}.candidates: must be >= 1, got {self.candidates}")
        bad = [s for s in self.apply_to if s not in HEAD_SELECTION_SIDES]
        if bad or not self.apply_to:
            raise ParamError(f"{prefix}.apply_to: expected a non-empty subset of {list(HEAD_SELECTION_SIDES)}, "
                             f"got {self.apply_to}")
        if not (self.tau_start > 0 and self.tau_end > 0):
            raise ParamError(f"{prefix}.tau_start / tau_end: must be > 0, got {self.tau_start} / {self.tau_end}")
        if self.anneal_updates is not None and self.anneal_updates < 1:
            raise ParamError(f"{prefix}.anneal_updates: must be >= 1 or null (the run's length), got {self.anneal_updates}")
        from lib.model.config import HEAD_SELECTION_ESTIMATORS

        if self.estimator not in HEAD_SELECTION_ESTIMATORS:
            raise ParamError(f"{prefix}.estimator: expected one of {list(HEAD_SELECTION_ESTIMATORS)}, got {self.estimator!r}")
        if not (self.noise_start >= 0 and self.noise_end >= 0) or self.noise_end > self.noise_start:
            raise ParamError(f"{prefix}.noise_start / noise_end: need 0 <= noise_end <= noise_start, got "
                             f"{self.noise_start} / {self.noise_end}")
        if not self.variant_lr > 0:
            raise ParamError(f"{prefix}.variant_lr: must be > 0, got {self.variant_lr}")
        if self.subset_init_lead is not None and not self.subset_init_lead > 0:
            raise ParamError(f"{prefix}.subset_init_lead: must be > 0 or null, got {self.subset_init_lead}")
        if isinstance(self.kl_weight, str) and self.kl_weight != "elbo":
            raise ParamError(f"{prefix}.kl_weight: a number >= 0 or 'elbo', got {self.kl_weight!r}")
        if not isinstance(self.kl_weight, str) and self.kl_weight < 0:
            raise ParamError(f"{prefix}.kl_weight: must be >= 0, got {self.kl_weight}")
        if self.kl_weight != 0 and self.estimator == "gumbel":
            # The KL is to the Bernoulli(σ(φ)) selection of the paper's estimator; under gumbel a head is
            # chosen by the gaps between its group's logits, which it does not measure: it would only pull
            # every logit towards 0, not regularise the selection (not the paper's Eq. 3 ELBO).
            raise ParamError(f"{prefix}.kl_weight: {self.kl_weight!r} needs estimator: paper (its Bernoulli "
                             f"selection is what the KL regularises); with estimator: gumbel set kl_weight: 0")


@dataclass(frozen=True)
class MultiParams:
    """``multi``: one multilingual ST model over all ``pairs`` (Gong et al.), opt-in.

    ``systems`` (default [] = no training stage): ``baseline`` (H heads, target-language tag only),
    ``subset`` / ``group`` (head selection, H of ``head_selection.candidates``), ``baseline_h8`` (twice
    the heads, no selection: the paper's H = 8 row). The joint vocabulary (stage prepare_multi) is
    always built: it is cheap. ``asr_init``: the pair whose ASR model (runs/asr/<pair>) initialises
    the encoder. ``max_updates``: the multilingual run's length, null (the default) = 3 ×
    ``train_st.max_updates`` (three languages' worth of the bilingual runs: :meth:`run_updates`); the
    other training settings are ``train_st``'s."""

    systems: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [1])
    vocab_size: int = 768
    asr_init: str = "en-de"
    max_updates: int | None = None
    head_selection: HeadSelectionParams = field(default_factory=HeadSelectionParams)

    #: multi.max_updates when null: this many times the bilingual run's train_st.max_updates.
    BILINGUAL_FACTOR = 3

    def run_updates(self, bilingual_updates: int) -> int:
        """The multilingual run's length: ``max_updates`` when set, else :attr:`BILINGUAL_FACTOR` ×
        ``bilingual_updates`` (``train_st.max_updates``)."""
        return self.max_updates if self.max_updates is not None else self.BILINGUAL_FACTOR * bilingual_updates

    def validate(self, prefix: str) -> None:
        for i, name in enumerate(self.systems):
            if name not in MULTI_SYSTEMS:
                raise ParamError(f"{prefix}.systems[{i}]: unknown system {name!r}; known: {list(MULTI_SYSTEMS)}")
        if len(set(self.systems)) != len(self.systems) or len(set(self.seeds)) != len(self.seeds):
            raise ParamError(f"{prefix}: duplicates in systems {self.systems} or seeds {self.seeds}")
        if not self.seeds:
            raise ParamError(f"{prefix}.seeds: empty; list at least one seed, e.g. [1]")
        if self.vocab_size < 8:
            raise ParamError(f"{prefix}.vocab_size: must be >= 8, got {self.vocab_size}")
        if not PAIR_PATTERN.match(self.asr_init):
            raise ParamError(f"{prefix}.asr_init: expected a pair like 'en-de', got {self.asr_init!r}")
        if self.max_updates is not None and self.max_updates < 1:
            raise ParamError(f"{prefix}.max_updates: must be >= 1 or null (3 x train_st.max_updates), "
                             f"got {self.max_updates}")


def check_multi(p, m: MultiParams) -> None:
    """``multi`` against the rest of the params: the ASR model it starts from, at least two pairs, and
    ``multi.head_selection`` against the model and the pairs by the same check that builds the layers
    (lib.model.spec.head_selection_options_from: H' against H, the tasks, the schedule), so that a
    definition train_multi would refuse stops at load time, not when its stage starts."""
    if m.systems and m.asr_init not in p.pairs:
        raise ParamError(f"multi.asr_init: {m.asr_init!r} is not in pairs {p.pairs} (its ASR model "
                         f"initialises the multilingual encoder)")
    if m.systems and len(p.pairs) < 2:
        raise ParamError(f"multi.systems: a multilingual model needs at least two pairs, got pairs {p.pairs}")
    cfg = model_config_of(p)
    if cfg is None:
        return
    from dataclasses import asdict

    from lib.model.spec import head_selection_options_from

    hs = asdict(m.head_selection)
    hs.pop("subset_init_lead")  # set on the built model, not part of the layer spec
    for system in m.systems:
        if system in SELECTION_SYSTEMS:
            try:
                head_selection_options_from({**hs, "strategy": system}, n_heads=cfg.n_heads, tasks=len(p.pairs))
            except ValueError as e:
                raise ParamError(f"{e} (multi.systems has {system})") from None


register_variant_section("multi", MultiParams, check_multi)
