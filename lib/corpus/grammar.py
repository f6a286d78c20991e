"""Synthetic parallel-text generator: English sentences with German, Spanish and Italian translations.

A sentence is first sampled as a language-independent tree (:class:`Sentence`)
and then *realised* in each language by language-specific rules (agreement,
case, word order, negation, questions), never by word-for-word substitution.

Supported constructions (each is implemented completely for all four languages):

* Noun phrases: definite article (any number) or indefinite article (singular
  only), at most one adjective.  English/German adjectives precede the noun,
  Spanish/Italian adjectives follow it and agree in gender and number.  German
  articles and adjectives are declined for case (nom / acc / dat; weak
  declension after *der*, mixed after *ein*/*kein*), German weak masculine
  nouns (*den Studenten*) and dative plural *-n* are handled.  Italian articles
  depend on the next sound (il / lo / l' / i / gli, un / uno / un').
* Clauses: intransitive (*the dog sleeps*), transitive (*the dog sees the cat*;
  German dative object for *helfen*; Spanish personal *a* before animate
  objects, *a + el = al*), "that"-complements (*the man knows that ...*), and
  an adverbial subordinate clause (*... because / while ...*).  German
  subordinate clauses are verb-final; German main clauses are V2.
* Prepositional phrases: locative (*on / in / under* + place, German dative,
  *im*; Spanish *debajo del*; Italian *nel / sul / sotto il*) and comitative
  *with* (*mit dem ...*, *con il ...*).
* Plural subjects/objects with 3rd-person verb agreement.
* Negation: English *does not*; Spanish *no* / Italian *non* before the verb;
  German *nicht* (after a definite object, before a *with*-PP) or *kein*
  replacing an indefinite object's article (Spanish *ningún*, Italian *nessun*).
* Yes/no questions: English *do*-support, German verb-first, Spanish ``¿...?``,
  Italian ``...?`` (declarative order).

Restrictions that keep every realisation grammatical (enforced by
:func:`validate`): negation is not combined with a locative PP, a "that"
complement on the same clause, or an indefinite subject; questions are not
negated and carry no adverbial clause; complement clauses are not nested; a
sentence has at most one subordinate clause; places only occur (singular,
definite) inside locative PPs; *with*-PP nouns are definite; indefinite noun
phrases are singular.

Everything random is drawn from the ``random.Random`` passed in; the module
uses no global random state, so a seed gives identical output on every machine.
"""

from __future__ import annotations

import random
from typing import Optional, Sequence

from lib.corpus.lexicon import (
    ADJECTIVES,
    CLAUSE_SUBJECTS,
    CONJUNCTIONS,
    LOCATIVE_PREPS,
    NOUNS,
    VERBS,
)
from lib.corpus.realise import REALIZERS, _en_sentence, _finish
from lib.corpus.tree import Clause, NounPhrase, PrepPhrase, Sentence

__all__ = [
    "LANGUAGES",
    "ALL_LANGUAGES",
    "NounPhrase",
    "PrepPhrase",
    "Clause",
    "Sentence",
    "sample_sentence",
    "realize",
    "generate_corpus",
    "english_vocabulary",
    "english_words",
    "sentence_features",
    "validate",
    "MIN_WORDS",
    "MAX_WORDS",
]

LANGUAGES: tuple[str, ...] = ("de", "es", "it")
"""Target languages of the corpus."""
ALL_LANGUAGES: tuple[str, ...] = ("en",) + LANGUAGES
"""Languages accepted by :func:`realize` (source first)."""

MIN_WORDS = 3
MAX_WORDS = 10
"""Bounds (inclusive) on the number of English words in a sampled sentence."""


# --------------------------------------------------------------------------- #
# Validation
# --------------------------------------------------------------------------- #
def _noun_matches(noun_key: str, tags: frozenset[str]) -> bool:
    return noun_key in tags or bool(NOUNS[noun_key].tags & tags)


def _validate_np(np: NounPhrase, where: str) -> None:
    if np.noun not in NOUNS:
        raise ValueError(f"unknown noun {np.noun!r} in {where}")
    if np.adjective is not None and np.adjective not in ADJECTIVES:
        raise ValueError(f"unknown adjective {np.adjective!r} in {where}")
    if np.plural and not np.definite:
        raise ValueError(f"indefinite plural noun phrase not supported ({where})")
    if NOUNS[np.noun].cls == "place" and where != "locative PP":
        raise ValueError(f"place noun {np.noun!r} only allowed in a locative PP, not in {where}")


