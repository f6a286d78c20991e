"""Realisation of a sentence tree (lib/corpus/tree.py) in English, German, Spanish and Italian: agreement,
case, word order, negation and questions by each language's rules (lib/corpus/grammar.py's docstring
lists the constructions). :data:`REALIZERS` maps a language to its function."""
from __future__ import annotations

from lib.corpus.lexicon import (
    ADJECTIVES,
    COMPLEMENTIZER,
    CONJUNCTIONS,
    LOCATIVE_PREPS,
    NOUNS,
    VERBS,
    WITH_PREP,
    Noun,
)
from lib.corpus.tree import Clause, NounPhrase, PrepPhrase, Sentence

# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #
def _capitalize_first(text: str) -> str:
    for i, ch in enumerate(text):
        if ch.isalpha():
            return text[:i] + ch.upper() + text[i + 1:]
    return text


def _finish(words: list[str], question: bool, lang: str) -> str:
    text = " ".join(words)
    text = text.replace(" ,", ",")
    if question:
        text = ("¿" + text + "?") if lang == "es" else (text + "?")
    else:
        text = text + "."
    return _capitalize_first(text)


def _verb_index(np: NounPhrase) -> int:
    return 1 if np.plural else 0


# --------------------------------------------------------------------------- #
# English
# --------------------------------------------------------------------------- #
def _en_np(np: NounPhrase) -> list[str]:
    noun = NOUNS[np.noun]
    words = []
    if np.adjective:
        words.append(ADJECTIVES[np.adjective].en)
    words.append(noun.en[1] if np.plural else noun.en[0])
    if np.definite:
        det = "the"
    else:
        det = "an" if words[0][0] in "aeiou" else "a"
    return [det] + words


def _en_pp(pp: PrepPhrase) -> list[str]:
    return [pp.prep] + _en_np(pp.np)


def _en_clause(c: Clause, question: bool = False) -> list[str]:
    v = VERBS[c.verb]
    subj = _en_np(c.subject)
    tail: list[str] = []
    if c.obj is not None:
        tail += _en_np(c.obj)
    if c.pp is not None:
        tail += _en_pp(c.pp)
    if c.complement is not None:
        tail += ["that"] + _en_clause(c.complement)
    aux = "do" if c.subject.plural else "does"
    if question:
        return [aux] + subj + [v.en[0]] + tail
    if c.negated:
        return subj + [aux, "not", v.en[0]] + tail
    return subj + [v.en[0] if c.subject.plural else v.en[1]] + tail


def _en_sentence(s: Sentence) -> list[str]:
    words = _en_clause(s.main, question=s.question)
    if s.adjunct is not None:
        words += [s.conjunction] + _en_clause(s.adjunct)
    return words


# --------------------------------------------------------------------------- #
# German
# --------------------------------------------------------------------------- #
_CASES = ("nom", "acc", "dat")
_DE_DEF = {
    "m": ("der", "den", "dem"),
    "f": ("die", "die", "der"),
    "n": ("das", "das", "dem"),
    "pl": ("die", "die", "den"),
}
_DE_INDEF = {  # ein / kein (singular only)
    "m": ("ein", "einen", "einem"),
    "f": ("eine", "eine", "einer"),
    "n": ("ein", "ein", "einem"),
}
# Weak adjective endings (after the definite article).
_DE_WEAK = {
    "m": ("e", "en", "en"),
    "f": ("e", "e", "en"),
    "n": ("e", "e", "en"),
    "pl": ("en", "en", "en"),
}
# Mixed adjective endings (after ein / kein).
_DE_MIXED = {
    "m": ("er", "en", "en"),
    "f": ("e", "e", "en"),
    "n": ("es", "es", "en"),
}


def _de_noun_form(noun: Noun, plural: bool, case: str) -> str:
    _, sg, pl = noun.de
    if plural:
        if case == "dat" and not pl.endswith(("n", "s")):
            return pl + "n"
        return pl
    if noun.de_weak and case != "nom":
        return sg + "en"
    return sg


def _de_np(np: NounPhrase, case: str, negative: bool = False) -> list[str]:
    """German NP in ``case``; ``negative`` turns an indefinite article into *kein*."""
    noun = NOUNS[np.noun]
    k = _CASES.index(case)
    key = "pl" if np.plural else noun.de[0]
    if np.definite:
        art = _DE_DEF[key][k]
        ending = _DE_WEAK[key][k]
    else:
        art = _DE_INDEF[key][k]
        if negative:
            art = "k" + art
        ending = _DE_MIXED[key][k]
    words = [art]
    if np.adjective:
        words.append(ADJECTIVES[np.adjective].de + ending)
    words.append(_de_noun_form(noun, np.plural, case))
    return words


