"""Beam / greedy search on models with a known output distribution, and on small random models."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import Tensor, nn

from lib.decode.beam_search import BeamSearchConfig, beam_search, greedy_search, max_output_lengths, translate_dataset
from lib.model.s2t_transformer import EncoderOutput, S2TTransformer, model_config

BOS, PAD, EOS, UNK = 0, 1, 2, 3


# ----------------------------------------------------------------------------------------
# A model whose next-token distribution is a fixed table of the prefix
# ----------------------------------------------------------------------------------------


class TableModel(nn.Module):
    """Same decoding API as S2TTransformer. Sentence ``b`` uses ``tables[int(feats[b, 0, 0])]``:
    a dict ``prefix (tuple of generated ids) -> {token: prob}``; an unlisted eos gets 1e-6, other
    unlisted tokens share the rest of the mass evenly; unlisted prefixes use ``default`` (token 4 at p=0.5). The incremental state holds the prefixes
    seen so far and checks that every call extends them (i.e. that reordering was done right)."""

    def __init__(self, tables: list[dict], vocab: int = 12, default: dict | None = None) -> None:
        super().__init__()
        self.tables, self.vocab = tables, vocab
        self.default = default if default is not None else {4: 0.5}
        self.dummy = nn.Parameter(torch.zeros(1))  # so that .to()/.eval() behave like a real model
        self.decode_rows = 0

    def lprobs(self, sid: int, prefix: tuple[int, ...]) -> Tensor:
        spec = dict(self.tables[sid].get(prefix, self.default))
        spec.setdefault(EOS, 1e-6)  # an unlisted eos is improbable (junk prefixes do not end early)
        rest = max(1.0 - sum(spec.values()), 1e-6)
        others = self.vocab - len(spec)
        probs = torch.full((self.vocab,), rest / max(others, 1), dtype=torch.float64)
        for tok, p in spec.items():
            probs[tok] = p
        return (probs / probs.sum()).log().float()

    def encode(self, feats: Tensor, feat_lengths: Tensor, task: Tensor | None = None) -> EncoderOutput:
        mask = torch.arange(feats.size(1), device=feats.device)[None, :] >= feat_lengths[:, None]
        return EncoderOutput(out=feats.masked_fill(mask[..., None], 0.0), padding_mask=mask,
                             lengths=feat_lengths.clone())

    def decode(self, prev_tokens: Tensor, enc: EncoderOutput, incremental_state: dict | None = None) -> Tensor:
        assert not self.training
        assert bool((prev_tokens[:, 0] == EOS).all()), "the decoder's first input must be eos"
        if incremental_state is not None:
            hist = incremental_state.get("hist")
            if hist is None:
                assert prev_tokens.size(1) == 1
            else:
                assert torch.equal(hist, prev_tokens[:, :-1]), "incremental state not reordered correctly"
            incremental_state["hist"] = prev_tokens.clone()
        self.decode_rows += prev_tokens.size(0)
        sids = enc.out[:, 0, 0].round().long().tolist()
        rows = [self.lprobs(s, tuple(r[1:])) for s, r in zip(sids, prev_tokens.tolist())]
        out = torch.stack(rows).to(prev_tokens.device)[:, None, :]
        return out if incremental_state is not None else out.expand(-1, prev_tokens.size(1), -1)

    def reorder_incremental_state(self, state: dict, new_order: Tensor, *, cross: bool = True) -> dict:
        state["hist"] = state["hist"].index_select(0, new_order)
        return state

    def score(self, sid: int, seq: list[int], len_penalty: float = 1.0) -> float:
        """fairseq score of ``seq`` + eos (unmasked log-probs; fine for sequences without pad/unk)."""
        full = list(seq) + [EOS]
        total = sum(float(self.lprobs(sid, tuple(full[:i]))[full[i]]) for i in range(len(full)))
        return total / len(full) ** len_penalty


def inputs(sids: list[int], lengths: list[int] | None = None) -> tuple[Tensor, Tensor]:
    lengths = lengths or [10] * len(sids)
    feats = torch.zeros(len(sids), max(lengths), 2)
    for b, s in enumerate(sids):
        feats[b, : lengths[b]] = float(s)
    return feats, torch.tensor(lengths)


def cfg(**kw) -> BeamSearchConfig:
    return BeamSearchConfig(**{"max_len_b": 20, **kw})


FORCED = {(): {5: 0.9}, (5,): {7: 0.9}, (5, 7): {9: 0.9}, (5, 7, 9): {EOS: 0.9}}
# Greedy takes 5 (p=0.6), after which every continuation is unlikely (p <= 0.15); beam finds 6 8.
GREEDY_TRAP = {(): {5: 0.6, 6: 0.4}, (6,): {8: 0.95}, (6, 8): {EOS: 0.95}, (5,): {4: 0.15}}
# Raw score prefers [5] (log .5 + log .5); length-normalised score prefers [6, 6, 6].
LENGTHS = {(): {5: 0.51, 6: 0.49}, (5,): {EOS: 0.5}, (6,): {6: 0.7}, (6, 6): {6: 0.7}, (6, 6, 6): {EOS: 0.7}}


# ----------------------------------------------------------------------------------------
# Table-model tests
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("beam", [1, 2, 5])
def test_forced_output(beam: int) -> None:
    model = TableModel([FORCED])
    feats, lens = inputs([0, 0])
    assert beam_search(model, feats, lens, cfg(beam=beam)) == [[5, 7, 9], [5, 7, 9]]
    assert greedy_search(model, feats, lens, 0.0, 20) == [[5, 7, 9], [5, 7, 9]]


def test_beam_beats_greedy() -> None:
    model = TableModel([GREEDY_TRAP])
    feats, lens = inputs([0])
    g = greedy_search(model, feats, lens, 0.0, 20)[0]
    b = beam_search(model, feats, lens, cfg(beam=2))[0]
    assert g[0] == 5
    assert b == [6, 8]
    assert model.score(0, b) > model.score(0, g)
    assert beam_search(model, feats, lens, cfg(beam=1))[0] == g  # beam 1 == greedy


def test_batch_with_different_tables() -> None:
    model = TableModel([FORCED, GREEDY_TRAP, LENGTHS])
    feats, lens = inputs([1, 0, 2, 0], [7, 10, 4, 9])
    assert beam_search(model, feats, lens, cfg(beam=3)) == [[6, 8], [5, 7, 9], [6, 6, 6], [5, 7, 9]]


def test_length_normalisation_changes_winner() -> None:
    model = TableModel([LENGTHS])
    feats, lens = inputs([0])
    assert beam_search(model, feats, lens, cfg(beam=2, len_penalty=0.0))[0] == [5]
    assert beam_search(model, feats, lens, cfg(beam=2, len_penalty=1.0))[0] == [6, 6, 6]
    assert model.score(0, [5], 0.0) > model.score(0, [6, 6, 6], 0.0)
    assert model.score(0, [5], 1.0) < model.score(0, [6, 6, 6], 1.0)


def test_max_len_respected() -> None:
    model = TableModel([{}], default={5: 0.999, EOS: 1e-9})  # never ends by itself
    feats, lens = inputs([0, 0], [10, 20])
    assert beam_search(model, feats, lens, cfg(beam=3, max_len_b=4)) == [[5] * 4, [5] * 4]
    assert greedy_search(model, feats, lens, 0.0, 4) == [[5] * 4, [5] * 4]
    # per-sentence limit max_len_a * src_len + max_len_b (src_len = encoder length)
    assert [len(h) for h in beam_search(model, feats, lens, cfg(beam=2, max_len_a=0.5, max_len_b=1))] == [6, 11]
    assert [len(h) for h in greedy_search(model, feats, lens, 0.5, 1)] == [6, 11]
    assert beam_search(model, feats, lens, cfg(beam=2, max_len_b=0)) == [[], []]  # max_len wins over min_len
    # capped at max_target_positions - 1
    model.cfg = model_config("tiny", vocab_size=12, max_target_positions=8)
    assert [len(h) for h in beam_search(model, feats, lens, cfg(beam=2, max_len_b=200))] == [7, 7]
    assert max_output_lengths(model, lens, 1.0, 0) == [7, 7]


def test_min_len() -> None:
    model = TableModel([{(): {EOS: 0.9}}], default={EOS: 0.9})
    feats, lens = inputs([0])
    assert len(beam_search(model, feats, lens, cfg(beam=2, min_len=1))[0]) == 1
    assert len(beam_search(model, feats, lens, cfg(beam=2, min_len=3))[0]) == 3
    assert beam_search(model, feats, lens, cfg(beam=2, min_len=0))[0] == []
    assert greedy_search(model, feats, lens, 0.0, 20, min_len=0)[0] == []
    assert len(greedy_search(model, feats, lens, 0.0, 20, min_len=2)[0]) == 2


def test_pad_never_generated_and_unk_penalty() -> None:
    model = TableModel([{(): {PAD: 0.8, 4: 0.15}, (4,): {EOS: 0.9}}])
    feats, lens = inputs([0])
    assert beam_search(model, feats, lens, cfg(beam=2))[0] == [4]
    model = TableModel([{(): {UNK: 0.6, 5: 0.4}, (UNK,): {EOS: 0.9}, (5,): {EOS: 0.9}}])
    assert beam_search(model, feats, lens, cfg(beam=2))[0] == [UNK]
    assert beam_search(model, feats, lens, cfg(beam=2, unk_penalty=1.0))[0] == [5]
    assert greedy_search(model, feats, lens, 0.0, 20, unk_penalty=1.0)[0] == [5]


def test_no_repeat_ngram() -> None:
    model = TableModel([{}], default={5: 0.6, 6: 0.2, EOS: 0.01})
    feats, lens = inputs([0])
    assert beam_search(model, feats, lens, cfg(beam=3, max_len_b=6))[0] == [5] * 6
    hyp = beam_search(model, feats, lens, cfg(beam=3, max_len_b=6, no_repeat_ngram=2))[0]
    seq = [EOS] + hyp
    bigrams = list(zip(seq, seq[1:]))
    assert len(hyp) == 6 and hyp[:3] == [5, 5, 6]  # (5, 5) may occur once; then 6 (p=.2) instead of 5
    assert len(bigrams) == len(set(bigrams))
    assert greedy_search(model, feats, lens, 0.0, 6)[0] == [5] * 6


class ModeRecordingModel(TableModel):
    """A TableModel that records, at every encode / decode call, whether inference mode is on and
    whether autograd records (``torch.is_inference_mode_enabled``, ``torch.is_grad_enabled``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.modes: list[tuple[bool, bool]] = []

    def _record(self) -> None:
        self.modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))

    def encode(self, *args, **kwargs) -> EncoderOutput:
        self._record()
        return super().encode(*args, **kwargs)

    def decode(self, *args, **kwargs) -> Tensor:
        self._record()
        return super().decode(*args, **kwargs)


