"""The params.yaml sections of the main pipeline: corpus, data, prepare, model, decode, asr, parallel,
local, analysis, health, efficiency, and the controls of Algorithm 1 (its band test runs in the
baseline's chain)."""
from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from lib.params.base import PAIR_PATTERN, VALUE_BIAS_MODES, ParamError, _check, _check_repo_relative


def _odd_window(window: Any, what: str) -> int:
    """lib.model.config.odd_window, the one odd-window check, as a ParamError."""
    from lib.model.config import odd_window

    try:
        return odd_window(window, what)
    except ValueError as e:
        raise ParamError(str(e)) from None


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
    reverb_rt60: list[float] = field(default_factory=lambda: [0.0, 0.0])  # [lo, hi] s per talk; [0, 0]: dry

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
        rv = self.reverb_rt60
        if len(rv) != 2 or not 0 <= rv[0] <= rv[1] <= 3.0 or (rv[1] > 0 and rv[0] <= 0):
            raise ParamError(f"{prefix}.reverb_rt60: expected [lo, hi] seconds with 0 < lo <= hi <= 3, "
                             f"or [0, 0] (dry speech), got {rv}")


@dataclass(frozen=True)
class DataParams:
    """``data``: where the MuST-C v1 root is (the demo corpus by default) and where prepared data goes."""

    mustc_root: str  # an input: may be absolute (a real MuST-C copy lives outside the repository)
    prepared_dir: str  # an output: relative, inside the repository

    def validate(self, prefix: str) -> None:
        _check_repo_relative(self.prepared_dir, f"{prefix}.prepared_dir")
        if not self.mustc_root.strip():
            raise ParamError(f"{prefix}.mustc_root: empty")
        if self.mustc_root.startswith("~"):  # dvc.yaml's ${data.mustc_root}/<pair> dependency is not expanded
            raise ParamError(f"{prefix}.mustc_root: {self.mustc_root!r}: give the path without '~' (DVC does not "
                             f"expand it), e.g. {str(Path(self.mustc_root).expanduser())!r}")


@dataclass(frozen=True)
class PrepareParams:
    """``prepare``: features, filters and vocabularies of lib/data/prepare.py (defaults: fairseq's
    MuST-C recipe at paper scale). The training split is always ``train``."""

    splits: list[str] = field(default_factory=lambda: ["train", "dev", "tst-COMMON"])
    n_mels: int = 80
    min_frames: int = 5
    max_frames_train: int = 3000
    asr_vocab_size: int = 5000
    st_vocab_size: int = 8000
    workers: int = 2

    train_split = "train"  # a class constant, not a param
    pipeline_splits = ("dev", "tst-COMMON")  # read by every training run (lib/train/run.py: dev_split, test_split)
    ALL_KEYS_REQUIRED = True  # the defaults serve code and tests; params.yaml must spell every key

    def validate(self, prefix: str = "prepare") -> None:
        for name in ("n_mels", "min_frames", "max_frames_train", "asr_vocab_size", "st_vocab_size", "workers"):
            if getattr(self, name) < 1:
                raise ParamError(f"{prefix}.{name}: must be >= 1, got {getattr(self, name)}")
        if len(set(self.splits)) != len(self.splits):
            raise ParamError(f"{prefix}.splits: duplicates in {self.splits}")
        if self.train_split not in self.splits:
            raise ParamError(f"{prefix}.splits: must include {self.train_split!r}, got {self.splits}")


_SCALAR_HINTS = (int, float, bool, str, typing.Optional[int])
#: ModelConfig fields that count something (sizes, layers, positions): at least 1.
_POSITIVE_MODEL_KEYS = ("n_mels", "conv_channels", "conv_kernel", "d_model", "n_heads", "ffn_dim", "encoder_layers",
                        "decoder_layers", "max_source_positions", "max_target_positions")


