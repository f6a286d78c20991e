"""``train_asr`` / ``train_st``: :class:`TrainConfig`, the plain values the training loop reads."""
from __future__ import annotations

from dataclasses import dataclass


from lib.params.base import AMP_MODES, FOLD_MODES, LOWER_IS_BETTER, LR_SCHEDULERS


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
    # With update_freq k > 1, which batches share an update: "length" (this project's choice): the
    # epoch's batches sorted by length, taken k at a time, the updates then shuffled, so a folded update
    # pads little; "shuffled": k consecutive batches of the shuffled epoch (fairseq's accumulation).
    # The same with update_freq 1 (lib.train.loop._update_groups).
    update_grouping: str = "length"  # length | shuffled
    # Processes of one run (one GPU each; gloo on a CPU): > 1 makes the stage start torchrun itself
    # (lib.train.distributed.init_distributed), so DVC records the run like any other. update_freq stays
    # the whole update's batches, split among the processes (it must divide by this).
    processes: int = 1
    # Worker processes that collate the training batches while the GPU trains (lib/train/feed.py): auto =
    # on CUDA the host's cores per GPU less 2, at most 8; 0 = one background thread. A CPU run collates
    # in its own process whatever this says (its bits never move). Not fingerprinted: it changes which
    # process collates, not which batches (their values move by float rounding with that process's
    # torch thread count: lib/train/feed.py).
    data_workers: int | str = "auto"
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
        if self.update_grouping not in ("length", "shuffled"):
            raise ValueError(f"{prefix}.update_grouping must be one of ['length', 'shuffled'], got {self.update_grouping!r}")
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise ValueError(f"{prefix}.lr_scheduler must be one of {list(LR_SCHEDULERS)}, got {self.lr_scheduler!r}")
        for name in ("max_updates", "max_frames", "update_freq", "eval_every", "save_every", "average_last",
                     "warmup_updates", "pad_frames_to", "pad_tokens_to", "processes", "max_frames_train",
                     "max_target_tokens"):
            value = getattr(self, name)
            if name.startswith("pad_") and isinstance(value, str):
                if value != "auto":
                    raise ValueError(f"{prefix}.{name} must be an integer >= 1 or 'auto', got {value!r}")
            elif value < 1:
                raise ValueError(f"{prefix}.{name} must be >= 1, got {value}")
        if self.data_workers != "auto" and not (isinstance(self.data_workers, int) and self.data_workers >= 0):
            raise ValueError(f"{prefix}.data_workers must be an integer >= 0 or 'auto', got {self.data_workers!r}")
        if self.update_freq % self.processes:
            raise ValueError(f"{prefix}.update_freq ({self.update_freq}) is the whole update's batches, split among "
                             f"{prefix}.processes ({self.processes}): it must divide by it (e.g. processes "
                             f"{', '.join(str(d) for d in range(1, self.update_freq + 1) if self.update_freq % d == 0)})")
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
        if not 0 <= self.warmup_init_lr <= self.lr:
            raise ValueError(f"{prefix}.warmup_init_lr must be in [0, lr = {self.lr}], got {self.warmup_init_lr}")
        if self.weight_decay < 0:
            raise ValueError(f"{prefix}.weight_decay must be >= 0, got {self.weight_decay}")
        if not all(0 <= b < 1 for b in self.adam_betas) or len(self.adam_betas) != 2:
            raise ValueError(f"{prefix}.adam_betas must be two numbers in [0, 1), got {list(self.adam_betas)}")
        if self.ctc_start_updates < 0 or (self.ctc_start_updates and not (
                self.ctc_start_weight > 0 and self.ctc_start_updates < (self.ctc_decay_from or self.max_updates))):
            raise ValueError(f"{prefix}.ctc_start_updates must be 0 (off) or, with ctc_start_weight > 0, below "
                             f"ctc_decay_from or max_updates, got {self.ctc_start_updates} (ctc_start_weight "
                             f"{self.ctc_start_weight})")
        if self.ctc_decay_from and not (self.ctc_weight > 0 and 0 < self.ctc_decay_from < self.max_updates):
            raise ValueError(f"{prefix}.ctc_decay_from must be 0 (off) or, with ctc_weight > 0, in (0, max_updates = "
                             f"{self.max_updates}), got {self.ctc_decay_from}")
