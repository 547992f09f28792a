"""CommonGen: write one sentence that uses every concept of a set (paper: "Results on CommonGen").

Prompts: one per concept set (``adapters/tasks/commongen/data.py``); by default the paper's 10
diagnostic sets. Generation is free text: no grammar; the alphabet is ASCII letters, the space
and ordinary punctuation
(:data:`~raptb.adapters.tasks.commongen.english.SENTENCE_CHARACTERS`), so the legal tokens of any
tokenizer are its non-special tokens made of those characters (SmolLM2's word pieces with their
leading space, or the embedded model's single characters: words from
characters). The stop action is ``"."`` (:attr:`CommonGenTask.stop`), or EOS where a tokenizer has
no single "." token; min 4 / max 20 tokens.

Task score per prefix (tasks-more.md), with x_k the text of the first k tokens:

    c_k = coverage_weight * coverage(x_k) + quality_weight * quality(x_k)            (k < tau)
    c_tau = the same + hard_coverage_bonus * [every concept present]                (terminal)

coverage = fraction of concepts present (lemma match,
:func:`~raptb.adapters.tasks.commongen.english.lemma_forms` on both sides); quality = the best
bigram F1 of x_k against the set's references (``core/metrics/text_overlap.py``), or sentence
BLEU-4 with exponential smoothing (sacrebleu) divided by 100 when ``quality="bleu"``. The
terminal text must also be one valid sentence
(:func:`~raptb.adapters.tasks.commongen.english.sentence_problems`); an invalid one scores 0, as
every task's invalid text does. A partial last word of a prefix counts as typed (a shaping
signal only).

:meth:`CommonGenTask.score` is the terminal score; :meth:`CommonGenTask.prefix_score` the score of a
prefix that is not the sample's last (k < tau), which the trainer must use there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from raptb.adapters.tasks.commongen.data import ConceptSet, diagnostic_concept_sets
from raptb.adapters.tasks.commongen.english import (
    SENTENCE_CHARACTERS,
    SENTENCE_END,
    is_valid_sentence,
    lemma_forms,
    words,
)

if TYPE_CHECKING:
    from sacrebleu.metrics import BLEU
from raptb.core.metrics.text_overlap import max_bigram_f1
from raptb.core.ports import Score, check_length_bounds

QualityMeasure = Literal["bigram_f1", "bleu"]
QUALITY_MEASURES: tuple[str, ...] = ("bigram_f1", "bleu")


@dataclass(frozen=True)
class RewardParts:
    """The components of one text's score: coverage and quality in [0, 1], full coverage, valid."""

    coverage: float
    quality: float
    full_coverage: bool
    valid: bool


@dataclass(frozen=True)
class _Target:
    """What a prompt's text is scored against: lemma forms per concept, reference words."""

    concept_forms: tuple[frozenset[str], ...]
    references: tuple[str, ...]
    reference_words: tuple[tuple[str, ...], ...]