def test_training_flag_restored_and_no_grad() -> None:
    """Both searches run the model in eval mode under ``torch.inference_mode()`` (no autograd graph,
    lib.decode.beam_search._Restore) -- every encode and decode call sees it -- and give back the
    caller's training flag and grad mode afterwards."""
    model = ModeRecordingModel([FORCED])
    model.train()
    feats, lens = inputs([0])
    assert torch.is_grad_enabled()
    assert beam_search(model, feats, lens, cfg(beam=2))[0] == [5, 7, 9]
    assert model.training
    assert len(model.modes) >= 2 and all(m == (True, False) for m in model.modes)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    model.modes.clear()
    model.eval()
    assert greedy_search(model, feats, lens)[0] == [5, 7, 9]
    assert not model.training
    assert len(model.modes) >= 2 and all(m == (True, False) for m in model.modes)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def test_finished_sentences_leave_the_batch() -> None:
    # sentence 0 has its 2 finished hypotheses after 2 steps, sentence 1 runs to max_len 12
    model = TableModel([{(): {4: 0.5, 6: 0.5}, (4,): {EOS: 0.99}, (6,): {EOS: 0.99}}, {}],
                       default={5: 0.99, EOS: 1e-9})
    feats, lens = inputs([0, 1])
    out = beam_search(model, feats, lens, cfg(beam=2, max_len_b=12))
    assert out == [[4], [5] * 12]
    assert model.decode_rows == 2 * (2 * 2) + 11 * 2  # 2 joint steps, then only sentence 1's 2 rows
    model.decode_rows = 0
    assert greedy_search(model, feats, lens, 0.0, 12) == [[4], [5] * 12]
    assert model.decode_rows == 2 * 2 + 11