@dataclass(frozen=True)
class ModelParams:
    """``model``: a named size of lib/model/s2t_transformer.py (``s`` = the paper) plus overrides."""

    size: str
    overrides: dict[str, Any]

    def validate(self, prefix: str) -> None:
        from lib.model.config import MODEL_SIZES, ModelConfig

        if self.size not in MODEL_SIZES:
            raise ParamError(f"{prefix}.size: unknown size {self.size!r}; known: {sorted(MODEL_SIZES)}")
        known = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size", "ctc_vocab_size",
                                                                    "encoder_attention"}
        unknown = sorted(set(self.overrides) - known)
        if unknown:
            raise ParamError(f"{prefix}.overrides: unknown key(s) {unknown}; known: {sorted(known)}")
        # each value's type and range here, naming its key (the values themselves are used as written:
        # they are part of every run's model config)
        hints = typing.get_type_hints(ModelConfig)
        for key, value in self.overrides.items():
            where = f"{prefix}.overrides.{key}"
            if hints[key] not in _SCALAR_HINTS:
                continue  # the decoder's attention specs: checked where the model config is built, below
            _check(value, hints[key], where)
            if isinstance(value, str) and hints[key] is not str:  # used as written: a string is not a number
                raise ParamError(f"{where}: {value!r} is a string to YAML; write it as a number (1e-1 -> 0.1 or 1.0e-1)")
            if key in _POSITIVE_MODEL_KEYS and value < 1:
                raise ParamError(f"{where}: must be >= 1, got {value}")
            if key in ("ctc_layer", "rel_pos_bias") and value < 0:
                raise ParamError(f"{where}: must be >= 0, got {value}")
            if key.endswith("dropout") and not 0 <= value < 1:
                raise ParamError(f"{where}: must be in [0, 1), got {value}")
        from lib.model.config import model_config

        try:  # what holds between keys (d_model by n_heads, ctc_layer within the layers, the decoder specs)
            model_config(self.size, **self.overrides)
        except (TypeError, ValueError) as e:
            raise ParamError(f"{prefix}.overrides: {e}") from None


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
        if self.max_len_a < 0:
            raise ParamError(f"{prefix}.max_len_a: must be >= 0, got {self.max_len_a}")
        if self.final_checkpoint not in ("avg_last_k", "best", "last"):
            raise ParamError(f"{prefix}.final_checkpoint: expected avg_last_k, best or last, "
                             f"got {self.final_checkpoint!r}")


ASR_PRETRAINING = ("shared", "fork", "local")
LOCAL_FORKS = ("per_pair", "shared")
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
    # > 0: every ASR run also keeps its training state this many updates before its end
    # (runs/asr/<pair>/fork.pt), from which local.asr_pretraining: fork finishes it with local
    # attention; 0: no fork state (a placeholder file).
    fork_updates: int = 0

    def validate(self, prefix: str) -> None:
        if self.mode not in ASR_MODES:
            raise ParamError(f"{prefix}.mode: expected one of {list(ASR_MODES)}, got {self.mode!r}")
        if self.fork_updates < 0:
            raise ParamError(f"{prefix}.fork_updates: must be >= 0, got {self.fork_updates}")
        if not PAIR_PATTERN.match(self.shared_pair):
            raise ParamError(f"{prefix}.shared_pair: expected a pair like 'en-de', got {self.shared_pair!r}")


@dataclass(frozen=True)
class ParallelParams:
    """``parallel``: independent stages side by side (``scripts/repro.py``, run by ``make repro``).

    ``jobs``: how many at a time; ``auto`` = the number of cores on a CPU (at most 8), 1 with CUDA.
    On a CPU every training run of a per-pair or per-seed stage uses ``cores // jobs`` threads,
    however the stage is started (lib/parallel.py: the thread count changes the last bits)."""

    jobs: int | str = "auto"

    def validate(self, prefix: str) -> None:
        if isinstance(self.jobs, bool) or (isinstance(self.jobs, str) and self.jobs != "auto") or \
                (isinstance(self.jobs, int) and self.jobs < 1):
            raise ParamError(f"{prefix}.jobs: expected an integer >= 1 or 'auto', got {self.jobs!r}")


@dataclass(frozen=True)
class LocalParams:
    """``local``: the local-attention model (paper: layers 1-3 full, 4-12 local)."""

    windows: list[int]  # [] = the windows written by select_windows; else one odd window per local layer
    # ASR model train_local starts from: "shared" = the baseline's ASR model (train_asr, the paper);
    # "fork" = that model's own training, forked ``asr.fork_updates`` updates before its end and
    # finished with the local-attention spec (same data order, schedule, optimizer state and number
    # of updates as the baseline's ASR model; the attention of the last updates is the only
    # difference; the fork point is ``asr.fork_updates``); "local" = an ASR model pretrained from
    # scratch with the local-attention spec.
    asr_pretraining: str = "shared"
    # With asr_pretraining "fork" and asr.mode "shared": "per_pair" = one fork per pair with the
    # pair's own windows (stage train_asr_local); "shared" = one fork for every pair (stage
    # train_asr_local_shared) with, per layer, the widest window any pair's select_windows chose,
    # so each pair's ST run only narrows windows; it costs asr.fork_updates ASR updates once.
    fork: str = "per_pair"

    def validate(self, prefix: str) -> None:
        if self.asr_pretraining not in ASR_PRETRAINING:
            raise ParamError(f"{prefix}.asr_pretraining: expected one of {list(ASR_PRETRAINING)}, "
                             f"got {self.asr_pretraining!r}")
        if self.fork not in LOCAL_FORKS:
            raise ParamError(f"{prefix}.fork: expected one of {list(LOCAL_FORKS)}, got {self.fork!r}")
        for i, w in enumerate(self.windows):
            _odd_window(w, f"{prefix}.windows[{i}]: window")


