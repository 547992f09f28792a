"""CommonGen's BLEU is coco-caption's ``Bleu(4)``, the scorer of CommonGen's own evaluation: no
smoothing, so a concept set whose sentences share no 4-gram with the references scores 0.

The reference below transcribes pycocoevalcap 1.2 (``pycocoevalcap/bleu/bleu_scorer.py``:
``precook``, ``cook_refs``, ``cook_test`` and ``BleuScorer.compute_score`` with
``option="closest"``, as ``pycocoevalcap/bleu/bleu.py``'s ``Bleu.compute_score`` calls it; only
the corpus score, BLEU-4). Inputs are whitespace-tokenised sentences (coco-caption's input), on
which sacrebleu's 13a tokenisation splits the same tokens.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.adapters.tasks.commongen.metrics import corpus_bleu


def precook(s: str, n: int = 4) -> tuple[int, dict[tuple[str, ...], int]]:
    words = s.split()
    counts: dict[tuple[str, ...], int] = defaultdict(int)
    for k in range(1, n + 1):
        for i in range(len(words) - k + 1):
            ngram = tuple(words[i : i + k])
            counts[ngram] += 1
    return (len(words), counts)


def cook_refs(refs: list[str], n: int = 4) -> tuple[list[int], dict[tuple[str, ...], int]]:
    reflen = []
    maxcounts: dict[tuple[str, ...], int] = {}
    for ref in refs:
        rl, counts = precook(ref, n)
        reflen.append(rl)
        for ngram, count in counts.items():
            maxcounts[ngram] = max(maxcounts.get(ngram, 0), count)
    return (reflen, maxcounts)


def cook_test(test: str, refs: tuple, n: int = 4) -> dict:
    reflen, refmaxcounts = refs
    testlen, counts = precook(test, n)
    result: dict = {}
    result["reflen"] = min((abs(length - testlen), length) for length in reflen)[1]  # "closest"
    result["testlen"] = testlen
    result["guess"] = [max(0, testlen - k + 1) for k in range(1, n + 1)]
    result["correct"] = [0] * n
    for ngram, count in counts.items():
        result["correct"][len(ngram) - 1] += min(refmaxcounts.get(ngram, 0), count)
    return result


def coco_bleu4(hypotheses: list[str], references: list[str]) -> float:
    """BleuScorer(n=4).compute_score(option="closest")[0][3]: every hypothesis against all of
    ``references`` (0..1)."""
    n = 4
    small = 1e-9
    tiny = 1e-15  ## so that if guess is 0 still return 0
    testlen_total, reflen_total = 0, 0
    totalcomps = {"guess": [0] * n, "correct": [0] * n}
    for hypo in hypotheses:
        comps = cook_test(hypo, cook_refs(references))
        testlen_total += comps["testlen"]
        reflen_total += comps["reflen"]
        for key in ["guess", "correct"]:
            for k in range(n):
                totalcomps[key][k] += comps[key][k]
    bleus = []
    bleu = 1.0
    for k in range(n):
        bleu *= float(totalcomps["correct"][k] + tiny) / (totalcomps["guess"][k] + small)
        bleus.append(bleu ** (1.0 / (k + 1)))
    ratio = (testlen_total + tiny) / (reflen_total + small)  ## N.B.: avoid zero division
    if ratio < 1:
        for k in range(n):
            bleus[k] *= math.exp(1 - 1 / ratio)
    return bleus[3]


WORDS = ["a", "dog", "runs", "the", "park", "in", "cat", "sits", "on", "mat", "boy", "ball"]
# sentences of 4 tokens or more, as CommonGen's: shorter ones have no 4-gram to guess, where
# coco's epsilons turn 0 / 0 into 1e-6 and sacrebleu scores 0
sentence = st.lists(st.sampled_from(WORDS), min_size=3, max_size=9).map(
    lambda words: " ".join(words) + " ."
)
# coco's epsilons: with no 4-gram match its score is at most 100 * tiny^(1/4) = 0.018 BLEU
# (sacrebleu's: exactly 0); smoothing would add points
TOLERANCE = 0.02


@settings(max_examples=150, deadline=None)
@given(st.lists(sentence, min_size=1, max_size=6), st.lists(sentence, min_size=1, max_size=4))
def test_corpus_bleu_is_coco_captions_bleu4(hypotheses: list[str], references: list[str]) -> None:
    assert corpus_bleu(hypotheses, references) == pytest.approx(
        100 * coco_bleu4(hypotheses, references), abs=TOLERANCE
    )


def test_a_set_with_no_matching_4_gram_scores_0() -> None:
    hypotheses = ["a dog runs in the park .", "the cat sits on a mat ."]
    references = ["a dog runs through the park .", "the cat sat on the mat ."]
    assert 100 * coco_bleu4(hypotheses, references) < TOLERANCE
    assert corpus_bleu(hypotheses, references) == 0.0  # sacrebleu's default smoothing: 27.05


def test_the_transcription_is_pycocoevalcaps_scorer() -> None:
    bleu = pytest.importorskip("pycocoevalcap.bleu.bleu")
    hypotheses = ["a dog runs in the park .", "the boy runs in the park .", "a cat ."]
    references = ["a dog runs in a park .", "the boy plays in the park with a ball ."]
    gts = {i: list(references) for i in range(len(hypotheses))}
    res = {i: [h] for i, h in enumerate(hypotheses)}
    score, _ = bleu.Bleu(4).compute_score(gts, res, verbose=0)
    assert coco_bleu4(hypotheses, references) == pytest.approx(score[3], rel=1e-12)
