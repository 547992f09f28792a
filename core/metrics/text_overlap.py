"""Word n-gram overlap between a candidate and reference sentences (pure Python).

CommonGen's quality shaping (``adapters/tasks/commongen/task.py``) scores every prefix against
the concept set's human references. Bigram F1 is the cheap, smooth choice: with multiset
(clipped) counts,

    precision = |B(c) & B(r)| / |B(c)|,  recall = |B(c) & B(r)| / |B(r)|,
    F1 = 2 P R / (P + R)  (0 when either side has no bigram),

where B(x) is the multiset of adjacent lower-cased word pairs of x. Against several references the
best F1 counts, as a human would accept the closest one. Recall grows with the prefix, so the
shaping rises as a sentence approaches a reference.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence


def bigrams(words: Sequence[str]) -> Counter[tuple[str, str]]:
    """Multiset of adjacent word pairs (words are compared as given)."""
    return Counter(itertools.pairwise(words))


def bigram_f1(candidate: Sequence[str], reference: Sequence[str]) -> float:
    """F1 of the clipped bigram overlap of two word sequences, in [0, 1]."""
    cand, ref = bigrams(candidate), bigrams(reference)
    if not cand or not ref:
        return 0.0
    overlap = sum((cand & ref).values())
    if overlap == 0:
        return 0.0
    precision = overlap / sum(cand.values())
    recall = overlap / sum(ref.values())
    return 2 * precision * recall / (precision + recall)


def max_bigram_f1(candidate: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """The best :func:`bigram_f1` of ``candidate`` over ``references`` (0 when there are none)."""
    return max((bigram_f1(candidate, reference) for reference in references), default=0.0)
