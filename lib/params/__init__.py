"""Load ``params.yaml`` into typed, validated objects.

One typed dataclass per params.yaml section (the training sections in ``train``, the pipeline's in
``sections``, the controls' and variants' in ``variants``; the parsing in ``base``), consumed directly by the library
(``TrainConfig`` by the training loop, ``AnalysisParams`` by lib/analysis, ...); :class:`Params`
holds them all. Importing this package does not import torch (stages that need no torch stay fast).
Validation is strict: an unknown key, a missing key or a value of the
wrong type raises :class:`ParamError` whose message names the full key path
(``corpus.splits.train``) and the file, so a typo in ``dvc exp run -S`` fails at once instead
of silently using a default.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lib.params.base import (  # noqa: F401 (re-exported: one import path for every section)
    DEMO_MUSTC_ROOT,
    DEMO_PAIRS,
    PAIR_PATTERN,
    ParamError,
    _type_name,
    _check,
    _from_dict,
    parse_section,
    _check_repo_relative,
    LOWER_IS_BETTER,
    AMP_MODES,
    VALUE_BIAS_MODES,
    LR_SCHEDULERS,
    FOLD_MODES,
)
from lib.params.train import (  # noqa: F401 (re-exported: one import path for every section)
    TrainConfig,
)
from lib.params.sections import (  # noqa: F401 (re-exported: one import path for every section)
    CorpusParams,
    DataParams,
    PrepareParams,
    ModelParams,
    DecodeParams,
    ASR_PRETRAINING,
    LOCAL_FORKS,
    ASR_MODES,
    AsrParams,
    ParallelParams,
    LocalParams,
    AnalysisParams,
    HealthParams,
    EfficiencyParams,
)
from lib.params.variants import (  # noqa: F401 (re-exported: one import path for every section)
    SELECTION_SYSTEMS,
    SMOOTHING_SYSTEM_NAME,
    _default_smoothing_defs,
    SmoothingParams,
    ControlsParams,
    MULTI_SYSTEMS,
    HEAD_SELECTION_SIDES,
    HeadSelectionParams,
    MultiParams,
)


@dataclass(frozen=True)
class Params:
    """The sections of params.yaml that the implemented stages read."""

    pairs: list[str]
    seeds: list[int]
    data: DataParams
    corpus: CorpusParams
    prepare: PrepareParams
    model: ModelParams
    train_asr: TrainConfig
    train_st: TrainConfig
    decode: DecodeParams
    local: LocalParams
    analysis: AnalysisParams
    health: HealthParams
    asr: AsrParams = field(default_factory=AsrParams)
    parallel: ParallelParams = field(default_factory=ParallelParams)  # scripts/repro.py; threads per run
    efficiency: EfficiencyParams = field(default_factory=EfficiencyParams)  # benchmarks/encoder_efficiency.py
    smoothing: SmoothingParams = field(default_factory=SmoothingParams)  # opt-in variant (stage train_smoothing)
    multi: MultiParams = field(default_factory=MultiParams)  # opt-in variant (stage train_multi)
    controls: ControlsParams = field(default_factory=ControlsParams)  # opt-in (stages train_control, band_test)

    def validate(self, prefix: str) -> None:
        if not self.pairs:
            raise ParamError("pairs: empty; list at least one pair, e.g. [en-de]")
        for section in ("train_asr", "train_st"):
            if getattr(self, section).variant_lr is not None:
                raise ParamError(f"{section}.variant_lr: not a params.yaml key; the variants' parameters take "
                                 f"smoothing.variant_lr / multi.head_selection.variant_lr")
        if not self.seeds:
            raise ParamError("seeds: empty; list at least one seed, e.g. [1]")
        if len(set(self.seeds)) != len(self.seeds):
            raise ParamError(f"seeds: duplicates in {self.seeds} (each seed would count twice in the mean and std)")
        if self.analysis.st_seed not in self.seeds:
            # dvc.yaml's analyze / select_windows / health_st read runs/baseline/<pair>/seed<st_seed>/model.pt,
            # which only train_baseline@<pair>-<st_seed> writes: without it `dvc exp run` removes that model
            # and DVC stops with "No such file or directory" (or, with an older file left behind, an orphan
            # model would be analysed)
            raise ParamError(f"analysis.st_seed: {self.analysis.st_seed} is not in seeds {self.seeds} (Algorithm 1 "
                             f"analyses the ST baseline of that seed, and every seed's local run uses its windows); "
                             f"keep it in seeds, e.g. seeds=[{self.analysis.st_seed},...], or set analysis.st_seed "
                             f"to one of them")
        for i, pair in enumerate(self.pairs):
            if not PAIR_PATTERN.match(pair):
                raise ParamError(f"pairs[{i}]: expected a pair like 'en-de', got {pair!r}")
        if len(set(self.pairs)) != len(self.pairs):
            raise ParamError(f"pairs: duplicates in {self.pairs}")
        for split in self.prepare.pipeline_splits:
            if split not in self.prepare.splits:
                # prepare would write the other splits and the first training stage would stop on a missing manifest
                raise ParamError(f"prepare.splits: must include {split!r}, got {self.prepare.splits} (the training "
                                 f"stages validate on 'dev' and score on 'tst-COMMON'; a corpus reader reads its own "
                                 f"test split under the name 'tst-COMMON')")
        for key, split in (("analysis.split", self.analysis.split), ("analysis.window_split", self.analysis.window_split),
                           ("health.band_split", self.health.band_split)):
            if split not in self.prepare.splits:
                raise ParamError(f"{key}: {split!r} is not in prepare.splits {self.prepare.splits} (prepare writes "
                                 f"only those)")
        if Path(self.data.mustc_root) == Path(DEMO_MUSTC_ROOT):
            for i, pair in enumerate(self.pairs):
                if pair not in DEMO_PAIRS:  # else the pipeline would stop at that pair's corpus stage
                    raise ParamError(f"pairs[{i}]: {pair!r} has no demo corpus (the demo generates "
                                     f"{', '.join(DEMO_PAIRS)}); list only those, or point data.mustc_root at a "
                                     f"MuST-C copy that holds {pair}")
        if self.asr.mode == "shared" and self.asr.shared_pair not in self.pairs:
            raise ParamError(f"asr.shared_pair: {self.asr.shared_pair!r} is not in pairs {self.pairs} (its English "
                             f"trains the shared ASR model); pick one of them or set asr.mode: per_pair")
        if self.asr.fork_updates >= self.train_asr.max_updates:
            raise ParamError(f"asr.fork_updates: {self.asr.fork_updates} must be less than train_asr.max_updates "
                             f"({self.train_asr.max_updates}): the fork state is taken that many updates before "
                             f"the ASR training ends")
        if self.local.asr_pretraining == "fork" and self.asr.fork_updates == 0:
            raise ParamError("local.asr_pretraining: fork needs asr.fork_updates > 0 (the ASR stages keep their "
                             "training state that many updates before the end); e.g. -S asr.fork_updates=800")
        if self.local.asr_pretraining == "fork" and self.local.fork == "shared" and self.asr.mode != "shared":
            raise ParamError("local.fork: shared needs asr.mode: shared (one ASR training to fork for every pair); "
                             "with asr.mode: per_pair each pair forks its own ASR model: set local.fork: per_pair")
        # checked only when something runs: `-S seeds=[1]` must not trip over an unused opt-in section
        for i, pair in enumerate(self.smoothing.pairs if self.smoothing.systems else []):
            if pair not in self.pairs:
                raise ParamError(f"smoothing.pairs[{i}]: {pair!r} is not in pairs {self.pairs} (its baseline is "
                                 f"the comparison)")
        for i, seed in enumerate(self.smoothing.seeds if self.smoothing.systems else []):
            if seed not in self.seeds:
                raise ParamError(f"smoothing.seeds[{i}]: {seed} is not in seeds {self.seeds} (the baseline of the "
                                 f"same seed is the comparison)")
        if self.multi.systems and self.multi.asr_init not in self.pairs:
            raise ParamError(f"multi.asr_init: {self.multi.asr_init!r} is not in pairs {self.pairs} (its ASR model "
                             f"initialises the multilingual encoder)")
        if self.controls.asr_systems and not (self.local.asr_pretraining == "fork" and self.local.fork == "shared"):
            raise ParamError(f"controls.asr_systems: {self.controls.asr_systems} fork the shared ASR training like "
                             f"local.asr_pretraining: fork with local.fork: shared, but local.asr_pretraining is "
                             f"{self.local.asr_pretraining} and local.fork is {self.local.fork}; set "
                             f"controls.asr_systems: []")
        for i, seed in enumerate(self.controls.band_seeds):
            if seed not in self.seeds:
                raise ParamError(f"controls.band_seeds[{i}]: {seed} is not in seeds {self.seeds} (the band test runs "
                                 f"on the ST baseline of that seed)")
        if self.multi.systems and len(self.pairs) < 2:
            raise ParamError(f"multi.systems: a multilingual model needs at least two pairs, got pairs {self.pairs}")
        from lib.model.config import model_config

        try:
            cfg = model_config(self.model.size, **self.model.overrides)
        except (TypeError, ValueError):
            return  # model.overrides problems are reported by the model section
        self.smoothing.check_defs(cfg.encoder_layers, cfg.decoder_layers)
        self._check_head_selection(cfg.n_heads)

    def _check_head_selection(self, n_heads: int) -> None:
        """``multi.head_selection`` against the model and the pairs, by the same check that builds the
        layers (lib.model.spec.head_selection_options_from: H' against H, the tasks, the schedule), so
        that a definition train_multi would refuse stops at load time, not when its stage starts."""
        from dataclasses import asdict

        from lib.model.spec import head_selection_options_from

        hs = asdict(self.multi.head_selection)
        hs.pop("subset_init_lead")  # set on the built model, not part of the layer spec
        for system in self.multi.systems:
            if system in SELECTION_SYSTEMS:
                try:
                    head_selection_options_from({**hs, "strategy": system}, n_heads=n_heads, tasks=len(self.pairs))
                except ValueError as e:
                    raise ParamError(f"{e} (multi.systems has {system})") from None


def _yaml_error(e: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line, led by the line and column of the problem (1-based):
    a stage prints its errors as one line."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(e).split())
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    where = f" at line {cmark.line + 1}, column {cmark.column + 1}" if context and cmark is not None else ""
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context}{where})" if context else "")


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``path``: every section, so an unknown top-level key stops with its name
    exactly as an unknown key inside a section does."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ParamError(f"{path}: not found (run from the repository root)") from None
    except yaml.YAMLError as e:
        raise ParamError(f"{path}: not valid YAML: {_yaml_error(e)}") from None
    if not isinstance(raw, dict):
        raise ParamError(f"{path}: expected a mapping at the top level")
    try:
        return _from_dict(Params, raw, "")
    except ParamError as e:
        raise ParamError(f"{path}: {e}") from None
