"""Translation / recognition metrics: sacreBLEU BLEU and chrF, WER, paired bootstrap resampling.

* BLEU and chrF are sacreBLEU's corpus scores with its defaults (BLEU: 13a tokenisation, mixed
  case, exp smoothing; chrF2: 6 char n-gram orders, no word n-grams), computed on detokenised
  hypotheses against the raw references, one reference per segment. They equal the CLI's
  ``sacrebleu refs.txt -i hyps.txt -m bleu chrf -b``.
* WER (percent) lowercases, deletes every character whose Unicode category starts with "P"
  (punctuation), splits on whitespace, and divides the summed word-level Levenshtein distances by
  the total number of reference words.
* :func:`paired_bootstrap` runs sacreBLEU's own paired bootstrap resampling
  (``sacrebleu.significance.PairedTest(test_type="bs")``, as ``sacrebleu --paired-bs``).
"""
from __future__ import annotations

import os
import unicodedata
from contextlib import contextmanager
from typing import Iterator, Sequence

from sacrebleu.metrics import BLEU, CHRF

__all__ = ["bleu", "bleu_signature", "chrf", "edit_distance", "normalize_for_wer", "paired_bootstrap", "wer"]


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses vs {len(refs)} references")


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """sacreBLEU corpus BLEU (default settings, 13a tokenisation)."""
    _check(hyps, refs)
    return float(BLEU().corpus_score(list(hyps), [list(refs)]).score)


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """sacreBLEU corpus chrF2 (default settings)."""
    _check(hyps, refs)
    return float(CHRF().corpus_score(list(hyps), [list(refs)]).score)


def bleu_signature() -> str:
    """sacreBLEU's BLEU signature for :func:`bleu`, e.g.
    ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``."""
    metric = BLEU()
    metric.corpus_score(["x"], [["x"]])  # the signature needs the number of references
    return str(metric.get_signature())


# ----------------------------------------------------------------------------------------
# WER
# ----------------------------------------------------------------------------------------


def normalize_for_wer(text: str) -> list[str]:
    """Lowercase, delete Unicode punctuation (category P*), split on whitespace."""
    text = "".join(ch for ch in text.lower() if not unicodedata.category(ch).startswith("P"))
    return text.split()


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance (unit cost insert / delete / substitute) between two sequences."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


def wer(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus word error rate in percent (see the module docstring for the normalisation).

    ValueError when the references have no words at all."""
    _check(hyps, refs)
    errors = n_ref = 0
    for h, r in zip(hyps, refs):
        r_words = normalize_for_wer(r)
        errors += edit_distance(normalize_for_wer(h), r_words)
        n_ref += len(r_words)
    if n_ref == 0:
        raise ValueError("WER undefined: the references contain no words")
    return 100.0 * errors / n_ref


# ----------------------------------------------------------------------------------------
# Paired bootstrap resampling
# ----------------------------------------------------------------------------------------


@contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacreBLEU reads its resampling seed from ``$SACREBLEU_SEED``; set it temporarily."""
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SACREBLEU_SEED", None)
        else:
            os.environ["SACREBLEU_SEED"] = old


def paired_bootstrap(sys_a: Sequence[str], sys_b: Sequence[str], refs: Sequence[str], n_samples: int = 1000,
                     seed: int = 12345) -> dict:
    """sacreBLEU's paired bootstrap resampling test for BLEU, ``sys_a`` being the baseline.

    Same numbers as ``SACREBLEU_SEED=<seed> sacrebleu refs -i sys_a sys_b -m bleu --paired-bs
    --paired-bs-n <n_samples>``. Returns::

        {"p_value": p (sys_b vs sys_a; (c + 1) / (n_samples + 1)),
         "a": {"score", "mean", "ci"}, "b": {"score", "mean", "ci"},   # BLEU, bootstrap mean, 95% CI half-width
         "n_samples": n_samples, "seed": seed, "signature": "...|bs:1000|seed:12345|..."}

    A system's 95% interval is ``mean ± ci``. (sacreBLEU treats ``seed=0`` as "unseeded" for the
    second system's resamples; use a non-zero seed.) The p-value counts resamples whose centred |Δ*|
    (|Δ*| − mean |Δ*|) exceeds the observed |Δ|, in the upper tail only: for a Δ a few bootstrap SEs from 0
    it is about the one-sided p in the observed direction (half a two-sided one), and at Δ = 0 about
    0.4, not 1.
    """
    from sacrebleu.significance import PairedTest

    _check(sys_a, refs)
    _check(sys_b, refs)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    with _sacrebleu_seed(seed):
        test = PairedTest([("a", list(sys_a)), ("b", list(sys_b))], {"BLEU": BLEU()}, [list(refs)],
                          test_type="bs", n_samples=n_samples)
        signatures, scores = test()
    (name,) = [k for k in scores if k != "System"]
    res_a, res_b = scores[name]

    def pack(r) -> dict[str, float]:
        return {"score": float(r.score), "mean": float(r.mean), "ci": float(r.ci)}

    return {"p_value": float(res_b.p_value), "a": pack(res_a), "b": pack(res_b), "n_samples": n_samples,
            "seed": seed, "signature": str(signatures[name])}
