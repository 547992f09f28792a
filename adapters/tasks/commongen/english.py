"""Offline English word rules for CommonGen: words, lemma forms, a verb test, sentence validity.

Lemmas come from simplemma (MIT; English dictionary lookup, no model download). simplemma leaves
some inflections alone (``sitting`` stays ``sitting``), so :func:`lemma_forms` also tries the
regular suffix rules (-s/-es/-ies, -ed/-ied, -ing, doubled consonants, a restored final e) and
keeps every candidate of at least three letters.

Verb test (:func:`is_verb`). The release used spaCy's tagger, which needs a model download; here
a word is a verb iff one of its lemma forms is in :data:`VERB_LEXICON`, a closed list of about 300
common English verbs (auxiliaries, modals, and the verbs of everyday scenes that CommonGen's
concept sets describe). Limits, by design of a context-free rule: a noun spelled like a listed
verb counts as a verb ("a dance", "the walk"), so a verbless noun phrase built from such words
passes; a verb missing from the list and not inflected into a listed lemma does not count
("the dog barks" fails unless "bark" is listed, which it is; rarer verbs may not be).

Sentence validity (:func:`sentence_problems`), the paper's structural rules: ASCII letters, spaces
and ordinary punctuation only (no digits, no newlines), a capital first letter, one sentence (no
``.``, ``!`` or ``?`` except one final mark), at least two alphabetic words, and a verb.
"""

from __future__ import annotations

import re
from functools import lru_cache

WORD_PATTERN = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")
ORDINARY_PUNCTUATION = ",;:'\"!?.-()"
SENTENCE_CHARACTERS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz " + ORDINARY_PUNCTUATION
)
SENTENCE_END = frozenset(".!?")
MIN_WORDS = 2
# Shortest suffix-rule stem kept: shorter ones ("r" from "red") match concepts by accident.
MIN_STEM = 3

VERB_LEXICON = frozenset(
    """
    be have do can could may might must shall should will would ought need dare
    accept add admire agree allow answer appear apply arrive ask attach attack bake balance bark
    bathe beat become begin believe belong bend bite blow board boil bounce bow break breathe
    bring brush build burn buy call calm camp carry carve catch celebrate change chase chat check
    cheer chew choose chop clap clean clear climb close coach collect comb come compete cook cool
    cover crack crawl cross cry cut dance decorate deliver dig dine dip direct dive draw dream
    dress drink drip drive drop dry dunk dust earn eat enjoy enter escape examine exercise explain
    face fall feed feel fetch fight fill find finish fish fit fix flip float flow fly fold follow
    forget form freeze fry gather get give glide go grab graze greet grill grin grind grip grow
    guard guide hand hang happen hate head hear heat help hike hit hold hop hug hunt hurry hurt
    install iron jog join joke judge juggle jump keep kick kill kiss kneel knit knock know land
    last laugh lay lead lean learn leave lend let lick lie lift light like line listen live load
    lock look lose love make march mark marry measure meet melt milk mix mop move mow nap need
    nod note notice offer open order own pack paddle paint park pass pat pause pay peel perform
    pet pick pile pitch place plant play point polish pose pour practice pray prepare press pretend
    print pull pump punch push put race rain raise reach read relax remove repair rest return ride
    ring rinse rise roast rock roll row rub run rush sail sand save saw say score scrub see seem
    sell send serve set sew shake shave shine shoot shop shout show shovel shower shut sing sink
    sip sit skate ski skip sleep slice slide smile smell smoke snow soak speak spend spill spin
    splash spray spread squeeze stack stand stare start stay steer step stick stir stop store
    stretch strike stroll study surf swallow sweep swim swing take talk taste teach tear tell
    tend test thank think throw tie toss touch tow train travel trim try turn type understand use
    vacuum visit wade wait wake walk want warm wash watch water wave wear weave weld whisk win
    wipe wish work worry wrap wrestle write yell
    """.split()
)


def words(text: str) -> list[str]:
    """The alphabetic words of ``text`` in order, lower-cased (contractions kept whole)."""
    return [match.group(0).lower() for match in WORD_PATTERN.finditer(text)]


def _suffix_stems(word: str) -> set[str]:
    """Candidate base forms of a regularly inflected ``word`` (possibly non-words)."""
    stems: set[str] = set()
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix):
            stem = word[: -len(suffix)]
            stems.add(stem)
            if suffix in ("ing", "ed"):
                stems.add(stem + "e")  # baking -> bake, baked -> bake
                if len(stem) > 1 and stem[-1] == stem[-2]:
                    stems.add(stem[:-1])  # sitting -> sit, hopped -> hop
    if word.endswith(("ies", "ied")):
        stems.add(word[:-3] + "y")  # carries, carried -> carry
    return {stem for stem in stems if len(stem) >= MIN_STEM}


@lru_cache(maxsize=65_536)
def lemma_forms(word: str) -> frozenset[str]:
    """Every form ``word`` may stand for: itself, its simplemma lemma, its regular suffix stems.

    All lower-case; ``word`` is expected lower-case (as :func:`words` returns it).
    """
    import simplemma  # at use (18 MiB of dictionaries): a task lookup does not import it

    lemma = simplemma.lemmatize(word, lang="en").lower()
    return frozenset({word, lemma} | _suffix_stems(word) | _suffix_stems(lemma))


def is_verb(word: str) -> bool:
    """Whether ``word`` (lower-case) is a form of a verb of :data:`VERB_LEXICON` (module doc)."""
    return not lemma_forms(word).isdisjoint(VERB_LEXICON)


def sentence_problems(text: str) -> list[str]:
    """Why ``text`` is not one valid English sentence (empty when it is); see the module doc."""
    problems: list[str] = []
    stripped = text.strip()
    if not set(stripped) <= SENTENCE_CHARACTERS:
        problems.append("characters other than ASCII letters, spaces and ordinary punctuation")
    body = stripped[:-1] if stripped[-1:] in SENTENCE_END else stripped
    if SENTENCE_END & set(body):
        problems.append("more than one sentence")
    letters = [c for c in stripped if c.isalpha()]
    if not letters or not letters[0].isupper():
        problems.append("does not start with a capital letter")
    sentence_words = words(stripped)
    if len(sentence_words) < MIN_WORDS:
        problems.append(f"fewer than {MIN_WORDS} words")
    if not any(is_verb(word) for word in sentence_words):
        problems.append("no verb")
    return problems


def is_valid_sentence(text: str) -> bool:
    """Whether ``text`` passes every rule of :func:`sentence_problems`."""
    return not sentence_problems(text)
