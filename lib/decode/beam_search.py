"""Batched beam search and greedy decoding for the S2T Transformer (fairseq ``SequenceGenerator``).

The model is anything exposing the :class:`lib.model.s2t_transformer.S2TTransformer` decoding API::

    enc = model.encode(feats, feat_lengths, task=task)        # EncoderOutput (.lengths, .reorder)
    logits = model.decode(prefix, enc, incremental_state)      # (N, 1, V) for the last position
    model.reorder_incremental_state(state, new_order)

Conventions (fairseq's, unless stated)
--------------------------------------
* The decoder's first input is ``eos`` (or ``bos``: a start token per sentence, e.g. the target-language
  tag of a multilingual model, docs/variants.md); returned hypotheses are token ids *without*
  the start token and without the final ``eos``.
* Score of a finished hypothesis = (sum of token log-probs, the final ``eos`` included)
  / ``len ** len_penalty`` where ``len`` counts the tokens *including* the final ``eos``
  (fairseq: ``eos_scores /= (step + 1) ** len_penalty``). Log-probs are computed in float32.
* ``pad`` is never generated; ``unk`` log-probs are lowered by ``unk_penalty``; ``eos`` is blocked
  while fewer than ``min_len`` tokens have been generated.
* Maximum output length, **per sentence**: ``max_len = min(int(max_len_a * src_len + max_len_b),
  cap)`` tokens (``eos`` not counted), where ``src_len`` is the sentence's *encoder* length after
  the conv subsampling (``enc.lengths``, ~frames / 4) and ``cap = max_target_positions - 1``
  (fairseq's ``max_decoder_positions() - 1``; 1023 when the model has no ``cfg``). fairseq's
  S2T generator uses the padded batch width in input frames instead; a per-sentence length makes
  the output independent of the batch composition. With ``max_len_a = 0`` (the default, as in
  fairseq's MuST-C recipe) the limit is just ``max_len_b``. At step ``max_len`` only ``eos`` is
  allowed, so every search ends.
* Early stopping is fairseq's: at each step the ``2 * beam`` best extensions are ranked, ``eos``
  extensions among the first ``beam`` of them are finalised (up to ``beam`` finished hypotheses per
  sentence, in score order), and the best ``beam`` non-``eos`` extensions stay active. A sentence
  is done once it has ``beam`` finished hypotheses (or reached its ``max_len``); the answer is the
  finished hypothesis with the best normalised score. As in fairseq, an active hypothesis that
  might still have overtaken the finished ones after length normalisation is not pursued.
  With ``beam`` >= the number of possible outputs, nothing is pruned and the search is exhaustive.
* Finished sentences are dropped from the decoder batch (encoder output and cache reordered), and
  every sentence only ever competes with its own hypotheses, so a sentence's result does not
  depend on the other sentences in its batch (the model masks padding; see the model docstring).
* ``beam_search(beam=1)`` and :func:`greedy_search` give the same output.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["BeamSearchConfig", "beam_search", "greedy_search", "translate_dataset", "max_output_lengths"]

DEFAULT_MAX_TARGET_POSITIONS = 1024


@dataclass
class BeamSearchConfig:
    beam: int = 5
    max_len_a: float = 0.0
    max_len_b: int = 200
    len_penalty: float = 1.0
    min_len: int = 1
    no_repeat_ngram: int = 0
    unk_penalty: float = 0.0

    def validate(self) -> None:
        if self.beam < 1:
            raise ValueError(f"beam must be >= 1, got {self.beam}")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise ValueError(f"max_len_a / max_len_b must be >= 0, got {self.max_len_a} / {self.max_len_b}")
        if self.min_len < 0:
            raise ValueError(f"min_len must be >= 0, got {self.min_len}")
        if self.no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be >= 0, got {self.no_repeat_ngram}")


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------


def _length_cap(model: nn.Module) -> int:
    cfg = getattr(model, "cfg", None)
    return int(getattr(cfg, "max_target_positions", DEFAULT_MAX_TARGET_POSITIONS)) - 1


def max_output_lengths(model: nn.Module, enc_lengths: Tensor, max_len_a: float, max_len_b: int) -> list[int]:
    """Per-sentence maximum number of output tokens (eos excluded), see the module docstring."""
    cap = _length_cap(model)
    return [max(0, min(int(max_len_a * n + max_len_b), cap)) for n in enc_lengths.tolist()]


class _Restore:
    """``model.eval()`` + ``torch.inference_mode()``; the training flag is restored on exit."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.inference = torch.inference_mode()

    def __enter__(self) -> None:
        self.was_training = self.model.training
        self.model.eval()
        self.inference.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.inference.__exit__(*exc)
        self.model.train(self.was_training)