def _validate_clause(c: Clause, embedded: bool) -> None:
    if c.verb not in VERBS:
        raise ValueError(f"unknown verb {c.verb!r}")
    v = VERBS[c.verb]
    _validate_np(c.subject, "subject")
    if c.obj is not None:
        if not v.transitive:
            raise ValueError(f"verb {c.verb!r} takes no direct object")
        _validate_np(c.obj, "object")
    if c.complement is not None:
        if not v.clause:
            raise ValueError(f"verb {c.verb!r} takes no that-clause")
        if embedded:
            raise ValueError("nested that-clauses are not supported")
        if c.obj is not None or c.pp is not None:
            raise ValueError("a that-clause cannot be combined with an object or PP")
        if c.negated:
            raise ValueError("negating a clause with a that-complement is not supported")
        _validate_clause(c.complement, embedded=True)
    if c.obj is None and c.complement is None and not v.intransitive:
        raise ValueError(f"verb {c.verb!r} needs a direct object or a that-clause")
    if c.pp is not None:
        pp = c.pp
        if pp.prep == "with":
            if not v.with_tags:
                raise ValueError(f"verb {c.verb!r} takes no with-PP")
            _validate_np(pp.np, "with-PP")
            if not pp.np.definite:
                raise ValueError("with-PP noun phrases must be definite")
        elif pp.prep in LOCATIVE_PREPS:
            if not v.locative:
                raise ValueError(f"verb {c.verb!r} takes no locative PP")
            _validate_np(pp.np, "locative PP")
            noun = NOUNS[pp.np.noun]
            if noun.cls != "place" or pp.prep not in noun.preps:
                raise ValueError(f"locative PP {pp.prep!r} + {pp.np.noun!r} not supported")
            if pp.np.plural or not pp.np.definite:
                raise ValueError("locative PP noun phrases must be singular and definite")
            if c.negated:
                raise ValueError("negation combined with a locative PP is not supported")
        else:
            raise ValueError(f"unknown preposition {pp.prep!r}")
    if c.negated and not c.subject.definite:
        raise ValueError("negated clauses need a definite subject")


def validate(sentence: Sentence) -> None:
    """Raise ``ValueError`` if ``sentence`` uses a combination the realisers do not support."""
    _validate_clause(sentence.main, embedded=False)
    if (sentence.adjunct is None) != (sentence.conjunction is None):
        raise ValueError("conjunction and adjunct must be given together")
    if sentence.adjunct is not None:
        if sentence.conjunction not in CONJUNCTIONS:
            raise ValueError(f"unknown conjunction {sentence.conjunction!r}")
        if sentence.main.complement is not None:
            raise ValueError("at most one subordinate clause per sentence")
        _validate_clause(sentence.adjunct, embedded=True)
        if sentence.adjunct.complement is not None:
            raise ValueError("at most one subordinate clause per sentence")
    if sentence.question:
        if sentence.main.negated:
            raise ValueError("negated questions are not supported")
        if sentence.adjunct is not None:
            raise ValueError("questions with an adverbial clause are not supported")


# --------------------------------------------------------------------------- #
# Public realisation API
# --------------------------------------------------------------------------- #
_REALIZERS = REALIZERS


def realize(sentence: Sentence, lang: str) -> str:
    """Render ``sentence`` in ``lang`` ("en", "de", "es" or "it").

    The result starts with a capital letter (after "¿" in Spanish questions)
    and ends with "." or "?".

    Raises:
        ValueError: unknown ``lang`` (the message names it) or an unsupported sentence.
    """
    if lang not in _REALIZERS:
        raise ValueError(f"unsupported language {lang!r}; expected one of {ALL_LANGUAGES}")
    validate(sentence)
    return _finish(_REALIZERS[lang](sentence), sentence.question, lang)


def english_words(sentence: Sentence) -> list[str]:
    """Lowercase English words of ``sentence`` without punctuation (used for length limits)."""
    return _en_sentence(sentence)