# ----------------------------------------------------------------------------------------
# Real (random) S2T Transformer
# ----------------------------------------------------------------------------------------


def random_model(vocab: int, seed: int = 0, sharpen: float = 4.0) -> S2TTransformer:
    torch.manual_seed(seed)
    model = S2TTransformer(model_config("tiny", vocab_size=vocab, n_mels=8)).eval()
    with torch.no_grad():  # a peakier output distribution: fewer near-ties, more varied lengths
        model.decoder.output_projection.weight.mul_(sharpen)
    return model


def random_feats(lengths: list[int], seed: int = 1) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    feats = torch.zeros(len(lengths), max(lengths), 8)
    for b, n in enumerate(lengths):
        feats[b, :n] = torch.randn(n, 8, generator=g)
    return feats, torch.tensor(lengths)


def test_batch_composition_invariance() -> None:
    model = random_model(vocab=24, seed=1)
    feats, lens = random_feats([23, 61, 40])
    c = cfg(beam=4, max_len_b=12)
    batched = beam_search(model, feats, lens, c)
    greedy_batched = greedy_search(model, feats, lens, 0.0, 12)
    assert len({tuple(h) for h in batched}) > 1  # the model's output depends on its input
    for b, n in enumerate(lens.tolist()):
        alone = beam_search(model, feats[b: b + 1, :n], lens[b: b + 1], c)[0]
        assert alone == batched[b]
        assert greedy_search(model, feats[b: b + 1, :n], lens[b: b + 1], 0.0, 12)[0] == greedy_batched[b]
    # order within the batch does not matter either
    perm = [2, 0, 1]
    assert beam_search(model, feats[perm], lens[perm], c) == [batched[i] for i in perm]