def _mask_lprobs(lprobs: Tensor, step: int, max_lens: Tensor, *, min_len: int, unk_penalty: float,
                 eos: int, pad: int, unk: int) -> Tensor:
    """In place on (N, V) float32 log-probs; ``max_lens`` (N,) per row."""
    lprobs.nan_to_num_(nan=-math.inf)
    lprobs[:, pad] = -math.inf
    if unk_penalty:
        lprobs[:, unk] -= unk_penalty
    if step < min_len:
        lprobs[:, eos] = -math.inf
    at_max = max_lens <= step
    if bool(at_max.any()):  # only eos allowed (overrides min_len)
        eos_lp = lprobs[:, eos].clone()
        lprobs[at_max] = -math.inf
        lprobs[:, eos] = torch.where(at_max, eos_lp, lprobs[:, eos])
    return lprobs


def _block_repeated_ngrams(lprobs: Tensor, tokens: Tensor, n: int) -> None:
    """fairseq ``NGramRepeatBlock``: ban tokens that would repeat an n-gram of ``tokens`` (N, S)
    (the leading eos included, as in fairseq)."""
    seq_len = tokens.size(1)
    if n <= 0 or seq_len + 1 < n:
        return
    rows = tokens.tolist()
    for r, toks in enumerate(rows):
        key = tuple(toks[seq_len - n + 1:]) if n > 1 else ()
        banned = {toks[i + n - 1] for i in range(seq_len - n + 1) if tuple(toks[i:i + n - 1]) == key}
        if banned:
            lprobs[r, list(banned)] = -math.inf


# ----------------------------------------------------------------------------------------
# Beam search
# ----------------------------------------------------------------------------------------


def _start_tokens(bos: Tensor | int | None, eos: int, batch: int, device: torch.device) -> Tensor:
    """(B, 1) first decoder inputs: ``bos`` (an int for every sentence, or a (B,) tensor), else ``eos``."""
    if bos is None:
        bos = eos
    if isinstance(bos, Tensor):
        if bos.shape != (batch,):
            raise ValueError(f"bos must be an int or a ({batch},) tensor, got shape {tuple(bos.shape)}")
        return bos.to(device=device, dtype=torch.long)[:, None]
    return torch.full((batch, 1), int(bos), dtype=torch.long, device=device)