def english_vocabulary() -> set[str]:
    """Every lowercase English word form the grammar can produce (no punctuation)."""
    vocab = {"the", "a", "not", "do", "does", "that", "with"}
    vocab |= set(LOCATIVE_PREPS) | set(CONJUNCTIONS)
    for noun in NOUNS.values():
        vocab.add(noun.en[0])
        if noun.cls != "place":
            vocab.add(noun.en[1])
    for adj in ADJECTIVES.values():
        vocab.add(adj.en)
    for verb in VERBS.values():
        vocab |= set(verb.en)
    # "an" only if some indefinite NP (never a place) can start with a vowel.
    starts = [a.en for a in ADJECTIVES.values() if a.classes - {"place"}]
    starts += [n.en[0] for n in NOUNS.values() if n.cls != "place"]
    if any(w[0] in "aeiou" for w in starts):
        vocab.add("an")
    return vocab


def sentence_features(sentence: Sentence) -> frozenset[str]:
    """Names of the constructions used by ``sentence`` (for tests and corpus statistics).

    Possible names: transitive, intransitive, adjective, locative_pp, with_pp,
    complement_clause, adverbial_clause, plural, negation, indefinite,
    negated_indefinite, question, dative_object.
    """
    feats: set[str] = set()
    if sentence.question:
        feats.add("question")
    if sentence.adjunct is not None:
        feats.add("adverbial_clause")
    clauses = [sentence.main]
    if sentence.main.complement is not None:
        feats.add("complement_clause")
        clauses.append(sentence.main.complement)
    if sentence.adjunct is not None:
        clauses.append(sentence.adjunct)
    for c in clauses:
        v = VERBS[c.verb]
        nps = [c.subject] + ([c.obj] if c.obj else []) + ([c.pp.np] if c.pp else [])
        if c.obj is not None:
            feats.add("transitive")
            if v.de_case == "dat":
                feats.add("dative_object")
        elif c.complement is None:
            feats.add("intransitive")
        if c.pp is not None:
            feats.add("with_pp" if c.pp.prep == "with" else "locative_pp")
        if c.negated:
            feats.add("negation")
            if c.obj is not None and not c.obj.definite:
                feats.add("negated_indefinite")
        for np in nps:
            if np.adjective:
                feats.add("adjective")
            if np.plural:
                feats.add("plural")
            if not np.definite:
                feats.add("indefinite")
    return frozenset(feats)


# --------------------------------------------------------------------------- #
# Sampling
# --------------------------------------------------------------------------- #
# Probabilities of the sentence-level and phrase-level choices.
P_QUESTION = 0.15
P_ADVERBIAL = 0.3
P_COMPLEMENT = 0.18
P_TRANSITIVE = 0.5  # among clauses without a that-complement
P_NEGATION = 0.25
P_PLURAL = 0.3
P_INDEFINITE = 0.2
P_ADJECTIVE = 0.3
P_PP_INTRANSITIVE = 0.5
P_PP_TRANSITIVE = 0.2

_NOUN_KEYS: tuple[str, ...] = tuple(NOUNS)
_VERB_KEYS: tuple[str, ...] = tuple(VERBS)
_ADJ_KEYS: tuple[str, ...] = tuple(ADJECTIVES)


def _nouns_matching(tags: frozenset[str], exclude: Optional[str] = None) -> list[str]:
    return [k for k in _NOUN_KEYS if NOUNS[k].cls != "place" and k != exclude and _noun_matches(k, tags)]


def _sample_np(rng: random.Random, tags: frozenset[str], *, force_definite: bool = False,
               allow_indefinite: bool = True, exclude: Optional[str] = None) -> NounPhrase:
    """Sample a non-place NP whose noun carries one of ``tags`` (never the noun ``exclude``)."""
    key = rng.choice(_nouns_matching(tags, exclude))
    cls = NOUNS[key].cls
    plural = rng.random() < P_PLURAL
    definite = True
    if not plural and allow_indefinite and not force_definite:
        definite = rng.random() >= P_INDEFINITE
    adjective = None
    if rng.random() < P_ADJECTIVE:
        adjective = rng.choice([a for a in _ADJ_KEYS if cls in ADJECTIVES[a].classes])
    return NounPhrase(key, plural, definite, adjective)