def test_greedy_equals_beam_one() -> None:
    model = random_model(vocab=30, seed=3)
    feats, lens = random_feats([30, 45, 17, 52], seed=4)
    assert greedy_search(model, feats, lens, 0.0, 15) == beam_search(model, feats, lens, cfg(beam=1, max_len_b=15))


def exhaustive_best(model: S2TTransformer, feats: Tensor, lens: Tensor, max_len: int, len_penalty: float,
                    allowed: list[int]) -> list[list[int]]:
    """Score every sequence of 1..max_len allowed tokens (+ eos) with teacher forcing."""
    seqs = [list(s) for n in range(1, max_len + 1) for s in itertools.product(allowed, repeat=n)]
    best = []
    with torch.no_grad():
        for b in range(feats.size(0)):
            n_frames = int(lens[b])
            f = feats[b: b + 1, :n_frames].expand(len(seqs), -1, -1)
            L = max_len + 1
            prev = torch.full((len(seqs), L), PAD, dtype=torch.long)
            tgt = torch.full((len(seqs), L), PAD, dtype=torch.long)
            for i, s in enumerate(seqs):
                prev[i, : len(s) + 1] = torch.tensor([EOS] + s)
                tgt[i, : len(s) + 1] = torch.tensor(s + [EOS])
            lp = torch.log_softmax(model(f, lens[b: b + 1].expand(len(seqs)), prev).float(), dim=-1)
            tok_lp = lp.gather(2, tgt.clamp(min=0)[..., None])[..., 0].masked_fill(tgt.eq(PAD), 0.0)
            scores = tok_lp.sum(1) / torch.tensor([len(s) + 1 for s in seqs], dtype=torch.float) ** len_penalty
            best.append(seqs[int(scores.argmax())])
    return best


