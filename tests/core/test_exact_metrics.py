"""Exact metrics over Y* (core.metrics.exact): hand-computed values, brute-force references and
properties (Hypothesis)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.metrics import exact as em

PI = [0.1, 0.2, 0.3]
LOG_PI = np.log(PI)

probabilities = st.lists(st.floats(min_value=1e-12, max_value=1.0), min_size=1, max_size=8).map(
    lambda xs: np.asarray(xs) / (sum(xs) * 1.25)
)  # a sub-distribution: mass 0.8 on Y*


def test_hand_computed_metrics() -> None:
    assert em.solution_mass(LOG_PI) == pytest.approx(0.6)
    assert em.mass_by_length(LOG_PI, [3, 5, 5]) == pytest.approx({3: 0.1, 5: 0.5})
    # p* uniform (1/3 each) against pi | Y* = (1/6, 1/3, 1/2)
    kl = (math.log(2) + 0 + math.log(2 / 3)) / 3
    assert em.conditional_kl(np.zeros(3), LOG_PI) == pytest.approx(kl)
    assert em.expected_distinct(LOG_PI, 2) == pytest.approx(0.19 + 0.36 + 0.51)
    assert em.expected_distinct(LOG_PI, 0) == 0.0
    # q = (0.19, 0.36, 0.51) at N = 2
    bound = math.sqrt(0.19 * 0.81 + 0.36 * 0.64 + 0.51 * 0.49)
    assert em.distinct_sd_bound(LOG_PI, 2) == pytest.approx(bound)
    out = em.exact_metrics(LOG_PI, LOG_PI, [3, 5, 5], draws=[1, 2])
    assert out["acc"] == pytest.approx(0.6)
    assert out["log_acc"] == pytest.approx(math.log(0.6))
    assert out["mass_by_length"] == pytest.approx({"3": 0.1, "5": 0.5})
    assert out["kl_target_pi"] == pytest.approx(kl)
    assert out["expected_distinct"] == pytest.approx({"1": 0.6, "2": 1.06})
    assert out["n_solutions"] == 3
    # p* uniform over 3 solutions: E_2 = 3 (1 - (2/3)^2) = 5/3
    assert out["target_expected_distinct"] == pytest.approx({"1": 1.0, "2": 5 / 3})


def test_target_weights_and_unreachable_solutions() -> None:
    # p* = (1/2, 1/2, 0): the third solution does not count, whatever pi gives it
    target = np.array([0.0, 0.0, -np.inf])
    kl = 0.5 * math.log(0.5 / (1 / 6)) + 0.5 * math.log(0.5 / (1 / 3))
    assert em.conditional_kl(target, LOG_PI) == pytest.approx(kl)
    assert em.conditional_kl(np.zeros(3), [math.log(0.5), math.log(0.5), -math.inf]) == math.inf
    assert em.expected_distinct([math.log(0.5), -math.inf], 3) == pytest.approx(0.875)
    # the target's own E_N uses p* normalised: (1/2, 1/2, 0) at N = 2 gives 2 (1 - 1/4)
    out = em.exact_metrics(LOG_PI, LOG_PI, [3, 5, 5], draws=[2], log_target=target + 7.0)
    assert out["target_expected_distinct"] == pytest.approx({"2": 1.5})


def test_extreme_probabilities_keep_precision() -> None:
    # naive 1 - (1 - p)^N is 0 in float64 for p = 1e-20; the stable form gives N p
    assert em.expected_distinct([math.log(1e-20)], 10**6) == pytest.approx(1e-14, rel=1e-9)
    # pi = 1 - 1e-12: naive log(1 - pi) loses 4 digits; (1 - pi)^2 = 1e-24, q = 1 - 1e-24
    log_pi = math.log1p(-1e-12)
    assert em.log1m_exp(np.array([log_pi]))[0] == pytest.approx(math.log(1e-12), rel=1e-9)
    assert em.expected_distinct([log_pi], 2) == 1.0
    assert em.expected_distinct([0.0], 5) == 1.0


@settings(max_examples=60, deadline=None)
@given(probabilities, st.integers(min_value=1, max_value=50))
def test_expected_distinct_matches_the_direct_formula(pi, n) -> None:
    direct = sum(1 - (1 - p) ** n for p in pi)
    assert em.expected_distinct(np.log(pi), n) == pytest.approx(direct, rel=1e-9, abs=1e-15)
    assert em.expected_distinct(np.log(pi), 1) == pytest.approx(pi.sum())
    assert em.expected_distinct(np.log(pi), n) <= min(len(pi), n) + 1e-12


@settings(max_examples=60, deadline=None)
@given(probabilities, st.lists(st.floats(min_value=-5, max_value=5), min_size=8, max_size=8))
def test_conditional_kl_matches_the_direct_formula(pi, weights) -> None:
    target = np.asarray(weights[: len(pi)])
    p = np.exp(target) / np.exp(target).sum()
    q = pi / pi.sum()
    direct = float(np.sum(p * np.log(p / q)))
    assert em.conditional_kl(target, np.log(pi)) == pytest.approx(direct, rel=1e-9, abs=1e-12)
    assert em.conditional_kl(target, np.log(pi)) >= -1e-12
    # pi proportional to p* on Y* (any total mass): zero divergence
    assert em.conditional_kl(target, np.log(0.3 * p)) == pytest.approx(0.0, abs=1e-12)


def test_distinct_sd_bound_holds_against_exhaustive_variance() -> None:
    # two solutions (0.3, 0.2) and a third outcome (0.5) outside Y*, N = 4: enumerate all 3^4
    # draws for the exact variance of the distinct-solution count
    probs, n = [0.3, 0.2, 0.5], 4
    counts, weights = [], []
    for draw in itertools.product(range(3), repeat=n):
        weights.append(math.prod(probs[i] for i in draw))
        counts.append(len({i for i in draw if i < 2}))
    mean = np.dot(weights, counts)
    variance = np.dot(weights, (np.asarray(counts) - mean) ** 2)
    assert mean == pytest.approx(em.expected_distinct(np.log(probs[:2]), n))
    assert variance <= em.distinct_sd_bound(np.log(probs[:2]), n) ** 2 + 1e-12


@settings(max_examples=40, deadline=None)
@given(
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=1, max_value=40),
    st.sampled_from([0.5, 0.9, 0.95, 0.99]),
)
def test_binomial_interval_matches_the_binomial_cdf(p, n, confidence) -> None:
    lo, hi = em.binomial_interval(p, n, confidence)
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    cdf = np.cumsum(pmf)
    tail = (1 - confidence) / 2
    assert round(lo * n) == next(k for k in range(n + 1) if cdf[k] >= tail - 1e-12)
    assert round(hi * n) == next(k for k in range(n + 1) if cdf[k] >= 1 - tail - 1e-12)
    covered = sum(pmf[round(lo * n) : round(hi * n) + 1])
    assert covered >= confidence - 1e-9


def test_binomial_interval_hand_computed() -> None:
    # Binomial(4, 1/2): CDF 1/16, 5/16, 11/16, 15/16, 1 -> 2.5% at k = 0, 97.5% at k = 4
    assert em.binomial_interval(0.5, 4) == (0.0, 1.0)
    # 50% interval: 25% reached at k = 1, 75% at k = 3
    assert em.binomial_interval(0.5, 4, 0.5) == (0.25, 0.75)
    assert em.binomial_interval(0.0, 10) == (0.0, 0.0)
    # Binomial(1, 1/4): the CDF is 3/4 at k = 0, exactly the 75% level of a 50% interval
    assert em.binomial_interval(0.25, 1, 0.5) == (0.0, 0.0)
    with pytest.raises(ValueError, match="p:"):
        em.binomial_interval(1.5, 10)


def test_compare_with_sampled() -> None:
    exact = em.exact_metrics(LOG_PI, LOG_PI, [3, 5, 5], draws=[4])
    sampled = {"n_samples": 4, "acc": 0.5, "cov_count": 2, "count_by_length": {"3": 0, "5": 2}}
    out = em.compare_with_sampled(exact, sampled)
    assert out["acc"]["sampled"] == 0.5 and out["acc"]["exact"] == pytest.approx(0.6)
    assert out["acc"]["interval"] == list(em.binomial_interval(0.6, 4)) and out["acc"]["inside"]
    expected = em.expected_distinct(LOG_PI, 4)
    assert out["distinct"]["expected"] == pytest.approx(expected)
    assert out["distinct"]["z"] == pytest.approx((2 - expected) / em.distinct_sd_bound(LOG_PI, 4))
    assert out["mass_by_length"]["5"]["sampled"] == 0.5
    assert out["mass_by_length"]["3"]["exact"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="N = 7"):
        em.compare_with_sampled(exact, {**sampled, "n_samples": 7})


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="log_pi"):
        em.solution_mass([0.5])
    with pytest.raises(ValueError, match="lengths"):
        em.mass_by_length(LOG_PI, [1, 2])


def test_distances_to_the_target_hand_computed() -> None:
    # pi on Y* = (0.1, 0.2, 0.3), mass 0.4 off Y*; p* = 1/3 each; pi|Y* = (1/6, 1/3, 1/2)
    third = 1 / 3
    assert em.total_variation(np.zeros(3), LOG_PI) == pytest.approx(0.5 * (1 / 6 + 0 + 1 / 6))
    # 1/2 (|0.1 - 1/3| + |0.2 - 1/3| + |0.3 - 1/3| + 0.4) = 1/2 (0.4 + 0.4)
    assert em.total_variation_all(np.zeros(3), LOG_PI) == pytest.approx(0.4)
    reverse = (1 / 6) * math.log(0.5) + third * 0.0 + 0.5 * math.log(1.5)
    assert em.reverse_conditional_kl(np.zeros(3), LOG_PI) == pytest.approx(reverse)
    # KL(p* || pi) = sum 1/3 log((1/3) / pi(x)); equals the conditional KL - log 0.6
    total = third * sum(math.log(third / p) for p in PI)
    assert em.target_kl_all(np.zeros(3), LOG_PI) == pytest.approx(total)
    assert total == pytest.approx(em.conditional_kl(np.zeros(3), LOG_PI) - math.log(0.6))
    # H(pi|Y*) = -(1/6 log 1/6 + 1/3 log 1/3 + 1/2 log 1/2), over log 3
    entropy = -sum(q * math.log(q) for q in (1 / 6, third, 0.5))
    assert em.uniformity(LOG_PI) == pytest.approx(entropy / math.log(3))
    # shares 1/2, 5/6, 1 from the most probable down: 1 mode for 50%, 3 for 90%
    assert em.active_modes(LOG_PI, 0.5) == 1 and em.active_modes(LOG_PI, 0.9) == 3
    assert em.correct_mass_curve(LOG_PI) == pytest.approx({1: 0.5, 2: 5 / 6, 3: 1.0})
    # pass@k = 1 - 0.4^k; pi(Y*) = 1 - 1e-15: 1 - (1e-15)^2 = 1 in float64 without 0.999...
    assert em.exact_pass_at_k(LOG_PI, 3) == pytest.approx(1 - 0.4**3)
    assert em.exact_pass_at_k([math.log1p(-1e-15)], 2) == 1.0
    assert em.exact_pass_at_k([math.log(1e-20)], 64) == pytest.approx(64e-20, rel=1e-9)
    out = em.exact_metrics(LOG_PI, LOG_PI, [3, 5, 5], draws=[2], curve=[1, 2])
    assert out["pass_at_k"] == pytest.approx({str(k): 1 - 0.4**k for k in (1, 8, 64, 256)})
    assert out["tv_target_pi_all"] == pytest.approx(0.4)
    assert out["kl_pi_target"] == pytest.approx(reverse)
    assert out["kl_target_pi_all"] == pytest.approx(total)
    assert out["active_modes"] == {"50": 1, "90": 3}
    assert out["distinct_curve"] == pytest.approx({"1": 0.6, "2": 1.06})
    assert out["target_distinct_curve"] == pytest.approx({"1": 1.0, "2": 5 / 3})


def test_uniform_and_degenerate_policies() -> None:
    # uniform over 4 solutions with mass 0.8: shape exactly the target's
    log_pi = np.log(np.full(4, 0.2))
    assert em.total_variation(np.zeros(4), log_pi) == pytest.approx(0.0, abs=1e-15)
    assert em.total_variation_all(np.zeros(4), log_pi) == pytest.approx(0.2)
    assert em.reverse_conditional_kl(np.zeros(4), log_pi) == pytest.approx(0.0, abs=1e-15)
    assert em.uniformity(log_pi) == pytest.approx(1.0)
    assert em.active_modes(log_pi, 0.5) == 2  # exactly half at 2: rounding must not make it 3
    assert em.active_modes(log_pi, 0.9) == 4
    # ten solutions of 1/10: the cumulative sum reaches 0.5 and 0.9 only up to rounding
    tenths = np.log(np.full(10, 0.1))
    assert (em.active_modes(tenths, 0.5), em.active_modes(tenths, 0.9)) == (5, 9)
    # all the correct mass on one of 4 solutions, one never emitted
    point = np.array([0.0, -np.inf, -np.inf, -np.inf])
    assert em.uniformity(point) == pytest.approx(0.0)
    assert em.active_modes(point, 0.9) == 1
    assert em.reverse_conditional_kl(np.zeros(4), point) == pytest.approx(math.log(4))
    assert em.target_kl_all(np.zeros(4), point) == math.inf
    assert em.total_variation(np.zeros(4), point) == pytest.approx(0.75)
    assert em.uniformity([math.log(0.3)]) == 1.0  # |Y*| = 1
    # no correct mass at all
    nothing = np.full(3, -np.inf)
    assert math.isnan(em.uniformity(nothing)) and em.active_modes(nothing, 0.5) == 0
    assert math.isnan(em.reverse_conditional_kl(np.zeros(3), nothing))
    assert math.isnan(em.total_variation(np.zeros(3), nothing))
    assert em.target_kl_all(np.zeros(3), nothing) == math.inf
    assert em.total_variation_all(np.zeros(3), nothing) == pytest.approx(1.0)
    assert em.correct_mass_curve(nothing) == {}
    with pytest.raises(ValueError, match="share"):
        em.active_modes(LOG_PI, 0.0)


@settings(max_examples=60, deadline=None)
@given(probabilities, st.lists(st.floats(min_value=-5, max_value=5), min_size=8, max_size=8))
def test_distances_match_direct_loops(pi, weights) -> None:
    target = np.asarray(weights[: len(pi)])
    p = [math.exp(w) / sum(math.exp(v) for v in target) for w in target]
    mass = sum(pi)
    q = [x / mass for x in pi]
    tv = 0.5 * sum(abs(a - b) for a, b in zip(q, p, strict=True))
    tv_all = 0.5 * (sum(abs(a - b) for a, b in zip(pi, p, strict=True)) + (1 - mass))
    rev = sum(a * math.log(a / b) for a, b in zip(q, p, strict=True) if a > 0)
    kl_all = sum(b * math.log(b / a) for a, b in zip(pi, p, strict=True) if b > 0)
    assert em.total_variation(target, np.log(pi)) == pytest.approx(tv, abs=1e-12)
    assert em.total_variation_all(target, np.log(pi)) == pytest.approx(tv_all, abs=1e-12)
    assert em.reverse_conditional_kl(target, np.log(pi)) == pytest.approx(rev, rel=1e-9, abs=1e-12)
    assert em.target_kl_all(target, np.log(pi)) == pytest.approx(kl_all, rel=1e-9, abs=1e-12)
    entropy = -sum(a * math.log(a) for a in q if a > 0)
    expected = 1.0 if len(q) == 1 else entropy / math.log(len(q))
    assert em.uniformity(np.log(pi)) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(probabilities, st.sampled_from([0.1, 0.5, 0.9, 1.0]))
def test_active_modes_is_the_smallest_subset_holding_the_share(pi, share) -> None:
    # brute force over every subset of the (at most 8) solutions
    mass = sum(pi)
    smallest = min(
        size
        for size in range(1, len(pi) + 1)
        for subset in itertools.combinations(pi, size)
        if sum(subset) >= share * mass - 1e-12 * mass
    )
    assert em.active_modes(np.log(pi), share) == smallest