def _sample_place_pp(rng: random.Random) -> PrepPhrase:
    places = [k for k in _NOUN_KEYS if NOUNS[k].cls == "place"]
    key = rng.choice(places)
    prep = rng.choice(NOUNS[key].preps)
    adjective = None
    if rng.random() < P_ADJECTIVE:
        adjective = rng.choice([a for a in _ADJ_KEYS if "place" in ADJECTIVES[a].classes])
    return PrepPhrase(prep, NounPhrase(key, False, True, adjective))


def _sample_clause(rng: random.Random, *, allow_complement: bool, allow_negation: bool) -> Clause:
    if allow_complement and rng.random() < P_COMPLEMENT:
        verb = rng.choice([k for k in _VERB_KEYS if VERBS[k].clause])
        subject = _sample_np(rng, CLAUSE_SUBJECTS)
        complement = _sample_clause(rng, allow_complement=False, allow_negation=True)
        return Clause(subject, verb, complement=complement)

    transitive = rng.random() < P_TRANSITIVE
    verbs = [k for k in _VERB_KEYS if (VERBS[k].transitive if transitive else VERBS[k].intransitive)]
    verb = rng.choice(verbs)
    v = VERBS[verb]
    negated = allow_negation and rng.random() < P_NEGATION
    subject = _sample_np(rng, v.subjects, force_definite=negated)
    # Object / with-PP nouns differ from the subject noun ("the dog sees the dog" is odd).
    obj = _sample_np(rng, v.objects, exclude=subject.noun) if transitive else None

    pp = None
    if rng.random() < (P_PP_TRANSITIVE if transitive else P_PP_INTRANSITIVE):
        options = []
        if v.locative and not negated:
            options.append("locative")
        if v.with_tags:
            options.append("with")
        if options:
            kind = rng.choice(options)
            if kind == "locative":
                pp = _sample_place_pp(rng)
            else:
                pp = PrepPhrase("with", _sample_np(rng, v.with_tags, force_definite=True, exclude=subject.noun))
    return Clause(subject, verb, obj=obj, pp=pp, negated=negated)


def _sample_candidate(rng: random.Random) -> Sentence:
    r = rng.random()
    if r < P_QUESTION:
        main = _sample_clause(rng, allow_complement=True, allow_negation=False)
        return Sentence(main, question=True)
    if r < P_QUESTION + P_ADVERBIAL:
        main = _sample_clause(rng, allow_complement=False, allow_negation=True)
        conjunction = rng.choice(tuple(CONJUNCTIONS))
        adjunct = _sample_clause(rng, allow_complement=False, allow_negation=True)
        return Sentence(main, conjunction=conjunction, adjunct=adjunct)
    return Sentence(_sample_clause(rng, allow_complement=True, allow_negation=True))


def sample_sentence(rng: random.Random) -> Sentence:
    """Sample one sentence whose English realisation has 3-10 words (resampling otherwise).

    All randomness comes from ``rng``; the same generator state gives the same sentence.
    """
    while True:
        sentence = _sample_candidate(rng)
        if MIN_WORDS <= len(_en_sentence(sentence)) <= MAX_WORDS:
            return sentence


def generate_corpus(n: int, seed: int, langs: Sequence[str] = LANGUAGES) -> list[dict[str, str]]:
    """n sentence pairs as dicts {"en": ..., "de": ..., ...}; same seed -> same list.

    Sentence length 3-10 English words.  ``langs`` selects the target languages
    (subset of ``LANGUAGES``; "en" is always included as the source).  Sentences
    are sampled independently, so short sentences may repeat.

    Raises:
        ValueError: negative ``n`` or an unsupported language in ``langs``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    for lang in langs:
        if lang not in _REALIZERS:
            raise ValueError(f"unsupported language {lang!r}; expected one of {ALL_LANGUAGES}")
    targets = [lang for lang in langs if lang != "en"]
    rng = random.Random(seed)
    corpus = []
    for _ in range(n):
        sentence = sample_sentence(rng)
        row = {"en": realize(sentence, "en")}
        for lang in targets:
            row[lang] = realize(sentence, lang)
        corpus.append(row)
    return corpus
