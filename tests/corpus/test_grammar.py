"""Tests for the synthetic parallel-text grammar (lib/corpus/grammar.py)."""

from __future__ import annotations

import random
import re

import pytest

from lib.corpus.grammar import (
    LANGUAGES,
    Clause,
    NounPhrase as NP,
    PrepPhrase as PP,
    Sentence,
    english_vocabulary,
    english_words,
    generate_corpus,
    realize,
    sample_sentence,
    sentence_features,
    validate,
)

ALL = ("en",) + LANGUAGES
N_SAMPLES = 2000


@pytest.fixture(scope="module")
def samples() -> list[Sentence]:
    rng = random.Random(1234)
    return [sample_sentence(rng) for _ in range(N_SAMPLES)]


@pytest.fixture(scope="module")
def realized(samples) -> list[dict[str, str]]:
    return [{lang: realize(s, lang) for lang in ALL} for s in samples]


def _en_tokens(text: str) -> list[str]:
    assert text[-1] in ".?"
    return text[:-1].lower().split()


# --------------------------------------------------------------------------- #
# Vocabulary, lengths, determinism, punctuation
# --------------------------------------------------------------------------- #
def test_languages_constant():
    assert LANGUAGES == ("de", "es", "it")


def test_vocabulary_size():
    vocab = english_vocabulary()
    assert 60 <= len(vocab) <= 120
    assert all(w == w.lower() and w.isalpha() for w in vocab)


def test_generated_words_in_vocabulary_and_vocabulary_is_produced():
    vocab = english_vocabulary()
    rng = random.Random(7)
    seen: set[str] = set()
    for _ in range(6000):
        s = sample_sentence(rng)
        words = _en_tokens(realize(s, "en"))
        assert words == english_words(s)
        assert set(words) <= vocab, set(words) - vocab
        seen |= set(words)
    # The vocabulary is not overstated: every listed word form really occurs.
    assert seen == vocab, vocab - seen


def test_length_bounds(samples, realized):
    lengths = [len(_en_tokens(r["en"])) for r in realized]
    assert min(lengths) >= 3 and max(lengths) <= 10
    assert min(lengths) == 3 and max(lengths) == 10  # the whole range is used
    assert all(len(english_words(s)) == n for s, n in zip(samples, lengths))


def test_punctuation_and_capitalisation(realized):
    for row in realized:
        for lang, text in row.items():
            assert text.endswith((".", "?")), (lang, text)
            first_alpha = next(ch for ch in text if ch.isalpha())
            assert first_alpha.isupper(), (lang, text)
            assert "  " not in text and " ," not in text and " ." not in text
        # all four agree on sentence type
        ends = {text[-1] for text in row.values()}
        assert len(ends) == 1, row
        if row["es"].endswith("?"):
            assert row["es"].startswith("¿")
        else:
            assert "¿" not in row["es"]


def test_determinism():
    a = generate_corpus(300, seed=42)
    b = generate_corpus(300, seed=42)
    c = generate_corpus(300, seed=43)
    assert a == b
    assert a != c
    assert len(a) == 300
    assert all(set(row) == {"en", "de", "es", "it"} for row in a)
    # sample_sentence only depends on the generator passed in
    assert sample_sentence(random.Random(5)) == sample_sentence(random.Random(5))


def test_generate_corpus_langs_subset_and_errors():
    rows = generate_corpus(20, seed=3, langs=("de",))
    assert all(set(r) == {"en", "de"} for r in rows)
    full = generate_corpus(20, seed=3)
    assert [r["de"] for r in rows] == [r["de"] for r in full]
    assert generate_corpus(0, seed=1) == []
    with pytest.raises(ValueError, match="fr"):
        generate_corpus(2, seed=1, langs=("de", "fr"))


def test_realize_unknown_language():
    s = Sentence(Clause(NP("dog"), "sleep"))
    with pytest.raises(ValueError, match="'xx'"):
        realize(s, "xx")


def test_sampled_sentences_validate(samples):
    for s in samples:
        validate(s)


