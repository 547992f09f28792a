"""The Vendi score (core.metrics.vendi): hand-computed values, the authors' code, the n x n
matrix with every duplicate spelled out, and Jaccard on Python sets as the kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.metrics.vendi import sample_vendi, vendi_score
from raptb.core.subm.similarity import ShingleJaccardSimilarity


def authors_score_k(K: np.ndarray, p: np.ndarray | None = None) -> float:
    """vertaix/Vendi-Score, vendi_score/vendi.py, commit 370134e585df6d28e882d442460979aed2ce3bcc:
    ``weight_K``, ``entropy_q`` (q = 1) and ``score_K`` transcribed (numpy's eigvalsh for
    scipy.linalg's, the same LAPACK routine)."""
    K_ = K / K.shape[0] if p is None else K * np.outer(np.sqrt(p), np.sqrt(p))
    w = np.linalg.eigvalsh(K_)
    p_ = w[w > 0]
    return float(np.exp(-(p_ * np.log(p_)).sum()))


def expanded_score(K: np.ndarray, counts: list[int]) -> float:
    """VS of the full n x n kernel, each item repeated by its multiplicity: the definition."""
    index = np.repeat(np.arange(len(counts)), counts)
    return authors_score_k(K[np.ix_(index, index)])


def set_jaccard(a: str, b: str) -> float:
    """Jaccard of the character 2-gram sets, on Python sets (no hashing, no Numba)."""
    sa = {a[i : i + 2] for i in range(len(a) - 1)} or {a}
    sb = {b[i : i + 2] for i in range(len(b) - 1)} or {b}
    return len(sa & sb) / len(sa | sb)


def test_hand_computed_values() -> None:
    assert vendi_score(np.ones((3, 3))) == pytest.approx(1.0)  # one item three times
    assert vendi_score(np.eye(4)) == pytest.approx(4.0)  # four dissimilar items
    # two dissimilar items weighted 3:1: exp(H(3/4, 1/4))
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert vendi_score(np.eye(2), [3, 1]) == pytest.approx(math.exp(entropy))
    # two items with similarity s, equal weights: eigenvalues (1 +- s) / 2
    s = 0.6
    half = np.array([(1 + s) / 2, (1 - s) / 2])
    assert vendi_score([[1, s], [s, 1]]) == pytest.approx(math.exp(-np.sum(half * np.log(half))))
    assert vendi_score(np.zeros((0, 0))) == 0.0
    # the diagonal is 1 whatever the kernel says (J({}, {}) = 0 for an empty item)
    assert vendi_score(np.zeros((2, 2))) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="square"):
        vendi_score(np.ones((2, 3)))
    with pytest.raises(ValueError, match="counts"):
        vendi_score(np.eye(2), [1, 0])


def test_samples_fold_duplicates_and_subsample() -> None:
    texts = ["12+12", "12+12", "4*6", "4*6", "4*6", "30-6"]
    sim = ShingleJaccardSimilarity(2).pairwise
    estimate = sample_vendi(texts, texts, sim)
    K = np.array(
        [[set_jaccard(a, b) for b in ("12+12", "4*6", "30-6")] for a in ("12+12", "4*6", "30-6")]
    )
    assert estimate.score == pytest.approx(expanded_score(K, [2, 3, 1]))
    assert (estimate.samples, estimate.distinct, estimate.subsampled) == (6, 3, False)
    small = sample_vendi(texts, texts, sim, max_distinct=2, seed=1)
    assert small.subsampled and small.samples == 2 and small.distinct <= 2
    assert sample_vendi([], [], sim).score == 0.0


distinct_texts = st.lists(
    st.text(alphabet="0123456789+-*/", min_size=1, max_size=7), min_size=1, max_size=12, unique=True
)


@settings(max_examples=60, deadline=None)
@given(distinct_texts, st.lists(st.integers(1, 5), min_size=12, max_size=12))
def test_folded_duplicates_equal_the_full_kernel(
    texts: list[str], multiplicities: list[int]
) -> None:
    counts = multiplicities[: len(texts)]
    K = np.array([[set_jaccard(a, b) for b in texts] for a in texts])
    samples = [t for t, m in zip(texts, counts, strict=True) for _ in range(m)]
    estimate = sample_vendi(samples, samples, ShingleJaccardSimilarity(2).pairwise)
    assert estimate.score == pytest.approx(expanded_score(K, counts), rel=1e-6)
    assert vendi_score(K, counts) == pytest.approx(
        authors_score_k(K, np.array(counts) / sum(counts)), rel=1e-9
    )
    assert 1.0 - 1e-9 <= estimate.score <= len(texts) + 1e-9


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_random_psd_kernels_match_the_authors_code(d: int, dim: int, seed: int) -> None:
    features = np.random.default_rng(seed).random((d, dim)) + 1e-3  # non-negative: K in [0, 1]
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    K = features @ features.T
    weights = np.random.default_rng(seed + 1).integers(1, 4, d)
    assert vendi_score(K, weights) == pytest.approx(
        authors_score_k(K, weights / weights.sum()), rel=1e-9
    )
    assert vendi_score(K) == pytest.approx(authors_score_k(K), rel=1e-9)
