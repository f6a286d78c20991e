"""Lexicon of the synthetic parallel-text grammar (data only; logic in :mod:`lib.corpus.grammar`).

Every entry is keyed by its English lemma.  The lexicon is deliberately tiny
(about 100 English word forms) so that each word occurs often in a small demo
speech corpus.  All tables are tuples / dicts with a fixed insertion order, so
iterating over them is deterministic on every machine.

Notation
--------
* German gender: ``"m"``, ``"f"``, ``"n"``; Spanish / Italian gender: ``"m"``, ``"f"``.
* Noun semantic tags drive sampling (selectional restrictions):
  ``human``, ``animal``, ``thing``, ``place`` plus finer tags (``food``,
  ``readable``, ``toy``).  ``animate`` nouns (human + animal) trigger the
  Spanish personal *a* on direct objects.
* Places only occur inside locative prepositional phrases and are never plural.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Noun:
    """One noun with its forms in every language.

    Attributes:
        en: English (singular, plural).
        tags: semantic tags (first one is the coarse class).
        de: German (gender, singular, plural); nouns capitalised.
        es: Spanish (gender, singular, plural).
        it: Italian (gender, singular, plural).
        de_weak: German weak masculine (n-declension): oblique singular adds ``-en``.
        preps: for places, the locative prepositions (English keys) it combines with.
    """

    en: tuple[str, str]
    tags: frozenset[str]
    de: tuple[str, str, str]
    es: tuple[str, str, str]
    it: tuple[str, str, str]
    de_weak: bool = False
    preps: tuple[str, ...] = ()

    @property
    def cls(self) -> str:
        """Coarse semantic class: human, animal, thing or place."""
        for c in ("human", "animal", "thing", "place"):
            if c in self.tags:
                return c
        raise AssertionError(self)

    @property
    def animate(self) -> bool:
        return self.cls in ("human", "animal")


def _n(en, tags, de, es, it, de_weak=False, preps=()) -> Noun:
    return Noun(tuple(en), frozenset(tags), tuple(de), tuple(es), tuple(it), de_weak, tuple(preps))


NOUNS: dict[str, Noun] = {
    # humans
    "man": _n(("man", "men"), {"human"}, ("m", "Mann", "Männer"), ("m", "hombre", "hombres"), ("m", "uomo", "uomini")),
    "woman": _n(("woman", "women"), {"human"}, ("f", "Frau", "Frauen"), ("f", "mujer", "mujeres"), ("f", "donna", "donne")),
    "child": _n(("child", "children"), {"human"}, ("n", "Kind", "Kinder"), ("m", "niño", "niños"), ("m", "bambino", "bambini")),
    "girl": _n(("girl", "girls"), {"human"}, ("n", "Mädchen", "Mädchen"), ("f", "niña", "niñas"), ("f", "ragazza", "ragazze")),
    "student": _n(("student", "students"), {"human"}, ("m", "Student", "Studenten"), ("m", "estudiante", "estudiantes"),
                  ("m", "studente", "studenti"), de_weak=True),
    "teacher": _n(("teacher", "teachers"), {"human"}, ("m", "Lehrer", "Lehrer"), ("m", "profesor", "profesores"),
                  ("m", "maestro", "maestri")),
    "friend": _n(("friend", "friends"), {"human"}, ("m", "Freund", "Freunde"), ("m", "amigo", "amigos"), ("m", "amico", "amici")),
    # animals
    "dog": _n(("dog", "dogs"), {"animal"}, ("m", "Hund", "Hunde"), ("m", "perro", "perros"), ("m", "cane", "cani")),
    "cat": _n(("cat", "cats"), {"animal"}, ("f", "Katze", "Katzen"), ("m", "gato", "gatos"), ("m", "gatto", "gatti")),
    "bird": _n(("bird", "birds"), {"animal"}, ("m", "Vogel", "Vögel"), ("m", "pájaro", "pájaros"), ("m", "uccello", "uccelli")),
    "horse": _n(("horse", "horses"), {"animal"}, ("n", "Pferd", "Pferde"), ("m", "caballo", "caballos"), ("m", "cavallo", "cavalli")),
    "mouse": _n(("mouse", "mice"), {"animal"}, ("f", "Maus", "Mäuse"), ("m", "ratón", "ratones"), ("m", "topo", "topi")),
    # things
    "ball": _n(("ball", "balls"), {"thing", "toy"}, ("m", "Ball", "Bälle"), ("f", "pelota", "pelotas"), ("f", "palla", "palle")),
    "book": _n(("book", "books"), {"thing", "readable"}, ("n", "Buch", "Bücher"), ("m", "libro", "libros"), ("m", "libro", "libri")),
    "apple": _n(("apple", "apples"), {"thing", "food"}, ("m", "Apfel", "Äpfel"), ("f", "manzana", "manzanas"), ("f", "mela", "mele")),
    "cake": _n(("cake", "cakes"), {"thing", "food"}, ("m", "Kuchen", "Kuchen"), ("m", "pastel", "pasteles"), ("f", "torta", "torte")),
    "key": _n(("key", "keys"), {"thing"}, ("m", "Schlüssel", "Schlüssel"), ("f", "llave", "llaves"), ("f", "chiave", "chiavi")),
    "car": _n(("car", "cars"), {"thing"}, ("n", "Auto", "Autos"), ("m", "coche", "coches"), ("f", "macchina", "macchine")),
    # places (singular only, only inside locative PPs)
    "table": _n(("table", "tables"), {"place"}, ("m", "Tisch", "Tische"), ("f", "mesa", "mesas"), ("m", "tavolo", "tavoli"),
                preps=("on", "under")),
    "house": _n(("house", "houses"), {"place"}, ("n", "Haus", "Häuser"), ("f", "casa", "casas"), ("f", "casa", "case"),
                preps=("in",)),
    "garden": _n(("garden", "gardens"), {"place"}, ("m", "Garten", "Gärten"), ("m", "jardín", "jardines"),
                 ("m", "giardino", "giardini"), preps=("in",)),
    "tree": _n(("tree", "trees"), {"place"}, ("m", "Baum", "Bäume"), ("m", "árbol", "árboles"), ("m", "albero", "alberi"),
               preps=("under",)),
    "bed": _n(("bed", "beds"), {"place"}, ("n", "Bett", "Betten"), ("f", "cama", "camas"), ("m", "letto", "letti"),
              preps=("in", "on", "under")),
    "chair": _n(("chair", "chairs"), {"place"}, ("m", "Stuhl", "Stühle"), ("f", "silla", "sillas"), ("f", "sedia", "sedie"),
                preps=("on", "under")),
    "school": _n(("school", "schools"), {"place"}, ("f", "Schule", "Schulen"), ("f", "escuela", "escuelas"),
                 ("f", "scuola", "scuole"), preps=("in",)),
    "box": _n(("box", "boxes"), {"place"}, ("f", "Kiste", "Kisten"), ("f", "caja", "cajas"), ("f", "scatola", "scatole"),
              preps=("in", "on", "under")),
}


@dataclass(frozen=True)
class Adjective:
    """An adjective (at most one per noun phrase).

    Attributes:
        en: English form (invariable).
        de: German stem; endings added by the weak / mixed declension.
        es: Spanish (m.sg, f.sg, m.pl, f.pl), placed after the noun.
        it: Italian (m.sg, f.sg, m.pl, f.pl), placed after the noun.
        classes: coarse noun classes it may modify when sampling.
    """

    en: str
    de: str
    es: tuple[str, str, str, str]
    it: tuple[str, str, str, str]
    classes: frozenset[str]


_ALL = frozenset({"human", "animal", "thing", "place"})
_ANIM = frozenset({"human", "animal"})
_INANIM = frozenset({"thing", "place"})
_NONHUMAN = frozenset({"animal", "thing", "place"})

ADJECTIVES: dict[str, Adjective] = {
    "small": Adjective("small", "klein", ("pequeño", "pequeña", "pequeños", "pequeñas"),
                       ("piccolo", "piccola", "piccoli", "piccole"), _ALL),
    "big": Adjective("big", "groß", ("grande", "grande", "grandes", "grandes"), ("grande", "grande", "grandi", "grandi"), _ALL),
    "old": Adjective("old", "alt", ("viejo", "vieja", "viejos", "viejas"), ("vecchio", "vecchia", "vecchi", "vecchie"), _ALL),
    "black": Adjective("black", "schwarz", ("negro", "negra", "negros", "negras"), ("nero", "nera", "neri", "nere"), _NONHUMAN),
    "white": Adjective("white", "weiß", ("blanco", "blanca", "blancos", "blancas"),
                       ("bianco", "bianca", "bianchi", "bianche"), _NONHUMAN),
    "young": Adjective("young", "jung", ("joven", "joven", "jóvenes", "jóvenes"),
                       ("giovane", "giovane", "giovani", "giovani"), _ANIM),
    "happy": Adjective("happy", "glücklich", ("feliz", "feliz", "felices", "felices"),
                       ("felice", "felice", "felici", "felici"), _ANIM),
    "red": Adjective("red", "rot", ("rojo", "roja", "rojos", "rojas"), ("rosso", "rossa", "rossi", "rosse"), _INANIM),
    "green": Adjective("green", "grün", ("verde", "verde", "verdes", "verdes"), ("verde", "verde", "verdi", "verdi"), _INANIM),
    "new": Adjective("new", "neu", ("nuevo", "nueva", "nuevos", "nuevas"), ("nuovo", "nuova", "nuovi", "nuove"), _INANIM),
}


@dataclass(frozen=True)
class Verb:
    """A verb with its 3rd-person present forms and its subcategorisation.

    Attributes:
        en: English (base, 3rd person singular).
        de: German (3sg, 3pl).
        es: Spanish (3sg, 3pl).
        it: Italian (3sg, 3pl).
        subjects: tags a subject noun must carry (any of).
        objects: tags a direct-object noun must carry (any of); empty = no direct object.
        clause: takes a "that"-complement clause (know, say, see).
        locative: allows a locative PP (on / in / under + place).
        with_tags: tags allowed for the noun of a "with"-PP; empty = no "with"-PP.
        de_animal: German (3sg, 3pl) used instead of ``de`` when the subject is an
            animal (``essen`` -> ``fressen``).
        de_case: German case of the direct object (``acc`` or ``dat`` for *helfen*).
    """

    en: tuple[str, str]
    de: tuple[str, str]
    es: tuple[str, str]
    it: tuple[str, str]
    subjects: frozenset[str]
    objects: frozenset[str] = frozenset()
    clause: bool = False
    locative: bool = False
    with_tags: frozenset[str] = frozenset()
    de_animal: tuple[str, str] | None = None
    de_case: str = "acc"

    @property
    def transitive(self) -> bool:
        return bool(self.objects)

    @property
    def intransitive(self) -> bool:
        return not self.objects and not self.clause


_HUM = frozenset({"human"})

VERBS: dict[str, Verb] = {
    # intransitive
    "sleep": Verb(("sleep", "sleeps"), ("schläft", "schlafen"), ("duerme", "duermen"), ("dorme", "dormono"),
                  _ANIM, locative=True),
    "run": Verb(("run", "runs"), ("läuft", "laufen"), ("corre", "corren"), ("corre", "corrono"),
                _ANIM, locative=True, with_tags=_ANIM),
    "sing": Verb(("sing", "sings"), ("singt", "singen"), ("canta", "cantan"), ("canta", "cantano"),
                 frozenset({"human", "bird"}), locative=True, with_tags=_HUM),
    "play": Verb(("play", "plays"), ("spielt", "spielen"), ("juega", "juegan"), ("gioca", "giocano"),
                 frozenset({"human", "dog", "cat"}), locative=True, with_tags=frozenset({"human", "animal", "toy"})),
    "swim": Verb(("swim", "swims"), ("schwimmt", "schwimmen"), ("nada", "nadan"), ("nuota", "nuotano"),
                 frozenset({"human", "dog", "horse"}), with_tags=_ANIM),
    # transitive
    "see": Verb(("see", "sees"), ("sieht", "sehen"), ("ve", "ven"), ("vede", "vedono"),
                _ANIM, objects=frozenset({"human", "animal", "thing"}), clause=True, locative=True),
    "find": Verb(("find", "finds"), ("findet", "finden"), ("encuentra", "encuentran"), ("trova", "trovano"),
                 _ANIM, objects=frozenset({"human", "animal", "thing"}), locative=True),
    "hear": Verb(("hear", "hears"), ("hört", "hören"), ("oye", "oyen"), ("sente", "sentono"),
                 _ANIM, objects=_ANIM),
    "love": Verb(("love", "loves"), ("liebt", "lieben"), ("ama", "aman"), ("ama", "amano"),
                 _HUM, objects=frozenset({"human", "animal", "thing"})),
    "eat": Verb(("eat", "eats"), ("isst", "essen"), ("come", "comen"), ("mangia", "mangiano"),
                _ANIM, objects=frozenset({"food"}), locative=True, de_animal=("frisst", "fressen")),
    "read": Verb(("read", "reads"), ("liest", "lesen"), ("lee", "leen"), ("legge", "leggono"),
                 _HUM, objects=frozenset({"readable"}), locative=True),
    "help": Verb(("help", "helps"), ("hilft", "helfen"), ("ayuda", "ayudan"), ("aiuta", "aiutano"),
                 _HUM, objects=_ANIM, de_case="dat"),
    # clause-embedding only
    "know": Verb(("know", "knows"), ("weiß", "wissen"), ("sabe", "saben"), ("sa", "sanno"), _HUM, clause=True),
    "say": Verb(("say", "says"), ("sagt", "sagen"), ("dice", "dicen"), ("dice", "dicono"), _HUM, clause=True),
}

# Subjects of clause-embedding uses of "see" are restricted to humans when sampling.
CLAUSE_SUBJECTS: frozenset[str] = _HUM

# Locative prepositions: English key -> (German, Spanish, Italian).
# Italian "in" / "su" fuse with the definite article (nel, sul, ...); "sotto" does not.
LOCATIVE_PREPS: dict[str, tuple[str, str, str]] = {
    "on": ("auf", "sobre", "su"),
    "in": ("in", "en", "in"),
    "under": ("unter", "debajo de", "sotto"),
}
# Comitative "with".
WITH_PREP: tuple[str, str, str] = ("mit", "con", "con")

# Adverbial conjunctions introducing a subordinate clause: English -> (de, es, it).
CONJUNCTIONS: dict[str, tuple[str, str, str]] = {
    "because": ("weil", "porque", "perché"),
    "while": ("während", "mientras", "mentre"),
}
# Complementiser "that": (de, es, it).
COMPLEMENTIZER: tuple[str, str, str] = ("dass", "que", "che")
