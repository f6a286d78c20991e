"""Load ``params.yaml`` into typed, validated objects.

One typed dataclass per params.yaml section, declared here and consumed directly by the library
(``TrainConfig`` by the training loop, ``AnalysisParams`` by lib/analysis, ...); :class:`Params`
holds them all. Importing this module does not import torch (stages that need no torch stay fast). Validation is strict: an unknown key, a missing key or a value of the
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
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import yaml


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
        elif (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING) or \
                getattr(cls, "ALL_KEYS_REQUIRED", False):
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


def _check_repo_relative(value: str, key: str) -> None:
    """An output path param must name a folder inside the repository: DVC declares outs relative
    to it (dvc.yaml's ``${data.prepared_dir}/...``), an absolute (or ``~``) path would write outside the
    workspace that DVC caches and checks out, and a ``..`` would escape it. Checked on the text
    (no file system access), so a symlinked folder inside the repository stays the user's call."""
    parts = PurePosixPath(value).parts
    if not value.strip() or PurePosixPath(value).is_absolute() or value.startswith("~") or ".." in parts \
            or all(part == "." for part in parts):
        raise ParamError(f"{key}: must be a relative path inside the repository, got {value!r}")


#: Metrics a run may select its best checkpoint by, and whether lower is better.
LOWER_IS_BETTER = {"loss": True, "nll": True, "wer": True, "bleu": False, "chrf": False}
#: Precision modes of ``train_*.amp`` (lib/precision.py resolves ``auto`` per device).
AMP_MODES = ("none", "bf16", "fp16", "auto", "probe")
#: Where the value bias b_V goes in Eq. 3 (lib/analysis/contributions.py).
VALUE_BIAS_MODES = ("bias", "token")
LR_SCHEDULERS = ("inverse_sqrt", "polynomial_decay")
#: ``train_*.fold_update``: an update of k batches as one folded batch (lib/train/loop.py, FoldPolicy).
FOLD_MODES = ("auto", "on", "off")


@dataclass
class TrainConfig:
    """Hyperparameters of one training run (the paper's values in comments)."""

    seed: int = 1
    lr: float = 2e-3  # paper: 1e-3 ASR, 2e-3 ST
    # fairseq's lr schedulers: inverse_sqrt (the paper) | polynomial_decay (power 1: linear from lr
    # after the warm-up down to 0 at max_updates; lib.train.objectives.learning_rate)
    lr_scheduler: str = "inverse_sqrt"
    warmup_updates: int = 10000  # paper: 10000
    warmup_init_lr: float = 1e-7
    max_updates: int = 50000  # paper: 50000
    max_frames: int = 40000  # paper: 40000 "tokens" (input frames) per batch
    update_freq: int = 8  # paper: 8
    clip_norm: float = 10.0  # paper: 10
    label_smoothing: float = 0.1  # paper: 0.1
    adam_betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    ctc_weight: float = 0.0  # auxiliary encoder CTC loss (ESPnet-style); 0 in the paper
    # > 0: the CTC weight falls linearly from ctc_weight after this many updates to 0 at max_updates
    # (a demo option, lib.train.objectives.ctc_weight_at); 0: constant
    ctc_decay_from: int = 0
    # > 0: the CTC weight starts at ctc_start_weight and falls linearly to ctc_weight over this many updates
    # (a demo option: a strong CTC signal while the encoder learns to align; lib.train.objectives.ctc_weight_at)
    ctc_start_updates: int = 0
    ctc_start_weight: float = 0.0
    # A demo option (not in the paper, which uses one lr): the encoder's parameters (subsampler,
    # layers, final LayerNorm, CTC projection) step with lr x this factor; 1.0 = one lr for all.
    # For ST fine-tuning of a pretrained encoder on a short schedule (lib.train.loop.make_optimizer).
    encoder_lr_scale: float = 1.0
    # A demo option (discriminative / layer-wise lr decay, as in ULMFiT or BEiT fine-tuning): encoder
    # layer l of L steps with encoder_lr_scale x this ** (L - l), so the top layer keeps
    # encoder_lr_scale and each layer below gets this factor less; the subsampler gets ** L, the final
    # LayerNorm and CTC projection the top layer's. 1.0 = the whole encoder at encoder_lr_scale.
    encoder_layer_lr_decay: float = 1.0
    specaugment: bool = True
    # ST only, a demo option (not in the paper): also initialise the decoder's layers (not its
    # embeddings / output projection) from the ASR model, whose decoder already aligns with the encoder.
    init_decoder: bool = False
    # SpecAugment time-mask width cap as a share of the utterance (fairseq's LB policy: 1.0, i.e.
    # only T = 100 frames caps it; 0.2 keeps masks proportional on short demo utterances).
    specaug_time_p: float = 1.0
    max_frames_train: int = 3000
    max_target_tokens: int = 1024
    # Training batches' padded frame / target length rounded up to a multiple (1: to the longest
    # item, fairseq). Fewer distinct shapes, so oneDNN reuses its per-shape CPU kernels (bf16).
    # "auto": lib.precision.BF16_PAD_TO (64 frames, 8 tokens) when the run trains in bf16 on a CPU,
    # else 1 (lib.precision.resolve_padding); the run records the resolved numbers.
    pad_frames_to: int | str = 1
    pad_tokens_to: int | str = 1
    eval_every: int = 1000
    save_every: int = 1000
    average_last: int = 5  # average of the last K saved snapshots
    best_metric: str = "loss"  # loss | nll | wer | bleu | chrf
    amp: str = "none"  # none | bf16 | fp16 (CUDA only) | auto (per device and CPU kind) | probe (measured): lib/precision.py
    # With update_freq k > 1: run an update as one batch of the k batches' utterances (sorted by length)
    # instead of k accumulated batches; same gradient up to float rounding (lib.train.loop.FoldPolicy).
    # auto: fold on CUDA when the folded batch's estimated peak memory fits, else accumulate (on a CPU: accumulate)
    fold_update: str = "auto"  # auto | on | off
    # The peak lr of the attention variants' own parameters (head-selection logits, band-prior logits,
    # predicted-gate vector and bias: lib.model.attention.VariantParameter), one optimizer group
    # outside encoder_lr_scale / encoder_layer_lr_decay and weight decay, on this run's lr schedule
    # (lib.train.loop.make_optimizer). Not a params.yaml key: the smoothing and multilingual runs set
    # it from smoothing.variant_lr / multi.head_selection.variant_lr. None: no such group.
    variant_lr: float | None = None

    def validate(self, prefix: str = "train") -> None:
        """ValueError naming ``<prefix>.<key>`` for an invalid value."""
        if self.best_metric not in LOWER_IS_BETTER:
            raise ValueError(f"{prefix}.best_metric must be one of {sorted(LOWER_IS_BETTER)}, got {self.best_metric!r}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"{prefix}.amp must be one of {list(AMP_MODES)}, got {self.amp!r}")
        if self.fold_update not in FOLD_MODES:
            raise ValueError(f"{prefix}.fold_update must be one of {list(FOLD_MODES)}, got {self.fold_update!r}")
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise ValueError(f"{prefix}.lr_scheduler must be one of {list(LR_SCHEDULERS)}, got {self.lr_scheduler!r}")
        for name in ("max_updates", "max_frames", "update_freq", "eval_every", "save_every", "average_last",
                     "warmup_updates", "pad_frames_to", "pad_tokens_to"):
            value = getattr(self, name)
            if name.startswith("pad_") and isinstance(value, str):
                if value != "auto":
                    raise ValueError(f"{prefix}.{name} must be an integer >= 1 or 'auto', got {value!r}")
            elif value < 1:
                raise ValueError(f"{prefix}.{name} must be >= 1, got {value}")
        if not 0.0 < self.specaug_time_p <= 1.0:
            raise ValueError(f"{prefix}.specaug_time_p must be in (0, 1], got {self.specaug_time_p}")
        if not 0.0 < self.encoder_lr_scale <= 1.0:
            raise ValueError(f"{prefix}.encoder_lr_scale must be in (0, 1], got {self.encoder_lr_scale}")
        if self.variant_lr is not None and not self.variant_lr > 0:
            raise ValueError(f"{prefix}.variant_lr must be > 0 (or null), got {self.variant_lr}")
        if not 0.0 < self.encoder_layer_lr_decay <= 1.0:
            raise ValueError(f"{prefix}.encoder_layer_lr_decay must be in (0, 1], got {self.encoder_layer_lr_decay}")
        if self.lr <= 0 or self.clip_norm <= 0 or not 0 <= self.label_smoothing < 1 or self.ctc_weight < 0:
            raise ValueError(f"{prefix}: lr and clip_norm must be > 0, label_smoothing in [0, 1), ctc_weight >= 0")
        if self.ctc_start_updates < 0 or (self.ctc_start_updates and not (
                self.ctc_start_weight > 0 and self.ctc_start_updates < (self.ctc_decay_from or self.max_updates))):
            raise ValueError(f"{prefix}.ctc_start_updates must be 0 (off) or, with ctc_start_weight > 0, below "
                             f"ctc_decay_from or max_updates, got {self.ctc_start_updates} (ctc_start_weight "
                             f"{self.ctc_start_weight})")
        if self.ctc_decay_from and not (self.ctc_weight > 0 and 0 < self.ctc_decay_from < self.max_updates):
            raise ValueError(f"{prefix}.ctc_decay_from must be 0 (off) or, with ctc_weight > 0, in (0, max_updates = "
                             f"{self.max_updates}), got {self.ctc_decay_from}")



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
    ALL_KEYS_REQUIRED = True  # the defaults serve code and tests; params.yaml must spell every key

    def validate(self, prefix: str = "prepare") -> None:
        for name in ("n_mels", "min_frames", "max_frames_train", "asr_vocab_size", "st_vocab_size", "workers"):
            if getattr(self, name) < 1:
                raise ParamError(f"{prefix}.{name}: must be >= 1, got {getattr(self, name)}")
        if len(set(self.splits)) != len(self.splits):
            raise ParamError(f"{prefix}.splits: duplicates in {self.splits}")
        if self.train_split not in self.splits:
            raise ParamError(f"{prefix}.splits: must include {self.train_split!r}, got {self.splits}")


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
            if w < 1 or w % 2 == 0:
                raise ParamError(f"{prefix}.windows[{i}]: window must be a positive odd integer, got {w}")


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
    window_split: str  # sentences of Algorithm 1 (paper: 400 training sentences)
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
            if w < 1 or w % 2 == 0:
                raise ParamError(f"{prefix}.band_windows[{i}]: window must be a positive odd integer, got {w}")
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
        if not self.op_windows or any(w < 1 or w % 2 == 0 for w in self.op_windows):
            raise ValueError(f"{prefix}.op_windows: expected positive odd integers, got {self.op_windows}")
        if self.op_reps < 1 or self.encoder_reps < 1:
            raise ValueError(f"{prefix}: op_reps and encoder_reps must be >= 1")


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


MULTI_SYSTEMS = ("baseline", "subset", "group", "baseline_h8")
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
        for i, pair in enumerate(self.pairs):
            if not PAIR_PATTERN.match(pair):
                raise ParamError(f"pairs[{i}]: expected a pair like 'en-de', got {pair!r}")
        if len(set(self.pairs)) != len(self.pairs):
            raise ParamError(f"pairs: duplicates in {self.pairs}")
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
        raise ParamError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ParamError(f"{path}: expected a mapping at the top level")
    try:
        return _from_dict(Params, raw, "")
    except ParamError as e:
        raise ParamError(f"{path}: {e}") from None
