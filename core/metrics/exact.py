"""Exact metrics of a sampler over an enumerated solution set Y*, from exact log-probabilities.

Given log pi(x) for every x in Y* (the behaviour probability, stop included, e.g. from
``raptb.adapters.lm.exact``) these are the closed forms of what the sampled evaluation estimates:

    Acc         = pi(Y*) = sum_{x in Y*} pi(x)
    mass(n)     = sum_{x in Y*, |x| = n} pi(x)                      (|x|: tokens before the stop)
    KL          = KL(p* || pi|Y*) = sum_x p*(x) [log p*(x) - log pi(x) + log pi(Y*)]
    E_N         = E[#distinct x in Y* among N i.i.d. draws] = sum_x 1 - (1 - pi(x))^N
    pass@k      = 1 - (1 - pi(Y*))^k    (what the sampled pass@k estimates, for one prompt)

with p*(x) proportional to exp(log_target(x)) (uniform over Y* for a 0/1 reward).

Distances to the target, in two readings. The plain ones compare p* with pi|Y*(x) = pi(x) /
pi(Y*), the policy restricted to Y* and renormalised (the KL above): they measure the shape of
the correct mass, Acc measures how much of it there is. The ``_all`` ones compare p* with pi
over all texts, where the mass off Y*, 1 - pi(Y*), is mass p* does not have (the sampler always
stops, at max_length at the latest, so pi sums to 1 over the texts it emits):

    TV          = 1/2 sum_{x in Y*} |pi|Y*(x) - p*(x)|
    TV_all      = 1/2 [sum_{x in Y*} |pi(x) - p*(x)| + (1 - pi(Y*))]
    KL_rev      = KL(pi|Y* || p*) = sum_x pi|Y*(x) [log pi|Y*(x) - log p*(x)]
    KL_all      = KL(p* || pi) = KL - log pi(Y*)

(KL(pi || p*) over all texts is +inf whenever pi(Y*) < 1, so it is not reported.) Of the
correct mass alone:

    Uniformity  = H(pi|Y*) / log |Y*|   (1: uniform over Y*; 1 when |Y*| = 1)
    Modes_q     = the fewest solutions whose pi|Y* adds up to at least q (q = 50%, 90%)

the active modes, taken greedily from the most probable (a tolerance of 1e-12 on the cumulative
sum absorbs rounding). E_N is computed
as sum_x -expm1(N log1p(-pi(x))) with log1p(-pi) taken from log pi without forming 1 - pi, so
that tiny and near-1 probabilities both keep full precision. The indicators "x was drawn" of a
multinomial sample are negatively associated, so Var(#distinct) <= sum_x q_x (1 - q_x) with
q_x = 1 - (1 - pi(x))^N, a conservative spread for comparing a sampled count with E_N.

Sampled estimates are compared with central binomial intervals: under Binomial(N, p), the
interval [lo, hi] / N with lo the smallest k whose CDF reaches (1 - c) / 2 and hi the smallest
k whose CDF reaches (1 + c) / 2 (to within 1e-12), from the pmf accumulated in log space.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from raptb.core.metrics.pass_at_k import DEFAULT_PASS_K

DEFAULT_CONFIDENCE = 0.95
DISTINCT_CURVE = (64, 128, 256, 512, 1024, 2048, 4096, 6400)
"""The N of the E_N curve (``distinct_curve``): doubling from 64, and the evaluation's 6,400."""
MODE_SHARES = (0.5, 0.9)
"""The shares q of the correct mass whose active modes are counted."""
_LEVEL_TOLERANCE = 1e-12
"""A cumulative sum (of pi|Y*, of a binomial pmf) within this below a level reaches it."""


def _log_probs(log_pi: Sequence[float] | np.ndarray) -> np.ndarray:
    values = np.asarray(log_pi, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"log_pi: expected shape [M], got {values.shape}")
    if np.any(np.isnan(values)) or np.any(values > 0):
        raise ValueError("log_pi: every value must be a log-probability (<= 0, not NaN)")
    return values


def _log_sum(values: np.ndarray) -> float:
    """log sum exp of a 1-D array (-inf when empty or all -inf)."""
    top = values.max(initial=-np.inf)
    if top == -np.inf:
        return -np.inf
    return float(top + np.log(np.exp(values - top).sum()))


def log1m_exp(log_p: np.ndarray) -> np.ndarray:
    """log(1 - exp(log_p)) elementwise for log_p <= 0 (Maechler's split at log 1/2)."""
    log_p = np.asarray(log_p, dtype=np.float64)
    out = np.empty_like(log_p)
    near_one = log_p > -np.log(2.0)
    with np.errstate(divide="ignore"):  # log_p = 0 gives log 0 = -inf, which is exact
        out[near_one] = np.log(-np.expm1(log_p[near_one]))
    out[~near_one] = np.log1p(-np.exp(log_p[~near_one]))
    return out