@pytest.mark.parametrize("len_penalty", [0.0, 0.5, 1.0, 2.0])
def test_beam_equals_exhaustive_search(len_penalty: float) -> None:
    vocab, max_len = 6, 3
    allowed = [t for t in range(vocab) if t not in (PAD, EOS)]  # bos, unk, 4, 5
    n_candidates = sum(len(allowed) ** n for n in range(1, max_len + 1))  # 84
    model = random_model(vocab=vocab, seed=5, sharpen=2.0)
    feats, lens = random_feats([19, 33], seed=6)
    expected = exhaustive_best(model, feats, lens, max_len, len_penalty, allowed)
    got = beam_search(model, feats, lens, cfg(beam=n_candidates, max_len_b=max_len, len_penalty=len_penalty))
    assert got == expected


def test_real_model_max_len_a() -> None:
    model = random_model(vocab=16, seed=7)
    feats, lens = random_feats([40, 80])
    enc_lens = model.encode(feats, lens).lengths.tolist()  # subsampled: 10, 20
    assert enc_lens == [10, 20]
    assert max_output_lengths(model, model.encode(feats, lens).lengths, 0.5, 2) == [7, 12]
    for h, n in zip(beam_search(model, feats, lens, cfg(beam=3, max_len_a=0.5, max_len_b=2)), [7, 12]):
        assert 1 <= len(h) <= n


# ----------------------------------------------------------------------------------------
# translate_dataset
# ----------------------------------------------------------------------------------------


class FakeDataset:
    """Duck-typed SpeechDataset: what ``batch_by_frames`` / ``collate`` / ``decode`` use."""

    def __init__(self, sids: list[int], n_frames: list[int]) -> None:
        self.sids = sids
        self.n_frames = n_frames
        self.targets = [[4, EOS] for _ in sids]
        self.rows = [{"id": f"utt{i}", "src_text": "", "tgt_text": ""} for i in range(len(sids))]

    def __len__(self) -> int:
        return len(self.sids)

    def features(self, i: int) -> Tensor:
        return torch.full((self.n_frames[i], 2), float(self.sids[i]))

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(i) for i in ids if i > UNK)


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_dataset_order(beam: int) -> None:
    model = TableModel([FORCED, GREEDY_TRAP, LENGTHS, {(): {UNK: 0.9}, (UNK,): {8: 0.9}, (UNK, 8): {EOS: 0.9}}])
    sids = [0, 1, 2, 3, 0, 2, 1]
    ds = FakeDataset(sids, [50, 10, 30, 20, 40, 5, 60])
    hyps = translate_dataset(model, ds, batch_max_frames=80, cfg=cfg(beam=beam), device="cpu", progress=False)
    per_sent = [beam_search(model, *inputs([s]), cfg(beam=beam))[0] for s in sids]
    assert hyps == [ds.decode(h) for h in per_sent]  # dataset order, whatever the batching
    assert hyps[0] == hyps[4] == "5 7 9" and hyps[3] == "8"  # unk dropped by decode
    if beam > 1:
        assert hyps[1] == hyps[6] == "6 8" and hyps[2] == hyps[5] == "6 6 6"
    else:
        assert hyps[1].startswith("5 4") and hyps[2] == "5"


