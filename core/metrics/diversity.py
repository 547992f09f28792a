"""Pairwise diversity of a sample set: FPDiv and its length-binned macro average.

FPDiv = 1 - mean pairwise similarity over distinct pairs (0 with < 2 items); MacroFP = mean
FPDiv over length bins (0-5, 6-10, 11+ by default). SMILES uses the Tanimoto similarity of
packed Morgan fingerprints (``core.subm.similarity``); any pairwise similarity works.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

DEFAULT_FP_BINS: tuple[tuple[int, int | None], ...] = ((0, 5), (6, 10), (11, None))

PairwiseSimilarity = Callable[[Sequence[Any], Sequence[Any]], np.ndarray]


def _similarity_matrix(
    items: Sequence[Any], similarity: np.ndarray | PairwiseSimilarity
) -> np.ndarray:
    matrix = (
        np.asarray(similarity(items, items), dtype=np.float64)
        if callable(similarity)
        else np.asarray(similarity, dtype=np.float64)
    )
    if matrix.shape != (len(items), len(items)):
        raise ValueError(
            f"similarity must be a [{len(items)}, {len(items)}] matrix, got shape {matrix.shape}"
        )
    return matrix


def fp_div(items: Sequence[Any], similarity: np.ndarray | PairwiseSimilarity) -> float:
    """FPDiv = 1 - mean similarity over distinct pairs i < j; 0 with fewer than 2 items.

    ``similarity`` is either the [n, n] matrix for ``items`` or a pairwise function such as
    :meth:`raptb.core.ports.Similarity.pairwise` (``f(a, b) -> [len(a), len(b)]``).
    """
    if len(items) < 2:
        return 0.0
    matrix = _similarity_matrix(items, similarity)
    upper = np.triu_indices(len(items), k=1)
    return float(1.0 - matrix[upper].mean())


def macro_fp_div(
    items: Sequence[Any],
    lengths: Iterable[int] | np.ndarray,
    similarity: np.ndarray | PairwiseSimilarity,
    bins: Sequence[tuple[int, int | None]] = DEFAULT_FP_BINS,
) -> float:
    """MacroFP = mean over length bins [a, b] (b None: open) of FPDiv of the items in the bin."""
    sizes = np.asarray(lengths, dtype=np.int64)
    if sizes.shape != (len(items),):
        raise ValueError(f"lengths must have shape [{len(items)}], got {sizes.shape}")
    if not bins:
        raise ValueError("bins must not be empty")
    matrix = _similarity_matrix(items, similarity) if len(items) else np.zeros((0, 0))
    values = []
    for low, high in bins:
        inside = sizes >= low if high is None else (sizes >= low) & (sizes <= high)
        index = np.flatnonzero(inside)
        members = [items[int(i)] for i in index]
        values.append(fp_div(members, matrix[np.ix_(index, index)]))
    return float(np.mean(values))
