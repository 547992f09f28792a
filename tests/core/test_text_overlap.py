"""Bigram F1 and Delta log p_term against hand-computed values."""

import math

import pytest

from raptb.core.metrics.termination import delta_log_pterm
from raptb.core.metrics.text_overlap import bigram_f1, max_bigram_f1


def test_bigram_f1_hand_computed() -> None:
    # candidate bigrams: (a b) (b c) (c d); reference: (a b) (b c) (c a) (a b)
    # clipped overlap 2, precision 2/3, recall 2/4 -> F1 = 2 * (2/3)(1/2) / (2/3 + 1/2) = 4/7
    assert math.isclose(bigram_f1("a b c d".split(), "a b c a b".split()), 4 / 7)
    # repeated bigrams are clipped: candidate (a a) x2, reference (a a) x1 -> P 1/2, R 1, F1 2/3
    assert math.isclose(bigram_f1(["a", "a", "a"], ["a", "a"]), 2 / 3)


def test_bigram_f1_edges_and_max() -> None:
    assert bigram_f1(["one"], ["one", "two"]) == 0.0
    assert bigram_f1(["x", "y"], ["a", "b"]) == 0.0
    assert max_bigram_f1(["a", "b"], []) == 0.0
    assert max_bigram_f1(["a", "b"], [["c", "d"], ["a", "b"]]) == 1.0


def test_delta_log_pterm() -> None:
    assert math.isclose(delta_log_pterm([-1.0, -3.0], [-2.0, -2.5]), -2.0 + 2.25)
    with pytest.raises(ValueError, match="same samples"):
        delta_log_pterm([-1.0], [-1.0, -2.0])
    with pytest.raises(ValueError, match="finite"):
        delta_log_pterm([float("-inf")], [0.0])