def solution_mass(log_pi: Sequence[float] | np.ndarray) -> float:
    """pi(Y*): total probability of the solutions (exact accuracy)."""
    return float(np.exp(_log_sum(_log_probs(log_pi))))


def mass_by_length(
    log_pi: Sequence[float] | np.ndarray, lengths: Sequence[int] | np.ndarray
) -> dict[int, float]:
    """{n: pi(Y*_n)} over the lengths present in ``lengths`` [M] (tokens before the stop)."""
    values = _log_probs(log_pi)
    sizes = np.asarray(lengths, dtype=np.int64)
    if sizes.shape != values.shape:
        raise ValueError(f"lengths: expected shape {values.shape}, got {sizes.shape}")
    return {int(n): float(np.exp(_log_sum(values[sizes == n]))) for n in np.unique(sizes)}


def conditional_kl(
    log_target: Sequence[float] | np.ndarray, log_pi: Sequence[float] | np.ndarray
) -> float:
    """KL(p* || pi restricted to Y* and renormalised), nats.

    log_target: [M] unnormalised log-weights of p* (e.g. all 0 for uniform). inf when pi(x) = 0
    somewhere p*(x) > 0; nan when pi(Y*) = 0.
    """
    log_p, log_conditional = _conditional_pair(log_target, log_pi)
    return _kl(log_p, log_conditional)


def _kl(log_a: np.ndarray, log_b: np.ndarray) -> float:
    """sum over a > 0 of a (log a - log b), from log-probabilities [M] (nan stays nan)."""
    a = np.exp(log_a)
    support = (a > 0) | np.isnan(a)
    with np.errstate(invalid="ignore"):
        return float(np.sum(a[support] * (log_a[support] - log_b[support])))


def _conditional_pair(
    log_target: Sequence[float] | np.ndarray, log_pi: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(log p*, log pi|Y*), both [M] and normalised (pi|Y* is nan when pi(Y*) = 0)."""
    values = _log_probs(log_pi)
    weights = np.asarray(log_target, dtype=np.float64)
    if weights.shape != values.shape:
        raise ValueError(f"log_target: expected shape {values.shape}, got {weights.shape}")
    with np.errstate(invalid="ignore"):
        return weights - _log_sum(weights), values - _log_sum(values)


def total_variation(
    log_target: Sequence[float] | np.ndarray, log_pi: Sequence[float] | np.ndarray
) -> float:
    """TV(pi|Y*, p*) = 1/2 sum_x |pi|Y*(x) - p*(x)| in [0, 1]; nan when pi(Y*) = 0."""
    log_p, log_conditional = _conditional_pair(log_target, log_pi)
    return float(0.5 * np.sum(np.abs(np.exp(log_conditional) - np.exp(log_p))))


def total_variation_all(
    log_target: Sequence[float] | np.ndarray, log_pi: Sequence[float] | np.ndarray
) -> float:
    """TV(pi, p*) over all texts: 1/2 [sum_{x in Y*} |pi(x) - p*(x)| + 1 - pi(Y*)]."""
    log_p, _ = _conditional_pair(log_target, log_pi)
    values = _log_probs(log_pi)
    off = -np.expm1(_log_sum(values))
    return float(0.5 * (np.sum(np.abs(np.exp(values) - np.exp(log_p))) + off))


def reverse_conditional_kl(
    log_target: Sequence[float] | np.ndarray, log_pi: Sequence[float] | np.ndarray
) -> float:
    """KL(pi|Y* || p*), nats: inf when pi|Y* has mass where p* has none; nan when pi(Y*) = 0."""
    log_p, log_conditional = _conditional_pair(log_target, log_pi)
    return _kl(log_conditional, log_p)


def target_kl_all(
    log_target: Sequence[float] | np.ndarray, log_pi: Sequence[float] | np.ndarray
) -> float:
    """KL(p* || pi) over all texts, nats: the conditional KL minus log pi(Y*) (the mass off Y*
    counts); inf when pi(x) = 0 somewhere p*(x) > 0."""
    log_p, _ = _conditional_pair(log_target, log_pi)
    return _kl(log_p, _log_probs(log_pi))


def uniformity(log_pi: Sequence[float] | np.ndarray) -> float:
    """H(pi|Y*) / log |Y*| in [0, 1] (1 when |Y*| = 1); nan when pi(Y*) = 0."""
    values = _log_probs(log_pi)
    if values.size == 0:
        raise ValueError("log_pi: the solution set is empty")
    log_acc = _log_sum(values)
    if log_acc == -np.inf:
        return float("nan")
    if values.size == 1:
        return 1.0
    log_conditional = values - log_acc
    q = np.exp(log_conditional)
    support = q > 0
    return float(-np.sum(q[support] * log_conditional[support]) / np.log(values.size))


def active_modes(log_pi: Sequence[float] | np.ndarray, share: float) -> int:
    """The fewest solutions holding at least ``share`` of the correct mass pi(Y*), in (0, 1];
    0 when pi(Y*) = 0."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share: must be in (0, 1], got {share}")
    values = _log_probs(log_pi)
    cumulative = _cumulative_share(values)
    if cumulative is None:
        return 0
    count = int(np.searchsorted(cumulative, share - _LEVEL_TOLERANCE, side="left")) + 1
    return min(count, int(np.count_nonzero(values > -np.inf)))