# --------------------------------------------------------------------------- #
# Hand-built sentences with exact expected strings
# --------------------------------------------------------------------------- #
CASES = [
    # masculine subject/object, adjective agreement, adjective after noun in es/it,
    # Spanish personal "a" (a + el = al)
    (Sentence(Clause(NP("dog", adjective="small"), "see", obj=NP("cat", adjective="black"))),
     {"en": "The small dog sees the black cat.",
      "de": "Der kleine Hund sieht die schwarze Katze.",
      "es": "El perro pequeño ve al gato negro.",
      "it": "Il cane piccolo vede il gatto nero."}),
    # German neuter subject, masculine accusative "den"
    (Sentence(Clause(NP("girl"), "see", obj=NP("dog", adjective="big"))),
     {"en": "The girl sees the big dog.",
      "de": "Das Mädchen sieht den großen Hund.",
      "es": "La niña ve al perro grande.",
      "it": "La ragazza vede il cane grande."}),
    # feminine agreement in es/it, inanimate object (no personal a), German accusative adjective
    (Sentence(Clause(NP("woman", adjective="old"), "find", obj=NP("ball", adjective="red"))),
     {"en": "The old woman finds the red ball.",
      "de": "Die alte Frau findet den roten Ball.",
      "es": "La mujer vieja encuentra la pelota roja.",
      "it": "La donna vecchia trova la palla rossa."}),
    # plural agreement of articles, adjectives and verbs; Italian gli before a vowel
    (Sentence(Clause(NP("cat", plural=True, adjective="white"), "hear", obj=NP("bird", plural=True, adjective="small"))),
     {"en": "The white cats hear the small birds.",
      "de": "Die weißen Katzen hören die kleinen Vögel.",
      "es": "Los gatos blancos oyen a los pájaros pequeños.",
      "it": "I gatti bianchi sentono gli uccelli piccoli."}),
    # indefinite article, a/an, German mixed declension (neuter), Italian "lo"
    (Sentence(Clause(NP("student"), "see", obj=NP("horse", definite=False, adjective="old"))),
     {"en": "The student sees an old horse.",
      "de": "Der Student sieht ein altes Pferd.",
      "es": "El estudiante ve a un caballo viejo.",
      "it": "Lo studente vede un cavallo vecchio."}),
    # German weak noun + dative object of "helfen"; Italian "gli uomini", "lo studente"
    (Sentence(Clause(NP("man", plural=True), "help", obj=NP("student"))),
     {"en": "The men help the student.",
      "de": "Die Männer helfen dem Studenten.",
      "es": "Los hombres ayudan al estudiante.",
      "it": "Gli uomini aiutano lo studente."}),
    # indefinite masculine accusative; Italian "uno"
    (Sentence(Clause(NP("dog", definite=False, adjective="small"), "find", obj=NP("student", definite=False))),
     {"en": "A small dog finds a student.",
      "de": "Ein kleiner Hund findet einen Studenten.",
      "es": "Un perro pequeño encuentra a un estudiante.",
      "it": "Un cane piccolo trova uno studente."}),
    # German "fressen" for animals, feminine object in es/it
    (Sentence(Clause(NP("horse"), "eat", obj=NP("apple", adjective="green"))),
     {"en": "The horse eats the green apple.",
      "de": "Das Pferd frisst den grünen Apfel.",
      "es": "El caballo come la manzana verde.",
      "it": "Il cavallo mangia la mela verde."}),
    # locative PP: German dative + adjective, Spanish "sobre", Italian "sul"
    (Sentence(Clause(NP("cat"), "sleep", pp=PP("on", NP("table", adjective="small")))),
     {"en": "The cat sleeps on the small table.",
      "de": "Die Katze schläft auf dem kleinen Tisch.",
      "es": "El gato duerme sobre la mesa pequeña.",
      "it": "Il gatto dorme sul tavolo piccolo."}),
    # "in" + dem -> "im"; Italian "nel"; l' before a vowel
    (Sentence(Clause(NP("bird"), "sing", pp=PP("in", NP("garden")))),
     {"en": "The bird sings in the garden.",
      "de": "Der Vogel singt im Garten.",
      "es": "El pájaro canta en el jardín.",
      "it": "L'uccello canta nel giardino."}),
    # "under": Spanish "debajo del", Italian "sotto l'"
    (Sentence(Clause(NP("dog", plural=True), "sleep", pp=PP("under", NP("tree")))),
     {"en": "The dogs sleep under the tree.",
      "de": "Die Hunde schlafen unter dem Baum.",
      "es": "Los perros duermen debajo del árbol.",
      "it": "I cani dormono sotto l'albero."}),
    # feminine locative: "in der", "nella"; transitive + PP
    (Sentence(Clause(NP("child"), "read", obj=NP("book", plural=True), pp=PP("in", NP("school")))),
     {"en": "The child reads the books in the school.",
      "de": "Das Kind liest die Bücher in der Schule.",
      "es": "El niño lee los libros en la escuela.",
      "it": "Il bambino legge i libri nella scuola."}),
    # German verb-final "dass" clause
    (Sentence(Clause(NP("man"), "know", complement=Clause(NP("dog", adjective="small"), "see", obj=NP("cat")))),
     {"en": "The man knows that the small dog sees the cat.",
      "de": "Der Mann weiß, dass der kleine Hund die Katze sieht.",
      "es": "El hombre sabe que el perro pequeño ve al gato.",
      "it": "L'uomo sa che il cane piccolo vede il gatto."}),
    # negation inside a subordinate clause (German "nicht" before the final verb)
    (Sentence(Clause(NP("woman"), "say", complement=Clause(NP("horse"), "eat", obj=NP("apple"), negated=True))),
     {"en": "The woman says that the horse does not eat the apple.",
      "de": "Die Frau sagt, dass das Pferd den Apfel nicht frisst.",
      "es": "La mujer dice que el caballo no come la manzana.",
      "it": "La donna dice che il cavallo non mangia la mela."}),
    # "because" clause (verb-final "weil"), main-clause negation, plural
    (Sentence(Clause(NP("child"), "sleep", negated=True), conjunction="because",
              adjunct=Clause(NP("bird", plural=True), "sing")),
     {"en": "The child does not sleep because the birds sing.",
      "de": "Das Kind schläft nicht, weil die Vögel singen.",
      "es": "El niño no duerme porque los pájaros cantan.",
      "it": "Il bambino non dorme perché gli uccelli cantano."}),
    # "while" clause with a transitive verb
    (Sentence(Clause(NP("girl", plural=True), "play"), conjunction="while",
              adjunct=Clause(NP("teacher"), "read", obj=NP("book", definite=False))),
     {"en": "The girls play while the teacher reads a book.",
      "de": "Die Mädchen spielen, während der Lehrer ein Buch liest.",
      "es": "Las niñas juegan mientras el profesor lee un libro.",
      "it": "Le ragazze giocano mentre il maestro legge un libro."}),
    # negation with a definite object: German "nicht" after the object
    (Sentence(Clause(NP("dog"), "see", obj=NP("cat"), negated=True)),
     {"en": "The dog does not see the cat.",
      "de": "Der Hund sieht die Katze nicht.",
      "es": "El perro no ve al gato.",
      "it": "Il cane non vede il gatto."}),
    # negation of an indefinite object: kein / ningún / nessun
    (Sentence(Clause(NP("teacher", plural=True), "find", obj=NP("key", definite=False), negated=True)),
     {"en": "The teachers do not find a key.",
      "de": "Die Lehrer finden keinen Schlüssel.",
      "es": "Los profesores no encuentran ninguna llave.",
      "it": "I maestri non trovano nessuna chiave."}),
    (Sentence(Clause(NP("man"), "help", obj=NP("child", definite=False, adjective="small"), negated=True)),
     {"en": "The man does not help a small child.",
      "de": "Der Mann hilft keinem kleinen Kind.",
      "es": "El hombre no ayuda a ningún niño pequeño.",
      "it": "L'uomo non aiuta nessun bambino piccolo."}),
    # negation with a with-PP (German "nicht" before the PP), dative plural -n
    (Sentence(Clause(NP("friend", plural=True), "play", pp=PP("with", NP("dog", plural=True)), negated=True)),
     {"en": "The friends do not play with the dogs.",
      "de": "Die Freunde spielen nicht mit den Hunden.",
      "es": "Los amigos no juegan con los perros.",
      "it": "Gli amici non giocano con i cani."}),
    # questions
    (Sentence(Clause(NP("dog"), "see", obj=NP("cat")), question=True),
     {"en": "Does the dog see the cat?",
      "de": "Sieht der Hund die Katze?",
      "es": "¿El perro ve al gato?",
      "it": "Il cane vede il gatto?"}),
    (Sentence(Clause(NP("child", plural=True), "play", pp=PP("with", NP("ball"))), question=True),
     {"en": "Do the children play with the ball?",
      "de": "Spielen die Kinder mit dem Ball?",
      "es": "¿Los niños juegan con la pelota?",
      "it": "I bambini giocano con la palla?"}),
    (Sentence(Clause(NP("girl"), "know", complement=Clause(NP("mouse"), "sleep")), question=True),
     {"en": "Does the girl know that the mouse sleeps?",
      "de": "Weiß das Mädchen, dass die Maus schläft?",
      "es": "¿La niña sabe que el ratón duerme?",
      "it": "La ragazza sa che il topo dorme?"}),
    (Sentence(Clause(NP("horse", definite=False), "swim", pp=PP("with", NP("man"))), question=True),
     {"en": "Does a horse swim with the man?",
      "de": "Schwimmt ein Pferd mit dem Mann?",
      "es": "¿Un caballo nada con el hombre?",
      "it": "Un cavallo nuota con l'uomo?"}),
    # German dative feminine with adjective; Italian "sulla"
    (Sentence(Clause(NP("mouse", plural=True), "run", pp=PP("on", NP("box", adjective="big")))),
     {"en": "The mice run on the big box.",
      "de": "Die Mäuse laufen auf der großen Kiste.",
      "es": "Los ratones corren sobre la caja grande.",
      "it": "I topi corrono sulla scatola grande."}),
]