def _de_pp(pp: PrepPhrase) -> list[str]:
    prep = WITH_PREP[0] if pp.prep == "with" else LOCATIVE_PREPS[pp.prep][0]
    np_words = _de_np(pp.np, "dat")
    if prep == "in" and np_words[0] == "dem":  # in + dem -> im
        return ["im"] + np_words[1:]
    return [prep] + np_words


def _de_parts(c: Clause) -> tuple[list[str], str, list[str], list[str]]:
    """Return (subject, finite verb, middle field, extraposed that-clause) for a German clause."""
    v = VERBS[c.verb]
    forms = v.de_animal if (v.de_animal and NOUNS[c.subject.noun].cls == "animal") else v.de
    verb = forms[_verb_index(c.subject)]
    subj = _de_np(c.subject, "nom")
    middle: list[str] = []
    use_kein = c.negated and c.obj is not None and not c.obj.definite
    if c.obj is not None:
        middle += _de_np(c.obj, v.de_case, negative=use_kein)
    if c.negated and not use_kein:
        middle.append("nicht")  # after a definite object, before a with-PP
    if c.pp is not None:
        middle += _de_pp(c.pp)
    extra: list[str] = []
    if c.complement is not None:
        extra = [",", COMPLEMENTIZER[0]] + _de_subordinate(c.complement)
    return subj, verb, middle, extra


def _de_subordinate(c: Clause) -> list[str]:
    """Verb-final German subordinate clause (without the introducing conjunction)."""
    subj, verb, middle, extra = _de_parts(c)
    return subj + middle + [verb] + extra


def _de_sentence(s: Sentence) -> list[str]:
    subj, verb, middle, extra = _de_parts(s.main)
    if s.question:
        words = [verb] + subj + middle + extra  # verb-first
    else:
        words = subj + [verb] + middle + extra  # V2
    if s.adjunct is not None:
        words += [",", CONJUNCTIONS[s.conjunction][0]] + _de_subordinate(s.adjunct)
    return words


# --------------------------------------------------------------------------- #
# Spanish
# --------------------------------------------------------------------------- #
_ES_DEF = {("m", False): "el", ("f", False): "la", ("m", True): "los", ("f", True): "las"}
_ES_INDEF = {"m": "un", "f": "una"}
_ES_NEG = {"m": "ningún", "f": "ninguna"}


def _gn_index(gender: str, plural: bool) -> int:
    return (2 if plural else 0) + (1 if gender == "f" else 0)


def _es_np(np: NounPhrase, negative: bool = False) -> list[str]:
    noun = NOUNS[np.noun]
    gender, sg, pl = noun.es
    if np.definite:
        art = _ES_DEF[(gender, np.plural)]
    else:
        art = (_ES_NEG if negative else _ES_INDEF)[gender]
    words = [art, pl if np.plural else sg]
    if np.adjective:
        words.append(ADJECTIVES[np.adjective].es[_gn_index(gender, np.plural)])
    return words


def _es_contract(prep: str, np_words: list[str]) -> list[str]:
    """Attach a preposition ending in "a"/"de" with contraction (a el -> al, de el -> del)."""
    head, last = prep.rsplit(" ", 1) if " " in prep else ("", prep)
    if last in ("a", "de") and np_words[0] == "el":
        fused = {"a": "al", "de": "del"}[last]
        return ([head] if head else []) + [fused] + np_words[1:]
    return prep.split(" ") + np_words


def _es_pp(pp: PrepPhrase) -> list[str]:
    prep = WITH_PREP[1] if pp.prep == "with" else LOCATIVE_PREPS[pp.prep][1]
    return _es_contract(prep, _es_np(pp.np))


def _es_clause(c: Clause) -> list[str]:
    v = VERBS[c.verb]
    words = _es_np(c.subject)
    if c.negated:
        words.append("no")
    words.append(v.es[_verb_index(c.subject)])
    if c.obj is not None:
        use_neg = c.negated and not c.obj.definite
        obj = _es_np(c.obj, negative=use_neg)
        if NOUNS[c.obj.noun].animate:  # personal "a"
            obj = _es_contract("a", obj)
        words += obj
    if c.pp is not None:
        words += _es_pp(c.pp)
    if c.complement is not None:
        words += [COMPLEMENTIZER[1]] + _es_clause(c.complement)
    return words