def test_translate_dataset_progress_bar_runs(capsys: pytest.CaptureFixture) -> None:
    model = TableModel([FORCED])
    ds = FakeDataset([0, 0, 0], [5, 6, 7])
    assert translate_dataset(model, ds, 12, cfg(beam=2), torch.device("cpu"), progress=True) == ["5 7 9"] * 3
    assert "3/3" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    model = random_model(vocab=24)
    feats, lens = random_feats([23, 61, 40])
    c = cfg(beam=4, max_len_b=12)
    cpu = beam_search(model, feats, lens, c)
    gpu = beam_search(model.cuda(), feats.cuda(), lens.cuda(), c)
    assert gpu == cpu
    assert greedy_search(model, feats.cuda(), lens.cuda(), 0.0, 12) == greedy_search(model.cpu(), feats, lens, 0.0, 12)


def test_table_model_score() -> None:
    assert math.isclose(TableModel([FORCED]).score(0, [5, 7, 9], 1.0), 4 * math.log(0.9) / 4, rel_tol=1e-5)


# ----------------------------------------------------------------------------------------
# Mutation-audit additions: fairseq's "eos within the first beam" rule, per-sentence length
# ----------------------------------------------------------------------------------------


def test_eos_ranked_beyond_the_first_beam_candidates_is_not_finalised() -> None:
    """fairseq finalises an eos candidate only when it ranks among the first ``beam`` of the 2·beam
    candidates. At step 0 eos (p = .31) ranks third behind 5 (.35) and 6 (.34), so with beam 2 the
    empty hypothesis is never finished, although its raw score log .31 = -1.171 beats both finished
    ones (min_len 0, len_penalty 0: [5] = log .35 + log .6 = -1.561, [6] = log .34 + log .6 = -1.590). A search
    that finalised every eos among the 2·beam candidates would return []."""
    model = TableModel([{(): {5: 0.35, 6: 0.34, EOS: 0.31}, (5,): {EOS: 0.6}, (6,): {EOS: 0.6}}])
    feats, lens = inputs([0])
    assert model.score(0, [], 0.0) == pytest.approx(math.log(0.31), abs=1e-6)
    assert model.score(0, [], 0.0) > model.score(0, [5], 0.0) > model.score(0, [6], 0.0)
    assert beam_search(model, feats, lens, cfg(beam=2, len_penalty=0.0, min_len=0)) == [[5]]
    # with beam 3 the eos is within the first beam: the empty hypothesis is finished and wins
    assert beam_search(model, feats, lens, cfg(beam=3, len_penalty=0.0, min_len=0)) == [[]]


class _SubsamplingTableModel(TableModel):
    """A TableModel whose encoder output is half as long as its input (as a conv subsampler)."""

    def encode(self, feats: Tensor, feat_lengths: Tensor, task: Tensor | None = None) -> EncoderOutput:
        enc = super().encode(feats, feat_lengths, task)
        return EncoderOutput(out=enc.out, padding_mask=enc.padding_mask, lengths=feat_lengths // 2)


def test_max_len_a_scales_the_encoder_length_not_the_input_frames() -> None:
    """max_len = max_len_a * enc.lengths + max_len_b (module docstring): with 8 and 12 input frames the
    encoder lengths are 4 and 6, so a = 1, b = 1 allows 5 and 7 tokens (not 9 and 13)."""
    model = _SubsamplingTableModel([{}], default={5: 0.999, EOS: 1e-9})  # never ends by itself
    feats, lens = inputs([0, 0], [8, 12])
    assert [len(h) for h in beam_search(model, feats, lens, cfg(beam=2, max_len_a=1.0, max_len_b=1))] == [5, 7]
    assert [len(h) for h in greedy_search(model, feats, lens, 1.0, 1)] == [5, 7]
