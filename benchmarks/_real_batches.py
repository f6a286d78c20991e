"""Shared by the benchmarks that time training updates on the pipeline's own batches
(train_step_profile.py, processes_vs_threads.py, train_real_batches.py): the prepared training data of a pair, the demo
model with params.yaml's `model.overrides`, and one update as the pipeline makes it (autocast in the
run's precision, the criterion with its CTC weight, fused Adam)."""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lib.data.dataset import Batch, SpeechDataset  # noqa: E402
from lib.model.s2t_transformer import ModelConfig, S2TTransformer, model_config  # noqa: E402
from lib.params import Params, TrainConfig, load_params  # noqa: E402
from lib.precision import autocast, resolve_padding  # noqa: E402
from lib.train.loop import Criterion  # noqa: E402


def pipeline_data(task: str, pair: str) -> tuple[Params, TrainConfig, SpeechDataset, ModelConfig]:
    """(params.yaml, the task's training config (`train_asr` for "asr", `train_st` for "st"), the
    pair's prepared training set, the demo model's config with `model.overrides`)."""
    p = load_params(ROOT / "params.yaml")
    cfg = p.train_asr if task == "asr" else p.train_st
    ds = SpeechDataset(ROOT / p.data.prepared_dir / pair, "train", task, max_frames=cfg.max_frames_train)
    mcfg = model_config(p.model.size, vocab_size=ds.vocab_size,
                        ctc_vocab_size=ds.vocab_size if cfg.ctc_weight > 0 else None, **p.model.overrides)
    return p, cfg, ds, mcfg


def training_update(task: str, pair: str, amp: str) -> tuple[SpeechDataset, int, tuple[int, int], Callable[[Batch], None], S2TTransformer]:
    """(the pair's training set, the task's `max_frames`, the batch padding a run in ``amp`` uses
    (`pad_*: auto`), a function that makes one update on a batch, the model it trains), for
    ``task`` "asr" (`train_asr`) or "st" (`train_st`); the model initialised from seed 0."""
    _, cfg, ds, mcfg = pipeline_data(task, pair)
    pad = resolve_padding(cfg.pad_frames_to, cfg.pad_tokens_to, amp, torch.device("cpu"))
    torch.manual_seed(0)
    model = S2TTransformer(mcfg).train()
    crit = Criterion(model, cfg.label_smoothing, cfg.ctc_weight)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)

    def update(batch: Batch) -> None:
        with autocast(torch.device("cpu"), amp):
            loss, _ = crit(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return ds, cfg.max_frames, pad, update, model