def _es_sentence(s: Sentence) -> list[str]:
    words = _es_clause(s.main)
    if s.adjunct is not None:
        words += [CONJUNCTIONS[s.conjunction][1]] + _es_clause(s.adjunct)
    return words


# --------------------------------------------------------------------------- #
# Italian
# --------------------------------------------------------------------------- #
_IT_VOWELS = "aeiouàèéìòù"


def _it_lo_type(word: str) -> bool:
    """Words taking lo/gli/uno: s + consonant, z, gn, ps, pn, x, y, i + vowel."""
    w = word.lower()
    if w[0] == "s" and len(w) > 1 and w[1] not in _IT_VOWELS:
        return True
    if w[0] in "zxy":
        return True
    if w.startswith(("gn", "ps", "pn")):
        return True
    return w[0] == "i" and len(w) > 1 and w[1] in _IT_VOWELS


def _it_vowel(word: str) -> bool:
    return word[0].lower() in _IT_VOWELS + "h" and not _it_lo_type(word)


def _it_def_article(gender: str, plural: bool, word: str) -> str:
    """Definite article for the following word; an elided form ends in an apostrophe."""
    if gender == "m":
        if plural:
            return "gli" if (_it_vowel(word) or _it_lo_type(word)) else "i"
        if _it_vowel(word):
            return "l'"
        return "lo" if _it_lo_type(word) else "il"
    if plural:
        return "le"
    return "l'" if _it_vowel(word) else "la"


def _it_indef_article(gender: str, word: str, negative: bool) -> str:
    if gender == "m":
        art = "uno" if _it_lo_type(word) else "un"
    else:
        art = "un'" if _it_vowel(word) else "una"
    if negative:  # nessuno studente, nessun cane, nessuna donna, nessun'amica
        art = {"uno": "nessuno", "un": "nessun", "una": "nessuna", "un'": "nessun'"}[art]
    return art


def _join_elided(art: str, word: str) -> list[str]:
    return [art + word] if art.endswith("'") else [art, word]


def _it_np_parts(np: NounPhrase, negative: bool = False) -> tuple[str, str, list[str]]:
    """(article, noun form, adjective words) of an Italian NP."""
    noun = NOUNS[np.noun]
    gender, sg, pl = noun.it
    form = pl if np.plural else sg
    if np.definite:
        art = _it_def_article(gender, np.plural, form)
    else:
        art = _it_indef_article(gender, form, negative)
    adj = [ADJECTIVES[np.adjective].it[_gn_index(gender, np.plural)]] if np.adjective else []
    return art, form, adj


def _it_np(np: NounPhrase, negative: bool = False) -> list[str]:
    art, form, adj = _it_np_parts(np, negative)
    return _join_elided(art, form) + adj


# Articulated prepositions: prefix + article suffix (nel, nello, nell', nella, nei, negli, nelle; sul, ...).
_IT_ART_SUFFIX = {"il": "l", "lo": "llo", "l'": "ll'", "la": "lla", "i": "i", "gli": "gli", "le": "lle"}
_IT_FUSING = {"in": "ne", "su": "su"}


def _it_pp(pp: PrepPhrase) -> list[str]:
    prep = WITH_PREP[2] if pp.prep == "with" else LOCATIVE_PREPS[pp.prep][2]
    art, form, adj = _it_np_parts(pp.np)
    if prep in _IT_FUSING and pp.np.definite:
        fused = _IT_FUSING[prep] + _IT_ART_SUFFIX[art]
        return _join_elided(fused, form) + adj
    return [prep] + _join_elided(art, form) + adj


def _it_clause(c: Clause) -> list[str]:
    v = VERBS[c.verb]
    words = _it_np(c.subject)
    if c.negated:
        words.append("non")
    words.append(v.it[_verb_index(c.subject)])
    if c.obj is not None:
        words += _it_np(c.obj, negative=c.negated and not c.obj.definite)
    if c.pp is not None:
        words += _it_pp(c.pp)
    if c.complement is not None:
        words += [COMPLEMENTIZER[2]] + _it_clause(c.complement)
    return words


def _it_sentence(s: Sentence) -> list[str]:
    words = _it_clause(s.main)
    if s.adjunct is not None:
        words += [CONJUNCTIONS[s.conjunction][2]] + _it_clause(s.adjunct)
    return words


REALIZERS = {"en": _en_sentence, "de": _de_sentence, "es": _es_sentence, "it": _it_sentence}
