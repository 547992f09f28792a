"""pass@k (core.metrics.pass_at_k): hand-computed values, the exact binomial ratio in rationals,
the authors' numpy code, and a brute force over the k-subsets."""

from __future__ import annotations

import itertools
from fractions import Fraction
from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.metrics.pass_at_k import mean_pass_at_k, pass_at_k, pass_at_k_report


def codex_estimator(n: int, c: int, k: int) -> float:
    """openai/human-eval, human_eval/evaluation.py, commit 9d3aa8bd1f0f972422d6fea2782eeaf3e3094048,
    ``estimate_pass_at_k.estimator`` (the Codex paper's Figure 3), transcribed line for line."""
    if n - c < k:
        return 1.0
    return 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))


def exact_ratio(n: int, c: int, k: int) -> Fraction:
    """1 - C(n - c, k) / C(n, k) in rationals (math.comb is 0 when n - c < k)."""
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def test_hand_computed_values() -> None:
    # n = 4, c = 1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(10, 0, 3) == 0.0  # no correct sample
    assert pass_at_k(10, 10, 3) == 1.0  # all correct
    assert pass_at_k(4, 2, 3) == 1.0  # n - c < k: every 3-subset holds a correct one
    assert pass_at_k(6400, 1, 1) == pytest.approx(1 / 6400)
    assert pass_at_k(6400, 1, 256) == pytest.approx(256 / 6400)  # one hit: k / n


def test_mean_over_prompts_and_k_above_n() -> None:
    # prompt a: n = 4, c = 1 -> pass@2 = 1/2; prompt b: n = 2, c = 2 -> 1; mean 3/4
    report = pass_at_k_report(["a", "a", "b", "a", "a", "b"], [1, 0, 1, 0, 0, 1], ks=(1, 2, 3))
    assert report["1"] == pytest.approx((0.25 + 1.0) / 2)
    assert report["2"] == pytest.approx(0.75)
    assert report["3"] is None  # prompt b has 2 < 3 samples: reported as null
    assert mean_pass_at_k([], [], 1) is None
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="same length"):
        pass_at_k_report(["a"], [True, False])


def test_brute_force_over_subsets() -> None:
    # the fraction of the k-subsets of 6 samples (2 correct) that hold a correct one
    correct = [1, 0, 0, 1, 0, 0]
    for k in range(1, 7):
        subsets = list(itertools.combinations(correct, k))
        hit = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(6, 2, k) == pytest.approx(hit)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 7000).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_matches_exact_rationals_and_the_authors_code(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    value = pass_at_k(n, c, k)
    assert value == pytest.approx(float(exact_ratio(n, c, k)), rel=1e-9, abs=1e-12)
    assert value == pytest.approx(codex_estimator(n, c, k), rel=1e-12, abs=1e-15)
    assert 0.0 <= value <= 1.0