def _cumulative_share(values: np.ndarray) -> np.ndarray | None:
    """Cumulative pi|Y* over the solutions from the most probable down [M]; None if pi(Y*) = 0."""
    log_acc = _log_sum(values)
    if log_acc == -np.inf:
        return None
    return np.cumsum(np.sort(np.exp(values - log_acc))[::-1])


def correct_mass_curve(log_pi: Sequence[float] | np.ndarray) -> dict[int, float]:
    """{r: share of pi(Y*) held by the r most probable solutions} at r = 1, 2, 4, ... and |Y*|
    (the curve the active modes read at 50% and 90%); empty when pi(Y*) = 0."""
    values = _log_probs(log_pi)
    cumulative = _cumulative_share(values)
    if cumulative is None:
        return {}
    ranks = sorted({*(2**i for i in range(int(np.log2(values.size)) + 1)), values.size})
    return {r: float(cumulative[r - 1]) for r in ranks}


def exact_pass_at_k(log_pi: Sequence[float] | np.ndarray, k: int) -> float:
    """1 - (1 - pi(Y*))^k: the chance that k i.i.d. draws hold a solution."""
    if k < 1:
        raise ValueError(f"k: must be >= 1, got {k}")
    return float(-np.expm1(k * log1m_exp(np.array([_log_sum(_log_probs(log_pi))]))[0]))


def expected_distinct(log_pi: Sequence[float] | np.ndarray, n: int) -> float:
    """E_N: expected number of distinct solutions among ``n`` i.i.d. draws."""
    return float(_seen_probability(_log_probs(log_pi), n).sum())


def distinct_sd_bound(log_pi: Sequence[float] | np.ndarray, n: int) -> float:
    """Upper bound sqrt(sum_x q_x (1 - q_x)) on the sd of the distinct count at ``n`` draws."""
    q = _seen_probability(_log_probs(log_pi), n)
    return float(np.sqrt(np.sum(q * (1.0 - q))))


def _seen_probability(values: np.ndarray, n: int) -> np.ndarray:
    """q_x = 1 - (1 - pi(x))^n for every x, as -expm1(n log1p(-pi(x)))."""
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    with np.errstate(invalid="ignore"):  # n = 0 times log 0 = -inf: never drawn
        exponent = n * log1m_exp(values)
    return -np.expm1(np.where(np.isnan(exponent), 0.0, exponent))


