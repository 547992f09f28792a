"""Metrics of metrics.md: hand-computed examples, slow references and properties."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core import metrics as m

H_2_1 = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))  # entropy of (2/3, 1/3)
H_3_1 = -(3 / 4 * math.log(3 / 4) + 1 / 4 * math.log(1 / 4))  # entropy of (3/4, 1/4)

sequences_strategy = st.lists(st.text(alphabet="abc", max_size=5), max_size=12)


# ----------------------------------------------------------------------------- terminal


def test_terminal_metrics_hand_computed() -> None:
    valid = [True, True, False, True, True]
    lengths = [1, 2, 7, 3, 4]
    scores = [1.0, 0.5, 9.0, 0.0, 0.5]
    assert m.accuracy(valid) == 0.8
    assert m.mean_score(scores, valid) == pytest.approx(0.5)
    assert m.mean_length(lengths, valid) == pytest.approx(2.5)
    assert m.length_percentile(lengths, valid, 50) == pytest.approx(2.5)
    assert m.length_percentile(lengths, valid, 90) == pytest.approx(3.7)
    assert m.length_count(lengths, valid, 2, 3) == 2
    assert m.length_count(lengths, valid, 3, None) == 2
    assert m.length_fraction(lengths, valid, 2, 3) == pytest.approx(0.5)
    assert m.length_fraction(lengths, valid, 7, 7) == 0.0


def test_log_pterm_hand_computed() -> None:
    values, lengths = [-1.0, -2.0, -4.0], [1, 2, 1]
    assert m.mean_log_pterm(values) == pytest.approx(-7 / 3)
    assert m.log_pterm_by_length(values, lengths) == {1: -2.5, 2: -2.0}


def test_uniqueness_hand_computed() -> None:
    sequences = ["ab", "ab", "c", "zz"]
    valid = [True, True, True, False]
    assert m.unique_count(sequences, valid) == 2
    assert m.unique_rate(sequences, valid) == pytest.approx(2 / 3)
    assert m.unique_count([(1, 2), [1, 2], (2, 1)], [True] * 3) == 2


def test_zero_denominators_are_zero() -> None:
    none: list[bool] = []
    assert m.accuracy(none) == 0.0
    assert m.mean_score([], none) == 0.0
    assert m.mean_score([1.0], [False]) == 0.0
    assert m.mean_length([3], [False]) == 0.0
    assert m.length_percentile([3], [False], 90) == 0.0
    assert m.length_fraction([3], [False], 0, None) == 0.0
    assert m.mean_log_pterm([]) == 0.0
    assert m.unique_rate(["a"], [False]) == 0.0
    assert m.ragged_token_entropy([]) == 0.0
    assert m.ragged_token_entropy(["abc"]) == 0.0
    assert m.coverage([], ["3*8"], 0) == m.Coverage(0, 0, 0.0, 0.0)
    assert m.coverage([], [], 5) == m.Coverage(0, 0, 0.0, 0.0)
    assert m.marginal_divergences([], ["ab"]) == m.MarginalDivergences(0.0, 0.0, 0.0)
    assert m.fp_div(["x"], np.ones((1, 1))) == 0.0
    diagnostics = m.prefix_diagnostics([], max_depth=2)
    assert diagnostics.surv.tolist() == [0.0, 0.0]
    assert diagnostics.top1.tolist() == [0.0, 0.0]


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="same length"):
        m.mean_score([1.0, 2.0], [True])
    with pytest.raises(ValueError, match="q must be"):
        m.length_percentile([1], [True], 101)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        m.mean_length([-1], [True])
    with pytest.raises(ValueError, match="high"):
        m.length_count([1], [True], 3, 2)
    with pytest.raises(ValueError, match="n_samples"):
        m.coverage(["a", "b"], ["a"], 1)
    with pytest.raises(ValueError, match="similarity"):
        m.fp_div(["a", "b"], np.ones((3, 3)))


# ----------------------------------------------------------------------------- entropy


def test_ragged_entropy_hand_computed() -> None:
    # position 0: a, a, b, a -> (3/4, 1/4); position 1: b, c, b -> (2/3, 1/3);
    # position 2: only "abc" survives -> skipped.
    value = m.ragged_token_entropy(["ab", "ac", "b", "abc"])
    assert value == pytest.approx((H_3_1 + H_2_1) / 2, abs=1e-9)


def test_entropy_by_length_hand_computed() -> None:
    buckets = m.entropy_by_length(["ab", "ac", "b", "", ""])
    assert buckets == pytest.approx({0: 0.0, 1: 0.0, 2: math.log(2) / 2}, abs=1e-9)


def reference_ragged_entropy(sequences: list[str]) -> float:
    values = []
    for t in range(max(map(len, sequences), default=0)):
        tokens = [seq[t] for seq in sequences if len(seq) > t]
        if len(tokens) > 1:
            counts = Counter(tokens)
            probabilities = [c / len(tokens) for c in counts.values()]
            values.append(-sum(p * math.log(p + 1e-10) for p in probabilities))
    return sum(values) / len(values) if values else 0.0


@given(sequences_strategy)
def test_ragged_entropy_matches_reference(sequences: list[str]) -> None:
    assert m.ragged_token_entropy(sequences) == pytest.approx(
        reference_ragged_entropy(sequences), abs=1e-12
    )


# ----------------------------------------------------------------------------- prefixes


def test_prefix_diagnostics_hand_computed() -> None:
    diagnostics = m.prefix_diagnostics(["ab", "ac", "b", "ab"], max_depth=3)
    assert diagnostics.depth.tolist() == [1, 2, 3]
    assert diagnostics.surv == pytest.approx([1.0, 0.75, 0.0])
    assert diagnostics.pef_ent == pytest.approx([H_3_1, H_2_1, 0.0])
    assert diagnostics.eff == pytest.approx([math.exp(H_3_1), math.exp(H_2_1), 0.0])
    assert diagnostics.top1 == pytest.approx([0.75, 2 / 3, 0.0])
    assert diagnostics.unique_rate == pytest.approx([0.5, 2 / 3, 0.0])
    assert m.prefix_diagnostics(["abc", "a"]).depth.tolist() == [1, 2, 3]
    assert set(diagnostics.to_dict()) == {"depth", "surv", "pef_ent", "eff", "top1", "unique_rate"}


@given(sequences_strategy)
def test_prefix_diagnostics_properties(sequences: list[str]) -> None:
    diagnostics = m.prefix_diagnostics(sequences)
    assert np.all(np.diff(diagnostics.surv) <= 0)
    for k, surv, top1, uniq in zip(
        diagnostics.depth, diagnostics.surv, diagnostics.top1, diagnostics.unique_rate, strict=True
    ):
        survivors = [seq[:k] for seq in sequences if len(seq) >= k]
        counts = Counter(survivors)
        assert surv == pytest.approx(len(survivors) / len(sequences))
        assert top1 == pytest.approx(max(counts.values()) / len(survivors))
        assert uniq == pytest.approx(len(counts) / len(survivors))
        assert 1.0 - 1e-12 <= diagnostics.eff[k - 1] <= len(counts) + 1e-9


# ----------------------------------------------------------------------------- coverage


def test_coverage_hand_computed() -> None:
    solutions = ["3*8", "4*6", "6*4", "8*3", "2*3*4"]
    samples = ["3*8", "3*8", "4*6", "1+1"]
    cover = m.coverage(samples, solutions, n_samples=4)
    assert cover == m.Coverage(unique=3, cov_count=2, cov=2 / 5, norm_cov=2 / 4)
    assert m.coverage(samples, solutions, n_samples=100).norm_cov == pytest.approx(2 / 5)


def test_target_distinct_hand_computed() -> None:
    # 2 draws from 4 solutions: E = 4 (1 - (3/4)^2) = 7/4
    assert m.target_distinct(4, 2) == pytest.approx(7 / 4)
    assert m.target_distinct(1, 5) == pytest.approx(1.0)
    assert m.target_distinct(10, 1) == pytest.approx(1.0)
    assert m.target_distinct(0, 7) == 0.0 and m.target_distinct(7, 0) == 0.0
    # Expr24 at the evaluation's N: 75,445 (1 - (1 - 1/75,445)^6400)
    assert m.target_distinct(75_445, 6400) == pytest.approx(6136.10, abs=0.01)
    with pytest.raises(ValueError, match="must be >= 0"):
        m.target_distinct(-1, 3)


@settings(deadline=None)
@given(st.integers(min_value=1, max_value=60), st.integers(min_value=0, max_value=60))
def test_target_distinct_matches_the_exact_expectation(n_solutions: int, n_draws: int) -> None:
    # E[distinct] = sum over k of k P(k distinct), with P from the occupancy recursion in exact
    # rationals: each draw finds a new solution with probability (M - k) / M
    probs = {0: Fraction(1)}
    for _ in range(n_draws):
        step: dict[int, Fraction] = {}
        for k, p in probs.items():
            step[k] = step.get(k, Fraction(0)) + p * Fraction(k, n_solutions)
            if k < n_solutions:
                step[k + 1] = step.get(k + 1, Fraction(0)) + p * Fraction(
                    n_solutions - k, n_solutions
                )
        probs = step
    exact = sum(k * p for k, p in probs.items())
    assert m.target_distinct(n_solutions, n_draws) == pytest.approx(float(exact), rel=1e-12)


# ----------------------------------------------------------------------------- divergences


def test_kl_js_hand_computed() -> None:
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.25, 0.25, 0.5])
    assert m.stabilised_kl(p, q) == pytest.approx(math.log(2), abs=1e-7)
    assert m.stabilised_kl(p, p) == pytest.approx(0.0, abs=1e-15)
    assert m.stabilised_js(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(
        math.log(2), abs=1e-7
    )
    # Entries outside the union support contribute nothing.
    assert m.stabilised_kl(np.append(p, 0.0), np.append(q, 0.0)) == m.stabilised_kl(p, q)


def test_marginal_divergences_hand_computed() -> None:
    eps = 1e-9
    # t = 0: pi = {a: 1}, p* = {a: 1/2, c: 1/2}; t = 1: both {b: 1}.
    result = m.marginal_divergences(["ab"], ["ab", "cb"])
    kl_pi_p_0 = (1 + eps) * math.log((1 + eps) / (0.5 + eps)) + eps * math.log(eps / (0.5 + eps))
    kl_p_pi_0 = (0.5 + eps) * math.log((0.5 + eps) / (1 + eps)) + (0.5 + eps) * math.log(
        (0.5 + eps) / eps
    )
    assert result.kl_pi_p == pytest.approx(kl_pi_p_0 / 2, rel=1e-9)
    assert result.kl_p_pi == pytest.approx(kl_p_pi_0 / 2, rel=1e-9)
    js_0 = 0.5 * m.stabilised_kl(np.array([1.0, 0.0]), np.array([0.75, 0.25])) + 0.5 * (
        m.stabilised_kl(np.array([0.5, 0.5]), np.array([0.75, 0.25]))
    )
    assert result.js_tok == pytest.approx(js_0 / 2, rel=1e-9)


def reference_divergences(sampled: list[str], oracle: list[str]) -> tuple[float, float, float]:
    eps = 1e-9

    def marginal(sequences: list[str], t: int) -> dict[str, float]:
        tokens = [seq[t] for seq in sequences if len(seq) > t]
        return {v: c / len(tokens) for v, c in Counter(tokens).items()}

    def kl(p: dict[str, float], q: dict[str, float]) -> float:
        support = set(p) | set(q)
        return sum(
            (p.get(v, 0) + eps) * math.log((p.get(v, 0) + eps) / (q.get(v, 0) + eps))
            for v in support
        )

    t_max = max(len(seq) for seq in sampled + oracle)
    totals = [0.0, 0.0, 0.0]
    for t in range(t_max):
        pi, p_star = marginal(sampled, t), marginal(oracle, t)
        mid = {v: (pi.get(v, 0) + p_star.get(v, 0)) / 2 for v in set(pi) | set(p_star)}
        totals[0] += kl(pi, p_star)
        totals[1] += kl(p_star, pi)
        totals[2] += 0.5 * kl(pi, mid) + 0.5 * kl(p_star, mid)
    return totals[0] / t_max, totals[1] / t_max, totals[2] / t_max


nonempty = st.lists(st.text(alphabet="abcd", min_size=1, max_size=5), min_size=1, max_size=10)


@given(nonempty, nonempty)
def test_marginal_divergences_match_reference(sampled: list[str], oracle: list[str]) -> None:
    result = m.marginal_divergences(sampled, oracle)
    expected = reference_divergences(sampled, oracle)
    assert (result.kl_pi_p, result.kl_p_pi, result.js_tok) == pytest.approx(
        expected, rel=1e-9, abs=1e-12
    )


distributions = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8).filter(
    lambda values: sum(values) > 1e-3
)


@given(st.data())
def test_kl_nonnegative_and_js_bounded(data: st.DataObject) -> None:
    raw_p = np.array(data.draw(distributions))
    raw_q = np.array(
        data.draw(
            st.lists(st.floats(0.0, 1.0), min_size=raw_p.size, max_size=raw_p.size).filter(
                lambda v: sum(v) > 1e-3
            )
        )
    )
    p, q = raw_p / raw_p.sum(), raw_q / raw_q.sum()
    assert m.stabilised_kl(p, q) >= -1e-12
    assert m.stabilised_kl(q, p) >= -1e-12
    js = m.stabilised_js(p, q)
    assert -1e-12 <= js <= math.log(2) + 1e-12
    assert js == pytest.approx(m.stabilised_js(q, p), abs=1e-12)


@given(sequences_strategy)
def test_token_marginal_rows_are_distributions(sequences: list[str]) -> None:
    vocabulary: dict[object, int] = {}
    marginals = m.token_marginals(sequences, vocabulary, t_max=6)
    assert marginals.shape == (6, len(vocabulary))
    for t, row in enumerate(marginals):
        survivors = sum(len(seq) > t for seq in sequences)
        assert row.sum() == pytest.approx(1.0 if survivors else 0.0)


# ----------------------------------------------------------------------------- similarity


def test_fp_div_hand_computed() -> None:
    similarity = np.array([[1.0, 0.2, 0.4], [0.2, 1.0, 0.6], [0.4, 0.6, 1.0]])
    assert m.fp_div(["x", "y", "z"], similarity) == pytest.approx(0.6)

    def jaccard(a: list[str], b: list[str]) -> np.ndarray:
        return np.array([[len(set(x) & set(y)) / len(set(x) | set(y)) for y in b] for x in a])

    # pairs: (ab, bc) 1/3, (ab, cd) 0, (bc, cd) 1/3
    assert m.fp_div(["ab", "bc", "cd"], jaccard) == pytest.approx(1 - 2 / 9)


def test_macro_fp_div_hand_computed() -> None:
    items = ["a", "b", "c", "d", "e"]
    lengths = [1, 2, 7, 8, 12]
    similarity = np.full((5, 5), 0.5)
    similarity[0, 1] = similarity[1, 0] = 0.1
    similarity[2, 3] = similarity[3, 2] = 0.7
    # bins 0-5: {a, b} -> 0.9; 6-10: {c, d} -> 0.3; 11+: {e} -> 0 (fewer than 2)
    assert m.macro_fp_div(items, lengths, similarity) == pytest.approx((0.9 + 0.3 + 0.0) / 3)
    assert m.macro_fp_div(items, lengths, similarity, bins=[(0, None)]) == pytest.approx(
        m.fp_div(items, similarity)
    )


# ----------------------------------------------------------------------------- seeds


@pytest.mark.parametrize(
    ("df", "quantile"),
    [
        (1, 12.706204736174707),
        (2, 4.302652729749464),
        (4, 2.7764451051977934),
        (9, 2.2621571627982053),
        (29, 2.045229642132703),
    ],
)
def test_t_quantile_table_values(df: int, quantile: float) -> None:
    assert m.student_t_quantile(0.975, df) == pytest.approx(quantile, rel=1e-9)
    assert m.student_t_quantile(0.025, df) == pytest.approx(-quantile, rel=1e-9)


def test_mean_ci_hand_computed() -> None:
    interval = m.mean_ci([1.0, 2.0, 3.0])
    assert interval.mean == 2.0
    assert interval.half_width == pytest.approx(4.302652729749464 / math.sqrt(3), rel=1e-9)
    assert interval.low == pytest.approx(2.0 - interval.half_width)
    assert math.isnan(m.mean_ci([5.0]).half_width)
    with pytest.raises(ValueError, match="values"):
        m.mean_ci([])
    with pytest.raises(ValueError, match="confidence"):
        m.mean_ci([1.0, 2.0], confidence=1.5)


def test_t_quantile_rejects_arguments_outside_its_domain() -> None:
    with pytest.raises(ValueError, match="probability"):
        m.student_t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="df"):
        m.student_t_quantile(0.9, 0)


# ----------------------------------------------------------------------------- reports


def test_sequence_metrics_count_valid_and_correct_apart() -> None:
    rows = [
        {"tokens": "ab", "valid": True, "correct": True, "score": 2.0, "log_pterm_stop": -1.0},
        {"tokens": "ab", "valid": True, "correct": True, "score": 4.0, "log_pterm_stop": -1.0},
        {"tokens": "abc", "valid": True, "correct": False, "score": 9.0, "log_pterm_stop": -3.0},
        {"tokens": "a", "valid": False, "correct": False, "score": 0.0, "log_pterm_stop": -2.0},
    ]
    result = m.sequence_metrics(rows, max_depth=2)
    assert (result["n_samples"], result["n_valid"], result["n_correct"]) == (4, 3, 2)
    assert result["acc"] == 0.5 and result["score"] == 3.0
    assert (result["unique"], result["uniq_rate"]) == (1, 0.5)
    assert result["len_mean"] == 2.0 and result["log_pterm"] == pytest.approx(-7 / 4)
    assert result["prefix"]["surv"] == [1.0, 1.0]
