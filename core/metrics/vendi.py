"""The Vendi score: an effective number of distinct items under a similarity kernel.

Friedman & Dieng 2023 (arXiv 2210.02410, eq. 1): for n samples x_1..x_n and a positive
semi-definite similarity k with k(x, x) = 1, K_ij = k(x_i, x_j) and lambda the eigenvalues of
K / n,

    VS = exp(-sum_i lambda_i log lambda_i)          (0 log 0 = 0; the lambda sum to 1)

It is 1 when every sample is the same item, d for d equally weighted items that are pairwise
dissimilar (k = 0), and between the two when they resemble each other.

Duplicates are folded exactly: with d distinct items of multiplicities m_j (n = sum m_j) and
p_j = m_j / n, K / n = A K_d A^T / n (A the n x d membership matrix) has the same nonzero
eigenvalues as diag(sqrt p) K_d diag(sqrt p), the weighted score of the authors' code
(vertaix/Vendi-Score, ``vendi_score/vendi.py``, ``score_K`` with ``p``). The cost is one
similarity matrix and one symmetric eigendecomposition on the d distinct items, O(d^2) memory
and O(d^3) time. Past ``max_distinct`` distinct items, :func:`sample_vendi` scores a uniform
subsample (without replacement, seeded) of ``max_distinct`` samples instead, and says so.

The kernel's diagonal is set to 1 (an item is itself: Jaccard's J({}, {}) = 0 convention would
otherwise drop an empty item), and eigenvalues <= 0 (rounding of a PSD kernel, or a kernel that
is not PSD) are left out of the entropy, as the authors' ``entropy_q`` does.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raptb.core.metrics.diversity import PairwiseSimilarity

DEFAULT_VENDI_DISTINCT = 4096
"""Distinct items past which :func:`sample_vendi` subsamples (an eigendecomposition of
4,096 x 4,096 takes 6-12 s on one core of a shared 2-core CPU, 2,048 about 1 s:
benchmarks/vendi.md)."""


def vendi_score(
    similarity: np.ndarray, counts: Sequence[float] | np.ndarray | None = None
) -> float:
    """VS of d distinct items: similarity [d, d] symmetric, counts [d] their multiplicities
    (default 1 each). 0.0 when d = 0."""
    kernel = np.array(similarity, dtype=np.float64)
    d = kernel.shape[0] if kernel.ndim == 2 else -1
    if kernel.shape != (d, d):
        raise ValueError(f"similarity: expected a square [d, d] matrix, got {kernel.shape}")
    weights = np.ones(d) if counts is None else np.asarray(counts, dtype=np.float64)
    if weights.shape != (d,):
        raise ValueError(f"counts: expected shape ({d},), got {weights.shape}")
    if np.any(weights <= 0) or not np.all(np.isfinite(weights)):
        raise ValueError("counts: every multiplicity must be finite and > 0")
    if not np.all(np.isfinite(kernel)):
        raise ValueError("similarity: every value must be finite")
    if d == 0:
        return 0.0
    kernel = (kernel + kernel.T) / 2.0
    np.fill_diagonal(kernel, 1.0)
    root = np.sqrt(weights / weights.sum())
    eigenvalues = np.linalg.eigvalsh(kernel * np.outer(root, root))
    positive = eigenvalues[eigenvalues > 0]
    return float(np.exp(-np.sum(positive * np.log(positive))))


@dataclass(frozen=True)
class VendiEstimate:
    """A sample set's Vendi score and what it was computed on.

    score: VS. samples: the samples scored (all N, or the subsample). distinct: distinct items
    among them. subsampled: whether a subsample of ``max_distinct`` samples was scored.
    """

    score: float
    samples: int
    distinct: int
    subsampled: bool


def sample_vendi(
    items: Sequence[Any],
    keys: Sequence[Hashable],
    similarity: PairwiseSimilarity,
    *,
    max_distinct: int = DEFAULT_VENDI_DISTINCT,
    seed: int = 0,
) -> VendiEstimate:
    """VS of N samples: items [N] (what ``similarity`` compares: texts, fingerprints), keys [N]
    (equal keys: the same item). ``similarity(a, b)`` -> [len(a), len(b)] (a ``Similarity``'s
    ``pairwise``). Over ``max_distinct`` distinct items, a seeded uniform subsample of
    ``max_distinct`` samples is scored."""
    if len(items) != len(keys):
        raise ValueError(f"items and keys differ in length: {len(items)} vs {len(keys)}")
    if max_distinct < 1:
        raise ValueError(f"max_distinct must be >= 1, got {max_distinct}")
    chosen = np.arange(len(items))
    subsampled = len(set(keys)) > max_distinct
    if subsampled:
        rng = np.random.default_rng(seed)
        chosen = np.sort(rng.choice(len(items), size=max_distinct, replace=False))
    slots: dict[Hashable, int] = {}
    positions: list[int] = []  # each distinct item's first chosen sample
    counts: list[int] = []
    for i in map(int, chosen):
        slot = slots.setdefault(keys[i], len(positions))
        if slot == len(positions):
            positions.append(i)
            counts.append(0)
        counts[slot] += 1
    representatives = [items[i] for i in positions]
    matrix = (
        np.asarray(similarity(representatives, representatives), dtype=np.float64)
        if representatives
        else np.zeros((0, 0))
    )
    return VendiEstimate(
        score=vendi_score(matrix, np.asarray(counts, dtype=np.float64)),
        samples=int(chosen.size),
        distinct=len(positions),
        subsampled=subsampled,
    )