@pytest.mark.parametrize("sentence,expected", CASES, ids=[c[1]["en"] for c in CASES])
def test_hand_built_sentences(sentence, expected):
    for lang, text in expected.items():
        assert realize(sentence, lang) == text, lang


@pytest.mark.parametrize("bad", [
    Sentence(Clause(NP("dog"), "see", obj=NP("cat"), negated=True), question=True),  # negated question
    Sentence(Clause(NP("dog"), "sleep", pp=PP("in", NP("house")), negated=True)),   # neg + locative
    Sentence(Clause(NP("dog", definite=False), "sleep", negated=True)),               # neg + indefinite subj
    Sentence(Clause(NP("dog", plural=True, definite=False), "sleep")),                # indefinite plural
    Sentence(Clause(NP("dog"), "sleep", obj=NP("cat"))),                              # intransitive + object
    Sentence(Clause(NP("dog"), "see")),                                               # missing object
    Sentence(Clause(NP("table"), "sleep")),                                           # place as subject
    Sentence(Clause(NP("dog"), "sleep", pp=PP("on", NP("house")))),                   # unsupported prep/place
    Sentence(Clause(NP("man"), "know", complement=Clause(NP("dog"), "sleep"), negated=True)),
    Sentence(Clause(NP("dog"), "sleep"), conjunction="because"),                      # conj without clause
])
def test_unsupported_sentences_rejected(bad):
    with pytest.raises(ValueError):
        realize(bad, "de")