def binomial_interval(
    p: float, n: int, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float]:
    """Central interval (lo / n, hi / n) of the sampled fraction k / n under Binomial(n, p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p: must be in [0, 1], got {p}")
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence}")
    if p in (0.0, 1.0):
        return p, p
    k = np.arange(n, dtype=np.float64)
    steps = np.log(n - k) - np.log(k + 1) + np.log(p) - np.log1p(-p)
    log_pmf = np.concatenate([[n * np.log1p(-p)], n * np.log1p(-p) + np.cumsum(steps)])
    cdf = np.cumsum(np.exp(log_pmf - _log_sum(log_pmf)))
    # the CDF accumulated in log space can land a rounding error below a level it reaches
    lo = int(np.searchsorted(cdf, (1.0 - confidence) / 2.0 - _LEVEL_TOLERANCE))
    hi = int(np.searchsorted(cdf, (1.0 + confidence) / 2.0 - _LEVEL_TOLERANCE))
    return lo / n, min(hi, n) / n


def exact_metrics(
    log_pi: Sequence[float] | np.ndarray,
    path_log_pi: Sequence[float] | np.ndarray,
    path_lengths: Sequence[int] | np.ndarray,
    *,
    draws: Sequence[int],
    log_target: Sequence[float] | np.ndarray | None = None,
    curve: Sequence[int] = DISTINCT_CURVE,
    pass_k: Sequence[int] = DEFAULT_PASS_K,
) -> dict[str, Any]:
    """Every exact metric as a JSON-ready dict.

    log_pi: [M] log pi of each solution (summed over its token paths). path_log_pi, path_lengths:
    [P] log pi and tokens before the stop of each token path (P = M when every text has one
    path), for the mass per length. draws: the N values of E_N. log_target: [M] log-weights of
    p* (default uniform). curve: the N of the E_N curve. pass_k: the k of pass@k. Keys:
    n_solutions, acc, log_acc, pass_at_k ({k: 1 - (1 - acc)^k}),
    mass_by_length ({n: mass}), kl_target_pi, kl_pi_target, kl_target_pi_all, tv_target_pi,
    tv_target_pi_all, uniformity, active_modes ({"50": Modes_0.5, "90": Modes_0.9}),
    correct_mass_curve ({r: share of pi(Y*) on the r most probable solutions}),
    expected_distinct ({N: E_N}), distinct_sd_bound ({N: sd}), target_expected_distinct
    ({N: E_N of N draws from p* itself}, for context), distinct_curve and
    target_distinct_curve (the same two over ``curve``).
    """
    values = _log_probs(log_pi)
    target = np.zeros_like(values) if log_target is None else log_target
    log_acc = _log_sum(values)
    by_length = mass_by_length(path_log_pi, path_lengths)
    log_target_normalised = np.asarray(target, dtype=np.float64) - _log_sum(
        np.asarray(target, dtype=np.float64)
    )
    return {
        "n_solutions": int(values.size),
        "acc": float(np.exp(log_acc)),
        "log_acc": log_acc,
        "pass_at_k": {str(k): exact_pass_at_k(values, k) for k in pass_k},
        "mass_by_length": {str(n): v for n, v in by_length.items()},
        "kl_target_pi": conditional_kl(target, values),
        "kl_pi_target": reverse_conditional_kl(target, values),
        "kl_target_pi_all": target_kl_all(target, values),
        "tv_target_pi": total_variation(target, values),
        "tv_target_pi_all": total_variation_all(target, values),
        "uniformity": uniformity(values),
        "active_modes": {f"{round(100 * q)}": active_modes(values, q) for q in MODE_SHARES},
        "correct_mass_curve": {str(r): v for r, v in correct_mass_curve(values).items()},
        "expected_distinct": {str(n): expected_distinct(values, n) for n in draws},
        "distinct_sd_bound": {str(n): distinct_sd_bound(values, n) for n in draws},
        "target_expected_distinct": {
            str(n): expected_distinct(log_target_normalised, n) for n in draws
        },
        "distinct_curve": {str(n): expected_distinct(values, n) for n in curve},
        "target_distinct_curve": {
            str(n): expected_distinct(log_target_normalised, n) for n in curve
        },
    }


def compare_with_sampled(
    exact: Mapping[str, Any], sampled: Mapping[str, Any], confidence: float = DEFAULT_CONFIDENCE
) -> dict[str, Any]:
    """Sampled estimates (an ``expr24_metrics`` dict) against the exact values.

    ``exact`` must hold E_N for the sampled N. Returns acc (sampled, exact, interval, inside),
    distinct (sampled cov_count, E_N, the conservative sd bound, z, inside: |z| within the
    two-sided normal quantile of ``confidence``) and
    mass_by_length (per length: sampled count / N, exact, interval, inside).
    """
    n = int(sampled["n_samples"])
    key = str(n)
    if key not in exact["expected_distinct"]:
        raise ValueError(f"exact: no expected_distinct for the sampled N = {n}")

    def check(estimate: float, p: float) -> dict[str, Any]:
        lo, hi = binomial_interval(p, n, confidence)
        return {
            "sampled": estimate,
            "exact": p,
            "interval": [lo, hi],
            "inside": lo <= estimate <= hi,
        }

    expected, sd = exact["expected_distinct"][key], exact["distinct_sd_bound"][key]
    z = (sampled["cov_count"] - expected) / sd if sd > 0 else 0.0
    counts = sampled.get("count_by_length", {})
    return {
        "n_samples": n,
        "acc": check(float(sampled["acc"]), float(exact["acc"])),
        "distinct": {
            "sampled": int(sampled["cov_count"]),
            "expected": expected,
            "sd_bound": sd,
            "z": z,
            "inside": abs(z) <= NormalDist().inv_cdf((1.0 + confidence) / 2.0),
        },
        "mass_by_length": {
            length: check(counts.get(length, 0) / n, float(mass))
            for length, mass in exact["mass_by_length"].items()
        },
    }
