"""Load ``params.yaml`` into typed, validated objects.

One typed dataclass per params.yaml section (the training sections in ``train``, the pipeline's and the
controls' in ``sections``, each variant's in its own module; the parsing in ``base``), consumed directly by the library
(``TrainConfig`` by the training loop, ``AnalysisParams`` by lib/analysis, ...); :class:`Params`
holds them all. Importing this package does not import torch (stages that need no torch stay fast).
Validation is strict: an unknown key, a missing key or a value of the
wrong type raises :class:`ParamError` whose message names the full key path
(``corpus.splits.train``) and the file, so a typo in ``dvc exp run -S`` fails at once instead
of silently using a default.

The variants' sections (``smoothing``, ``multi``) are the exception: each is parsed by its variant's own
module (lib/params/smoothing.py, lib/params/multi.py), and only once a stage has imported it
(``import lib.params.smoothing``). Without it a section is kept as
read, and :attr:`Params.smoothing` / :attr:`Params.multi` refuse with a message saying what to import: so
the baseline's stages import no variant code, and DVC reruns no baseline for an edit to a variant.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
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
    run_validate,
    VARIANT_SECTIONS,
    VARIANT_PARSERS,
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
    ControlsParams,
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
    controls: ControlsParams = field(default_factory=ControlsParams)  # opt-in (stages train_control, band_test)
    #: the variants' sections (:data:`VARIANT_SECTIONS`): as read (a mapping) until parsed by
    #: :meth:`variant`; not a params.yaml key itself
    variant_sections: dict = field(default_factory=dict, compare=False, repr=False, metadata={"yaml": False})

    def __post_init__(self) -> None:
        # the sections parsed and checked against this object's pairs, seeds and model; not shared with
        # a dataclasses.replace() copy, whose pairs may differ
        object.__setattr__(self, "_checked_variants", {})

    @property
    def smoothing(self):  # -> lib.params.smoothing.SmoothingParams
        """``smoothing`` (opt-in variant, stage train_smoothing): needs ``import lib.params.smoothing``."""
        return self.variant("smoothing")

    @property
    def multi(self):  # -> lib.params.multi.MultiParams
        """``multi`` (opt-in variant, stage train_multi): needs ``import lib.params.multi``."""
        return self.variant("multi")

    def variant(self, name: str):
        """The variant section ``name`` parsed and checked against the rest of the params (once; then kept).
        Raises RuntimeError when the variant's module has not registered it: the code that reads a
        variant's params imports that module, so the stage's DVC deps list it."""
        if name in self._checked_variants:
            return self._checked_variants[name]
        value = self.variant_sections.get(name, {})
        cls_check = VARIANT_PARSERS.get(name)
        if cls_check is None:
            module = VARIANT_SECTIONS[name]
            raise RuntimeError(f"params section {name!r} is parsed by {module.replace('.', '/')}.py, which this "
                               f"process has not imported; `import {module}` in the code that reads it (its "
                               f"stage then lists it among its DVC deps)")
        cls, check = cls_check
        if isinstance(value, cls):  # handed in parsed (with_variant): its own checks, as parse_section runs them
            _validate_parsed(value, name)
            section = value
        else:
            section = parse_section(cls, value if value is not None else {}, name)
        check(self, section)
        self._checked_variants[name] = section
        return section

    def with_variant(self, name: str, section) -> "Params":
        """A copy whose variant section ``name`` is ``section`` (a parsed dataclass), checked as at load time."""
        out = replace(self, variant_sections={**self.variant_sections, name: section})
        out.variant(name)
        return out

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
        if self.controls.asr_systems and not (self.local.asr_pretraining == "fork" and self.local.fork == "shared"):
            raise ParamError(f"controls.asr_systems: {self.controls.asr_systems} fork the shared ASR training like "
                             f"local.asr_pretraining: fork with local.fork: shared, but local.asr_pretraining is "
                             f"{self.local.asr_pretraining} and local.fork is {self.local.fork}; set "
                             f"controls.asr_systems: []")
        for i, seed in enumerate(self.controls.band_seeds):
            if seed not in self.seeds:
                raise ParamError(f"controls.band_seeds[{i}]: {seed} is not in seeds {self.seeds} (the band test runs "
                                 f"on the ST baseline of that seed)")


def _validate_parsed(obj, prefix: str) -> None:
    """The ``validate`` checks that parsing runs (lib.params.base._from_dict), inner sections first, for a
    section built in code (dataclasses.replace) instead of parsed."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value) and not isinstance(value, type):
            _validate_parsed(value, f"{prefix}.{f.name}")
    run_validate(obj, prefix)


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
    variants = {name: raw.pop(name) for name in VARIANT_SECTIONS if name in raw}
    try:
        for name, value in variants.items():
            if not isinstance(value, dict):  # `smoothing:` left empty is null: refused, as any other section
                raise ParamError(f"{name}: expected a mapping, got {type(value).__name__} {value!r}")
        known = sorted({f.name for f in fields(Params) if f.metadata.get("yaml", True)} | set(VARIANT_SECTIONS))
        unknown = sorted(set(raw) - set(known), key=str)
        if unknown:  # as _from_dict says it, with the variants' sections among the known keys
            raise ParamError(f"unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(known)}")
        p = _from_dict(Params, raw, "")
        p = replace(p, variant_sections=variants)
        for name in VARIANT_SECTIONS:  # the variants this process has imported: checked now, with the rest
            if name in VARIANT_PARSERS:
                p.variant(name)
        return p
    except ParamError as e:
        raise ParamError(f"{path}: {e}") from None
