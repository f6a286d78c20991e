"""Load ``params.yaml`` into typed, validated objects.

Each pipeline stage reads one section (plus the top-level ``pairs``/``seeds``) through a
dataclass declared here. Validation is strict: an unknown key, a missing key or a value of the
wrong type raises :class:`ParamError` whose message names the full key path
(``corpus.splits.train``) and the file, so a typo in ``dvc exp run -S`` fails at once instead
of silently using a default.
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lib.train.loop import TrainConfig

T = TypeVar("T")

PAIR_PATTERN = re.compile(r"^en-[a-z]{2}$")


class ParamError(ValueError):
    """A params.yaml value is missing, unknown or of the wrong type; the message names the key."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _check(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (recursively); return the converted value."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for alt in args:
            try:
                return _check(value, alt, key)
            except ParamError as e:
                errors.append(str(e))
        raise ParamError(f"{key}: {value!r} matches none of {', '.join(_type_name(a) for a in args)}")
    if tp is type(None):
        if value is not None:
            raise ParamError(f"{key}: expected null, got {value!r}")
        return None
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ParamError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        item_tp = args[0] if args else Any
        items = [_check(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ParamError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        k_tp, v_tp = args if args else (Any, Any)
        return {_check(k, k_tp, f"{key} key"): _check(v, v_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        # YAML reads "1e-3" as a string and "2" as an int; accept ints and numeric strings for floats.
        if isinstance(value, bool):
            raise ParamError(f"{key}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ParamError(f"{key}: expected a number, got {type(value).__name__} {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ParamError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
        return value
    raise TypeError(f"unsupported annotation {tp!r} for {key}")


def _from_dict(cls: type[T], data: Any, prefix: str) -> T:
    if not isinstance(data, dict):
        raise ParamError(f"{prefix}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ParamError(f"{prefix}: unknown key(s) {', '.join(prefix + '.' + k for k in unknown)}; "
                         f"known: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name in data:
            kwargs[name] = _check(data[name], hints[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ParamError(f"{key}: missing")
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate(prefix)
        except ParamError:
            raise
        except ValueError as e:
            raise ParamError(str(e)) from None
    return obj


def parse_section(cls: type[T], data: Any, prefix: str) -> T:
    """Build the dataclass ``cls`` from the mapping ``data``; errors name ``prefix.<key>``."""
    return _from_dict(cls, data, prefix)


@dataclass(frozen=True)
class CorpusParams:
    """``corpus``: the synthetic demo corpus in MuST-C v1 layout (see lib/corpus)."""

    seed: int
    splits: dict[str, int]  # segments per split
    segments_per_talk: int
    n_speakers: int
    pause_seconds: list[float]  # [min, max] silence between segments inside a talk
    noise_level: float  # amplitude of the Gaussian background noise (full scale = 1.0)
    workers: int
    sentences_per_segment: list[int] = field(default_factory=lambda: [1, 1])  # [lo, hi] sentences per segment
    sentence_pause_seconds: list[float] = field(default_factory=lambda: [0.1, 0.4])  # pauses inside a segment
    rate_jitter: int = 0  # per-sentence speaking-rate variation, +- words per minute
    word_gap: list[int] = field(default_factory=lambda: [0, 0])  # [lo, hi] eSpeak word gap, x 10 ms

    def validate(self, prefix: str) -> None:
        for split, n in self.splits.items():
            if n < 1:
                raise ParamError(f"{prefix}.splits.{split}: must be >= 1, got {n}")
        if self.segments_per_talk < 1:
            raise ParamError(f"{prefix}.segments_per_talk: must be >= 1, got {self.segments_per_talk}")
        if self.n_speakers < 1:
            raise ParamError(f"{prefix}.n_speakers: must be >= 1, got {self.n_speakers}")
        if len(self.pause_seconds) != 2 or not 0 <= self.pause_seconds[0] <= self.pause_seconds[1]:
            raise ParamError(f"{prefix}.pause_seconds: expected [min, max] with 0 <= min <= max, "
                             f"got {self.pause_seconds}")
        if not 0 <= self.noise_level < 0.1:
            raise ParamError(f"{prefix}.noise_level: expected 0 <= value < 0.1, got {self.noise_level}")
        if self.workers < 1:
            raise ParamError(f"{prefix}.workers: must be >= 1, got {self.workers}")
        lo_hi = self.sentences_per_segment
        if len(lo_hi) != 2 or not 1 <= lo_hi[0] <= lo_hi[1]:
            raise ParamError(f"{prefix}.sentences_per_segment: expected [lo, hi] with 1 <= lo <= hi, got {lo_hi}")
        sp = self.sentence_pause_seconds
        if len(sp) != 2 or not 0 <= sp[0] <= sp[1]:
            raise ParamError(f"{prefix}.sentence_pause_seconds: expected [min, max] with 0 <= min <= max, got {sp}")
        if not 0 <= self.rate_jitter <= 100:
            raise ParamError(f"{prefix}.rate_jitter: expected 0..100 words per minute, got {self.rate_jitter}")
        wg = self.word_gap
        if len(wg) != 2 or not 0 <= wg[0] <= wg[1] <= 50:
            raise ParamError(f"{prefix}.word_gap: expected [lo, hi] with 0 <= lo <= hi <= 50 (x 10 ms), got {wg}")


@dataclass(frozen=True)
class DataParams:
    """``data``: where the MuST-C v1 root is (the demo corpus by default) and where prepared data goes."""

    mustc_root: str
    prepared_dir: str


@dataclass(frozen=True)
class PrepareParams:
    """``prepare``: features, filters and vocabularies (fairseq MuST-C recipe values at paper scale)."""

    splits: list[str]
    n_mels: int
    min_frames: int
    max_frames_train: int
    asr_vocab_size: int
    st_vocab_size: int
    workers: int

    def validate(self, prefix: str) -> None:
        for name in ("n_mels", "min_frames", "max_frames_train", "asr_vocab_size", "st_vocab_size", "workers"):
            if getattr(self, name) < 1:
                raise ParamError(f"{prefix}.{name}: must be >= 1, got {getattr(self, name)}")
        if "train" not in self.splits:
            raise ParamError(f"{prefix}.splits: must include 'train', got {self.splits}")


@dataclass(frozen=True)
class ModelParams:
    """``model``: a named size of lib/model/s2t_transformer.py (``s`` = the paper) plus overrides."""

    size: str
    overrides: dict[str, Any]

    def validate(self, prefix: str) -> None:
        from lib.model.s2t_transformer import MODEL_SIZES, ModelConfig

        if self.size not in MODEL_SIZES:
            raise ParamError(f"{prefix}.size: unknown size {self.size!r}; known: {sorted(MODEL_SIZES)}")
        known = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size", "ctc_vocab_size",
                                                                    "encoder_attention"}
        unknown = sorted(set(self.overrides) - known)
        if unknown:
            raise ParamError(f"{prefix}.overrides: unknown key(s) {unknown}; known: {sorted(known)}")


@dataclass(frozen=True)
class DecodeParams:
    """``decode``: beam search on tst-COMMON after training (paper: beam 5)."""

    beam: int
    len_penalty: float
    max_len_a: float
    max_len_b: int
    batch_frames: int
    final_checkpoint: str  # avg_last_k | best | last
    dev_sentences: int  # dev sentences decoded (greedy) at each evaluation during training

    def validate(self, prefix: str) -> None:
        if self.beam < 1 or self.max_len_b < 1 or self.batch_frames < 1 or self.dev_sentences < 1:
            raise ParamError(f"{prefix}: beam, max_len_b, batch_frames and dev_sentences must be >= 1")
        if self.final_checkpoint not in ("avg_last_k", "best", "last"):
            raise ParamError(f"{prefix}.final_checkpoint: expected avg_last_k, best or last, "
                             f"got {self.final_checkpoint!r}")


ASR_PRETRAINING = ("shared", "local")
ASR_MODES = ("per_pair", "shared")


@dataclass(frozen=True)
class AsrParams:
    """``asr``: which ASR model initialises each pair's ST encoder.

    ``per_pair`` (the paper): one ASR model per pair (stage train_asr), trained on that pair's
    English. ``shared`` (a demo deviation): one English ASR model trained on ``shared_pair``'s English
    (stage train_asr_shared) initialises every pair; train_asr@<pair> then copies it and scores it
    on the pair's own tst-COMMON. The demo corpora of all pairs speak the same synthetic English, so
    this buys three times the ASR training for the same time."""

    mode: str = "per_pair"
    shared_pair: str = "en-de"

    def validate(self, prefix: str) -> None:
        if self.mode not in ASR_MODES:
            raise ParamError(f"{prefix}.mode: expected one of {list(ASR_MODES)}, got {self.mode!r}")
        if not PAIR_PATTERN.match(self.shared_pair):
            raise ParamError(f"{prefix}.shared_pair: expected a pair like 'en-de', got {self.shared_pair!r}")


@dataclass(frozen=True)
class LocalParams:
    """``local``: the local-attention model (paper: layers 1-3 full, 4-12 local)."""

    windows: list[int]  # [] = the windows written by select_windows; else one odd window per local layer
    # ASR model train_local starts from: "shared" = the baseline's ASR model (train_asr), or "local" =
    # an ASR model pretrained with the same local-attention spec (stage train_asr_local).
    asr_pretraining: str = "shared"

    def validate(self, prefix: str) -> None:
        if self.asr_pretraining not in ASR_PRETRAINING:
            raise ParamError(f"{prefix}.asr_pretraining: expected one of {list(ASR_PRETRAINING)}, "
                             f"got {self.asr_pretraining!r}")
        for i, w in enumerate(self.windows):
            if w < 1 or w % 2 == 0:
                raise ParamError(f"{prefix}.windows[{i}]: window must be a positive odd integer, got {w}")


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
    asr: AsrParams = field(default_factory=AsrParams)
    extra: dict[str, Any] = field(default_factory=dict)  # sections owned by later stages

    def validate(self, prefix: str) -> None:
        for i, pair in enumerate(self.pairs):
            if not PAIR_PATTERN.match(pair):
                raise ParamError(f"pairs[{i}]: expected a pair like 'en-de', got {pair!r}")
        if len(set(self.pairs)) != len(self.pairs):
            raise ParamError(f"pairs: duplicates in {self.pairs}")
        if self.asr.mode == "shared" and self.asr.shared_pair not in self.pairs:
            raise ParamError(f"asr.shared_pair: {self.asr.shared_pair!r} is not in pairs {self.pairs} (its English "
                             f"trains the shared ASR model); pick one of them or set asr.mode: per_pair")


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``path``; sections not modelled here are kept untouched in ``extra``."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ParamError(f"{path}: not found (run from the repository root)") from None
    except yaml.YAMLError as e:
        raise ParamError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ParamError(f"{path}: expected a mapping at the top level")
    known = {f.name for f in dataclasses.fields(Params)} - {"extra"}
    core = {k: v for k, v in raw.items() if k in known}
    extra = {k: v for k, v in raw.items() if k not in known}
    try:
        return _from_dict(Params, {**core, "extra": extra}, "")
    except ParamError as e:
        raise ParamError(f"{path}: {e}") from None