def beam_search(model: nn.Module, feats: Tensor, feat_lengths: Tensor, cfg: BeamSearchConfig, *, eos: int = 2,
                pad: int = 1, unk: int = 3, task: Tensor | None = None,
                bos: Tensor | int | None = None) -> list[list[int]]:
    """Batched beam search over ``feats`` (B, T, n_mels) / ``feat_lengths`` (B,).

    All B * beam hypotheses run through the decoder at once with an incremental cache. Returns the
    best hypothesis per input (token ids, no start token, no eos). ``task`` (B,) reaches the encoder
    (and, through ``EncoderOutput.task``, the decoder); ``bos`` is the first decoder input (default
    ``eos``). See the module docstring for the scoring, maximum-length and early-stopping conventions.
    """
    cfg.validate()
    K = cfg.beam
    B = feats.size(0)
    if B == 0:
        return []
    with _Restore(model):
        enc = model.encode(feats, feat_lengths, task=task)
        device = enc.out.device
        max_lens_all = max_output_lengths(model, enc.lengths, cfg.max_len_a, cfg.max_len_b)
        finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]

        # Every sentence repeated K times: row b * K + k is hypothesis k of sentence b.
        alive = list(range(B))  # original index of each sentence still in the batch
        enc = enc.reorder(torch.arange(B, device=device).repeat_interleave(K))
        tokens = _start_tokens(bos, eos, B, device).repeat_interleave(K, dim=0)
        scores = torch.zeros(B, K, dtype=torch.float32, device=device)
        scores[:, 1:] = -math.inf  # all beams are identical at step 0: expand only the first
        max_lens = torch.tensor(max_lens_all, dtype=torch.long, device=device)
        state: dict = {}

        step = 0
        while alive:
            n = len(alive)
            logits = model.decode(tokens, enc, state)[:, -1, :]
            lprobs = torch.log_softmax(logits.float(), dim=-1)
            V = lprobs.size(-1)
            _mask_lprobs(lprobs, step, max_lens.repeat_interleave(K), min_len=cfg.min_len,
                         unk_penalty=cfg.unk_penalty, eos=eos, pad=pad, unk=unk)
            if cfg.no_repeat_ngram > 0:
                _block_repeated_ngrams(lprobs, tokens, cfg.no_repeat_ngram)

            cand = (scores[:, :, None] + lprobs.view(n, K, V)).view(n, K * V)
            n_cand = min(2 * K, K * V)
            cand_scores, cand_idx = cand.topk(n_cand, dim=1)  # sorted, best first
            cand_beam = torch.div(cand_idx, V, rounding_mode="floor")
            cand_tok = cand_idx % V
            is_eos = cand_tok.eq(eos)

            # Finalise eos candidates within the first K (fairseq), finite scores only.
            position = torch.arange(n_cand, device=device)[None, :]
            fin = is_eos & (position < K) & torch.isfinite(cand_scores)
            done_now = [False] * n
            if bool(fin.any()):
                fin_rows, fin_cols = fin.nonzero(as_tuple=True)
                src_rows = fin_rows * K + cand_beam[fin_rows, fin_cols]
                hyp_tokens = tokens[src_rows, 1:].tolist()
                raw = cand_scores[fin_rows, fin_cols].tolist()
                norm = (step + 1) ** cfg.len_penalty
                for r, toks, s in zip(fin_rows.tolist(), hyp_tokens, raw):
                    store = finished[alive[r]]
                    if len(store) < K:
                        store.append((s / norm, toks))
            for r in range(n):
                if len(finished[alive[r]]) >= K or step >= max_lens_all[alive[r]]:
                    done_now[r] = True

            # Next active hypotheses: the first K non-eos candidates, in score order.
            order_key = is_eos.long() * n_cand + position  # non-eos first, stable
            pick = order_key.argsort(dim=1)[:, :K]
            next_scores = cand_scores.gather(1, pick)
            next_beam = cand_beam.gather(1, pick)
            next_tok = cand_tok.gather(1, pick)

            keep = [r for r in range(n) if not done_now[r]]
            if not keep:
                break
            if len(keep) < n:  # drop finished sentences from the batch
                keep_t = torch.tensor(keep, dtype=torch.long, device=device)
                next_scores, next_beam, next_tok = next_scores[keep_t], next_beam[keep_t], next_tok[keep_t]
                max_lens = max_lens[keep_t]
                alive = [alive[r] for r in keep]
            else:
                keep_t = torch.arange(n, device=device)
            # rows of the current batch that the new hypotheses extend
            src = (keep_t[:, None] * K + next_beam).view(-1)
            if len(keep) < n:  # encoder rows of one sentence are identical: any of its rows will do
                enc = enc.reorder(src)
            tokens = torch.cat([tokens[src], next_tok.reshape(-1, 1)], dim=1)
            # cross-attention caches only when a sentence left the batch (otherwise each row keeps
            # its sentence, whose rows hold the same encoder keys / values)
            model.reorder_incremental_state(state, src, cross=len(keep) < n)
            scores = next_scores
            step += 1

    out: list[list[int]] = []
    for store in finished:
        if not store:  # only possible if every hypothesis had -inf score
            out.append([])
            continue
        out.append(max(store, key=lambda t: t[0])[1])
    return out


# ----------------------------------------------------------------------------------------
# Greedy search
# ----------------------------------------------------------------------------------------


