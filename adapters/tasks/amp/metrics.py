"""AMP metrics of Jain et al. (2022) on the top-k generated peptides by oracle score.

Top-k: the k (default 100) distinct valid samples with the highest oracle score (ties broken by
first occurrence); then

    Perf = mean oracle score;   Div = mean Levenshtein distance over unordered pairs;
    Novelty = mean over the top-k of the minimum Levenshtein distance to the training peptides
    (the shipped 3,219, :func:`~raptb.adapters.tasks.amp.task.training_peptides`);
    Len = mean length.

Distances come from rapidfuzz's C++ Levenshtein (unit costs), all pairs in one ``cdist`` call;
``tests/adapters/test_amp_metrics.py`` checks it against a plain dynamic-programming reference.
Top-k keeps distinct sequences only (our choice): a repeated sample would enter Div at distance 0
and take a top-k slot twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TOP_K = 100


def levenshtein_matrix(a: Sequence[str], b: Sequence[str]) -> np.ndarray:
    """Levenshtein distances int32 [len(a), len(b)] (insert, delete, substitute cost 1)."""
    if not a or not b:
        return np.zeros((len(a), len(b)), dtype=np.int32)
    from rapidfuzz.distance import Levenshtein  # at use: a task lookup does not import rapidfuzz
    from rapidfuzz.process import cdist

    return cdist(list(a), list(b), scorer=Levenshtein.distance, dtype=np.int32, workers=1)


def top_k(sequences: Sequence[str], scores: Sequence[float], k: int = TOP_K) -> list[int]:
    """Indices of the ``k`` highest-scoring distinct sequences, best first (stable on ties)."""
    if len(sequences) != len(scores):
        raise ValueError(f"top_k: {len(sequences)} sequences but {len(scores)} scores")
    if k < 1:
        raise ValueError(f"top_k: k must be >= 1, got {k}")
    first: dict[str, int] = {}
    for index, sequence in enumerate(sequences):
        first.setdefault(sequence, index)
    distinct = list(first.values())
    order = sorted(distinct, key=lambda i: -float(scores[i]))
    return order[:k]


def amp_metrics(
    sequences: Sequence[str],
    scores: Sequence[float],
    valid: Sequence[bool],
    training: Sequence[str],
    k: int = TOP_K,
) -> dict[str, float]:
    """Perf, Div, Novelty and Len of the top-``k`` valid samples (0 for an empty selection).

    Also reports ``TopK`` (how many samples were selected: fewer than k when there are fewer
    distinct valid samples).
    """
    if not len(sequences) == len(scores) == len(valid):
        raise ValueError(
            f"amp_metrics: {len(sequences)} sequences, {len(scores)} scores, {len(valid)} flags"
        )
    kept = [i for i, ok in enumerate(valid) if ok]
    chosen = [kept[j] for j in top_k([sequences[i] for i in kept], [scores[i] for i in kept], k)]
    top = [sequences[i] for i in chosen]
    if not top:
        return {"Perf": 0.0, "Div": 0.0, "Novelty": 0.0, "Len": 0.0, "TopK": 0}
    pairwise = levenshtein_matrix(top, top)
    n = len(top)
    div = float(pairwise[np.triu_indices(n, 1)].mean()) if n > 1 else 0.0
    novelty = float(levenshtein_matrix(top, training).min(axis=1).mean()) if training else 0.0
    return {
        "Perf": float(np.mean([scores[i] for i in chosen])),
        "Div": div,
        "Novelty": novelty,
        "Len": float(np.mean([len(s) for s in top])),
        "TopK": n,
    }