@dataclass
class CommonGenTask:
    """The CommonGen task (implements :class:`raptb.core.ports.Task`; module doc for the reward)."""

    concept_sets: Sequence[ConceptSet] = field(default_factory=diagnostic_concept_sets)
    min_length: int = 4
    max_length: int = 20
    coverage_weight: float = 1.0
    quality_weight: float = 1.0
    hard_coverage_bonus: float = 1.0
    quality: QualityMeasure = "bigram_f1"
    name: str = field(default="commongen", init=False)
    alphabet: str = field(default="".join(sorted(SENTENCE_CHARACTERS)), init=False)
    grammar: None = field(default=None, init=False)
    stop: str = field(default=".", init=False)
    _targets: dict[str, _Target] = field(default_factory=dict, init=False, repr=False)
    _bleu: BLEU = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_length_bounds(self.min_length, self.max_length)
        if self.quality not in QUALITY_MEASURES:
            raise ValueError(
                f"commongen.quality: must be one of {QUALITY_MEASURES}, got {self.quality!r}"
            )
        for name in ("coverage_weight", "quality_weight", "hard_coverage_bonus"):
            if getattr(self, name) < 0:
                raise ValueError(f"commongen.{name}: must be >= 0, got {getattr(self, name)}")
        if not self.concept_sets:
            raise ValueError("commongen.prompts: no concept set")
        from sacrebleu.metrics import BLEU  # at build: a task lookup does not import sacrebleu

        self._bleu = BLEU(effective_order=True, smooth_method="exp")
        for concept_set in self.concept_sets:
            if not concept_set.concepts:
                raise ValueError("commongen.prompts: a concept set has no concept")
            prompt = concept_set.prompt
            if prompt in self._targets:
                raise ValueError(f"commongen.prompts: {prompt!r} is listed twice")
            self._targets[prompt] = _Target(
                concept_forms=tuple(lemma_forms(c.lower()) for c in concept_set.concepts),
                references=concept_set.references,
                reference_words=tuple(tuple(words(r)) for r in concept_set.references),
            )

    def prompts(self) -> list[str]:
        """One prompt per concept set, in the given order."""
        return list(self._targets)

    def _target(self, prompt: str) -> _Target:
        try:
            return self._targets[prompt]
        except KeyError:
            raise ValueError(f"prompt: {prompt!r} is not one of this task's prompts") from None

    def references(self, prompt: str) -> tuple[str, ...]:
        """The human reference sentences of ``prompt``'s concept set."""
        return self._target(prompt).references

    def sentence(self, text: str) -> str:
        """The sentence a finished sample writes: its text (which excludes the stop) followed by
        the stop's ".", or the text alone when it already ends with a final mark (".", "!" or
        "?": a sentence has one; where the stop is EOS, a tokenizer without a single "." token,
        the text writes its own)."""
        return text if text.rstrip()[-1:] in SENTENCE_END else text + self.stop

    def parts(self, prompt: str, text: str) -> RewardParts:
        """Coverage, quality, full coverage and sentence validity of ``text`` for ``prompt``."""
        coverage, quality, full = self._overlap(prompt, text)
        return RewardParts(coverage, quality, full, valid=is_valid_sentence(text))

    def _overlap(self, prompt: str, text: str) -> tuple[float, float, bool]:
        """(coverage, quality, full coverage) of ``text``: the parts that need the concept set
        and references (validity, a property of the text alone, is checked apart)."""
        target = self._target(prompt)
        text_words = words(text)
        forms: set[str] = set()
        for word in text_words:
            forms |= lemma_forms(word)
        present = sum(not concept.isdisjoint(forms) for concept in target.concept_forms)
        if self.quality == "bleu":
            # min: sacrebleu's percentage of a perfect match can exceed 100 by rounding
            quality = (
                min(1.0, self._bleu.sentence_score(text, list(target.references)).score / 100.0)
                if target.references and text_words
                else 0.0
            )
        else:
            quality = max_bigram_f1(text_words, target.reference_words)
        total = len(target.concept_forms)
        return present / total, quality, present == total

    def prefix_score(self, prompt: str, text: str) -> Score:
        """c_k of a prefix that is not the sample's last: coverage and quality, no bonus (and no
        validity check: a prefix is not judged as a sentence)."""
        coverage, quality, _ = self._overlap(prompt, text)
        return Score(self.coverage_weight * coverage + self.quality_weight * quality, True)

    def score(self, prompt: str, text: str) -> Score:
        """c_tau of a finished sentence (prefix terms plus the hard bonus); 0 when invalid (then
        nothing else is computed)."""
        self._target(prompt)  # an unknown prompt is an error, whatever the text
        if not is_valid_sentence(text):
            return Score(0.0, False)
        coverage, quality, full = self._overlap(prompt, text)
        value = self.coverage_weight * coverage + self.quality_weight * quality
        return Score(value + self.hard_coverage_bonus * full, True)
