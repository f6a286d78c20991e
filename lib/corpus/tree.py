"""The language-independent sentence tree of the demo corpus (lib/corpus/grammar.py samples it,
lib/corpus/realise.py puts it into words)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


# --------------------------------------------------------------------------- #
# Sentence structure (language independent)
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class NounPhrase:
    """A noun phrase: determiner + optional adjective + noun.

    Attributes:
        noun: English lemma of the noun (key of ``lexicon.NOUNS``).
        plural: plural number.
        definite: definite ("the") or indefinite ("a"/"an"; singular only).
        adjective: English lemma of an optional adjective (key of ``lexicon.ADJECTIVES``).
    """

    noun: str
    plural: bool = False
    definite: bool = True
    adjective: Optional[str] = None


@dataclass(frozen=True)
class PrepPhrase:
    """A prepositional phrase: ``prep`` in {"on", "in", "under", "with"} + noun phrase."""

    prep: str
    np: NounPhrase


@dataclass(frozen=True)
class Clause:
    """A clause with a 3rd-person present-tense verb.

    Attributes:
        subject: subject noun phrase.
        verb: English lemma of the verb (key of ``lexicon.VERBS``).
        obj: direct object (transitive verbs only).
        pp: optional prepositional phrase (locative adverbial or "with").
        complement: optional "that"-clause (verbs know / say / see).
        negated: sentence negation of this clause.
    """

    subject: NounPhrase
    verb: str
    obj: Optional[NounPhrase] = None
    pp: Optional[PrepPhrase] = None
    complement: Optional["Clause"] = None
    negated: bool = False


@dataclass(frozen=True)
class Sentence:
    """One sentence: a main clause, optionally a question, optionally an adverbial clause.

    Attributes:
        main: the main clause.
        question: yes/no question (main clause must not be negated).
        conjunction: "because" or "while" when ``adjunct`` is given.
        adjunct: adverbial subordinate clause following the main clause.
    """

    main: Clause
    question: bool = False
    conjunction: Optional[str] = None
    adjunct: Optional[Clause] = None