# --------------------------------------------------------------------------- #
# Coverage of constructions in a random sample
# --------------------------------------------------------------------------- #
def test_each_construction_appears(samples):
    feats: set[str] = set()
    for s in samples:
        feats |= sentence_features(s)
    expected = {"transitive", "intransitive", "adjective", "locative_pp", "with_pp", "complement_clause",
                "adverbial_clause", "plural", "negation", "indefinite", "negated_indefinite", "question",
                "dative_object"}
    assert expected <= feats, expected - feats


def test_constructions_visible_in_text(realized):
    def any_match(lang: str, pattern: str) -> bool:
        return any(re.search(pattern, r[lang]) for r in realized)

    # German: verb-final subordinate clauses, negation, kein, accusative, dative, V1 questions
    assert any_match("de", r", dass ")
    assert any_match("de", r", weil ")
    assert any_match("de", r", während ")
    assert any_match("de", r"\bnicht\b")
    assert any_match("de", r"\bkein(e|en|em|er)?\b")
    assert any_match("de", r"\bden [A-ZÄÖÜ]")
    assert any_match("de", r"\b(im|dem|der) ")
    assert any_match("de", r"^(Sieht|Schläft|Spielt|Weiß|Liest|Findet)\b.*\?$")
    # German neuter and nouns capitalised
    assert any_match("de", r"\bdas [A-Z]")
    # Spanish / Italian negation and questions
    assert any_match("es", r"\bno\b")
    assert any_match("es", r"^¿.*\?$")
    assert any_match("es", r"\bal\b")
    assert any_match("it", r"\bnon\b")
    assert any_match("it", r"\b(lo|gli)\b")
    assert any_match("it", r"\bl'")
    assert any_match("it", r"\b(nel|nella|sul|sulla)\b")
    # English questions with do-support
    assert any_match("en", r"^(Does|Do) .*\?$")
    assert any_match("en", r"\bdo(es)? not\b")


def test_german_nouns_capitalised(samples):
    from lib.corpus.lexicon import NOUNS

    forms = {n.de[1] for n in NOUNS.values()} | {n.de[2] for n in NOUNS.values()}
    forms |= {w + "n" for w in forms} | {w + "en" for w in forms}  # dative plural, weak nouns
    lowered = {w.lower() for w in forms}
    n_nouns = 0
    for s in samples[:500]:
        text = realize(s, "de")
        for w in text[:-1].replace(",", "").split():
            if w.lower() in lowered:
                n_nouns += 1
                assert w in forms, (w, text)
    assert n_nouns > 500


def test_english_matches_target_sentence_type(samples):
    for s in samples[:500]:
        en = realize(s, "en")
        if s.question:
            assert en.endswith("?") and en.split()[0] in ("Does", "Do")
        else:
            assert en.endswith(".")