def greedy_search(model: nn.Module, feats: Tensor, feat_lengths: Tensor, max_len_a: float = 0.0,
                  max_len_b: int = 200, *, min_len: int = 1, unk_penalty: float = 0.0, eos: int = 2,
                  pad: int = 1, unk: int = 3, task: Tensor | None = None,
                  bos: Tensor | int | None = None) -> list[list[int]]:
    """Argmax decoding (beam = 1 fast path, same output as ``beam_search`` with ``beam=1``); ``task``
    and ``bos`` as for :func:`beam_search`."""
    B = feats.size(0)
    if B == 0:
        return []
    with _Restore(model):
        enc = model.encode(feats, feat_lengths, task=task)
        device = enc.out.device
        max_lens_all = max_output_lengths(model, enc.lengths, max_len_a, max_len_b)
        max_lens = torch.tensor(max_lens_all, dtype=torch.long, device=device)
        alive = list(range(B))
        tokens = _start_tokens(bos, eos, B, device)
        out: list[list[int]] = [[] for _ in range(B)]
        state: dict = {}
        step = 0
        while alive:
            logits = model.decode(tokens, enc, state)[:, -1, :]
            lprobs = _mask_lprobs(torch.log_softmax(logits.float(), dim=-1), step, max_lens, min_len=min_len,
                                  unk_penalty=unk_penalty, eos=eos, pad=pad, unk=unk)
            nxt = lprobs.argmax(dim=-1)
            ended = nxt.eq(eos) | (max_lens <= step)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            ended_l = ended.tolist()
            if any(ended_l):
                for r, e in enumerate(ended_l):
                    if e:
                        out[alive[r]] = tokens[r, 1:-1].tolist()
                keep = [r for r, e in enumerate(ended_l) if not e]
                if not keep:
                    break
                keep_t = torch.tensor(keep, dtype=torch.long, device=device)
                tokens, max_lens = tokens[keep_t], max_lens[keep_t]
                enc = enc.reorder(keep_t)
                model.reorder_incremental_state(state, keep_t)
                alive = [alive[r] for r in keep]
            step += 1
    return out


# ----------------------------------------------------------------------------------------
# Dataset translation
# ----------------------------------------------------------------------------------------


def translate_dataset(model: nn.Module, dataset: Any, batch_max_frames: int, cfg: BeamSearchConfig,
                      device: torch.device | str, progress: bool = True, *,
                      task: int | None = None, amp: str = "none", bos: int | None = None) -> list[str]:
    """Decode every utterance of a :class:`lib.data.dataset.SpeechDataset`; detokenised
    hypotheses in dataset order. Batches are length-sorted (``batch_by_frames``, no shuffling).
    ``cfg.beam == 1`` (without n-gram blocking) takes the greedy fast path. ``task`` (a task id)
    is passed to the encoder as a (B,) tensor when given; ``bos`` (e.g. the target-language tag)
    replaces ``eos`` as the first decoder input; ``amp`` (a resolved precision,
    lib.train.loop.resolve_amp) runs the model under autocast."""
    from tqdm.auto import tqdm

    from lib.data.dataset import batch_by_frames, collate
    from lib.precision import autocast

    device = torch.device(device)
    hyps: list[str | None] = [None] * len(dataset)
    batches = batch_by_frames(dataset.n_frames, batch_max_frames, shuffle=False)
    greedy = cfg.beam == 1 and cfg.no_repeat_ngram == 0
    with tqdm(total=len(dataset), desc="decode", unit="sent", disable=not progress, dynamic_ncols=True) as bar:
        for indices in batches:
            batch = collate(dataset, indices)
            feats = batch.feats.to(device)
            lengths = batch.feat_lengths.to(device)
            task_t = None if task is None else torch.full((len(indices),), task, dtype=torch.long, device=device)
            with autocast(device, amp):
                ids = _decode_batch(model, feats, lengths, cfg, greedy, task_t, bos)
            for i, h in zip(indices, ids):
                hyps[i] = dataset.decode(h)
            bar.update(len(indices))
    assert all(h is not None for h in hyps)
    return hyps  # type: ignore[return-value]


def _decode_batch(model: nn.Module, feats: Tensor, lengths: Tensor, cfg: BeamSearchConfig, greedy: bool,
                  task: Tensor | None, bos: int | None = None) -> list[list[int]]:
    """Token ids of one batch: greedy fast path or beam search."""
    from lib.data.dataset import EOS_ID, PAD_ID, UNK_ID

    if greedy:
        return greedy_search(model, feats, lengths, cfg.max_len_a, cfg.max_len_b, min_len=cfg.min_len,
                             unk_penalty=cfg.unk_penalty, eos=EOS_ID, pad=PAD_ID, unk=UNK_ID, task=task, bos=bos)
    return beam_search(model, feats, lengths, cfg, eos=EOS_ID, pad=PAD_ID, unk=UNK_ID, task=task, bos=bos)