@dataclass(frozen=True)
class AnalysisParams:
    """``analysis`` section of params.yaml (read by the analyze and select_windows stages)."""

    st_seed: int  # which ST baseline is analysed: runs/baseline/<pair>/seed<st_seed>/model.pt
    split: str  # sentences of the CCD analysis (Fig. 3: 100 samples)
    samples: int
    seed: int  # seeds the random choice of sentences (both stages)
    value_bias: str  # "bias" (Eq. 3 as printed, b_V in the bias term) or "token"
    residual: bool  # Eq. 5's + x_i on the diagonal
    ccd_method: str  # "trapezoid" | "mean" (lib.analysis.windows.ccd)
    figure_sample: int  # index into the chosen analysis sentences, for Figs. 1, 2 and 4
    figure_layer: int  # 1-based layer of Figs. 1 and 2 (paper's Fig. 1: layer 11)
    transparency_samples: int  # first k analysis sentences saved with all raw tensors (.npz)
    window_split: str  # sentences of Algorithm 1 (paper: a random set of 400, split unstated; train chosen)
    window_samples: int
    threshold: float  # t of Algorithm 1 (paper: 0.01)
    full_layers: int  # k: layers 1..k keep full attention (paper: 3)
    width_rule: str  # "2i" (reproduces Table 1's statistics) | "2i+1" (as printed)
    include_main_diagonal: bool
    patience_fraction: float  # stop after ceil(N * fraction) consecutive failing diagonals
    patience_rounding: str  # ceil | floor | round
    min_patience: int
    ddof: int  # std convention of σ and of the CL std (0 = population)

    def validate(self, prefix: str) -> None:
        def bad(key: str, msg: str) -> ParamError:
            return ParamError(f"{prefix}.{key}: {msg}, got {getattr(self, key)!r}")

        for key in ("samples", "window_samples", "figure_layer", "min_patience"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        for key in ("figure_sample", "transparency_samples", "full_layers", "st_seed"):
            if getattr(self, key) < 0:
                raise bad(key, "must be >= 0")
        if self.figure_sample >= self.samples:
            raise bad("figure_sample", f"must be < samples ({self.samples})")
        if self.value_bias not in VALUE_BIAS_MODES:
            raise bad("value_bias", f"expected one of {list(VALUE_BIAS_MODES)}")
        if self.ccd_method not in ("trapezoid", "mean"):
            raise bad("ccd_method", "expected trapezoid or mean")
        if self.width_rule not in ("2i", "2i+1"):
            raise bad("width_rule", "expected '2i' or '2i+1'")
        if self.patience_rounding not in ("ceil", "floor", "round"):
            raise bad("patience_rounding", "expected ceil, floor or round")
        if not 0.0 < self.threshold < 1.0:
            raise bad("threshold", "expected 0 < t < 1 (a share of each row's total contribution)")
        if not self.patience_fraction > 0.0:
            raise bad("patience_fraction", "must be > 0")
        if self.ddof not in (0, 1):
            raise bad("ddof", "expected 0 (population std) or 1 (sample std)")

    def select_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`lib.analysis.windows.select_window`."""
        return dict(include_main_diagonal=self.include_main_diagonal, width_rule=self.width_rule,
                    patience_fraction=self.patience_fraction, patience_rounding=self.patience_rounding,
                    min_patience=self.min_patience)


@dataclass(frozen=True)
class HealthParams:
    """``health`` section of params.yaml (stages health_asr, health_st)."""

    samples: int  # sentences of analysis.window_split (seeded as the analysis stages) for points 1-4
    band_split: str  # held-out sentences of the inference band test (teacher-forced)
    band_windows: list[int]  # uniform windows of layers full_layers+1..L in the band test
    head_threshold: float  # a head counts as local when its ±2 mass is >= this x uniform

    def validate(self, prefix: str) -> None:
        if self.samples < 1:
            raise ParamError(f"{prefix}.samples: must be >= 1, got {self.samples}")
        for i, w in enumerate(self.band_windows):
            _odd_window(w, f"{prefix}.band_windows[{i}]: window")
        if not self.head_threshold > 0:
            raise ParamError(f"{prefix}.head_threshold: must be > 0, got {self.head_threshold}")


@dataclass(frozen=True)
class EfficiencyParams:
    """``efficiency`` section of params.yaml (optional: these defaults apply when it is absent)."""

    pair: str = "en-de"  # own windows from data/windows/<pair>/windows.json
    lengths: list[int] = field(default_factory=lambda: [166, 512, 1052])
    op_windows: list[int] = field(default_factory=lambda: [5, 13, 25])
    op_reps: int = 7
    encoder_reps: int = 5
    quick: bool = False  # few reps, N in {166, 512}, op w = 13 only

    def validate(self, prefix: str) -> None:
        if not re.match(r"^en-[a-z]{2}$", self.pair):
            raise ValueError(f"{prefix}.pair: expected a pair like 'en-de', got {self.pair!r}")
        if not self.lengths or any(n < 1 for n in self.lengths):
            raise ValueError(f"{prefix}.lengths: expected positive integers, got {self.lengths}")
        if not self.op_windows:
            raise ValueError(f"{prefix}.op_windows: expected positive odd integers, got {self.op_windows}")
        for i, w in enumerate(self.op_windows):
            _odd_window(w, f"{prefix}.op_windows[{i}]: window")
        if self.op_reps < 1 or self.encoder_reps < 1:
            raise ValueError(f"{prefix}: op_reps and encoder_reps must be >= 1")


@dataclass(frozen=True)
class ControlsParams:
    """``controls``: controls for Algorithm 1 (docs/results.md), opt-in.

    ``systems`` (default [] = no training stage): ``local_uniform`` (layers full_layers+1..L at one
    window, the mean of Algorithm 1's windows rounded to the nearest odd width, ties up) and
    ``local_shuffled`` (Algorithm 1's windows permuted across those layers with ``shuffle_seed``);
    lib.model.spec has the rules. Stage train_control trains each for every pair and seed like
    `local` (same ``train_st``). ``asr_systems``: the controls whose ASR model follows local's fork rule
    with the control's own windows (stage train_asr_control: the shared ASR training forked
    ``asr.fork_updates`` updates before its end and finished with, per layer, the widest of every pair's
    control windows, as train_asr_local_shared does with Algorithm 1's); the other controls start from
    the local system's ASR model runs/asr_local/<pair>, finished with Algorithm 1's windows (cheaper, but
    biased towards Algorithm 1). Needs ``local.asr_pretraining: fork`` with ``local.fork: shared``.
    ``band_seeds`` (default [] = no stage): the seeds whose ST baseline gets the inference band test of
    every configuration (stage band_test, per pair and seed)."""

    systems: list[str] = field(default_factory=list)
    asr_systems: list[str] = field(default_factory=list)
    shuffle_seed: int = 1
    band_seeds: list[int] = field(default_factory=list)

    def validate(self, prefix: str) -> None:
        from lib.model.spec import CONTROL_SYSTEMS

        for i, name in enumerate(self.systems):
            if name not in CONTROL_SYSTEMS:
                raise ParamError(f"{prefix}.systems[{i}]: unknown control {name!r}; known: {list(CONTROL_SYSTEMS)}")
        if len(set(self.systems)) != len(self.systems):
            raise ParamError(f"{prefix}.systems: duplicates in {self.systems}")
        for i, name in enumerate(self.asr_systems):
            if name not in self.systems:
                raise ParamError(f"{prefix}.asr_systems[{i}]: {name!r} is not in {prefix}.systems {self.systems} "
                                 f"(its ASR fork would train for nothing)")
        if len(set(self.asr_systems)) != len(self.asr_systems):
            raise ParamError(f"{prefix}.asr_systems: duplicates in {self.asr_systems}")
        if len(set(self.band_seeds)) != len(self.band_seeds):
            raise ParamError(f"{prefix}.band_seeds: duplicates in {self.band_seeds}")
        if self.shuffle_seed < 0:
            raise ParamError(f"{prefix}.shuffle_seed: must be >= 0, got {self.shuffle_seed}")
