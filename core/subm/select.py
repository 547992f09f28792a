"""SubM: greedy maximisation of the paper's submodular replay objective (the API).

Ground set G of n items, similarity sim(v, x) in [0, 1] (symmetric), static score s(x), length
bin b(x) >= 0 with weights alpha_b >= 0. For S subset of the gated pool P (see below):

    f(S) = sum_{x in S} s(x) + w_div sum_{v in P} msim(v, S) + w_len sum_b alpha_b log(1 + c_b(S))

    msim(v, S) = max_{x in S} sim(v, x),  msim(v, {}) = 0,  c_b(S) = |{x in S : b(x) = b}|

and the marginal gain the greedy loops evaluate is

    Delta(x | S) = s(x) + w_div sum_{v in P} max(0, sim(v, x) - msim(v, S))
                   + w_len alpha_{b(x)} log((2 + c_{b(x)}) / (1 + c_{b(x)})).

With s >= 0 and non-negative weights f is monotone submodular, so greedy is within (1 - 1/e) of
the optimum (Nemhauser, Wolsey, Fisher 1978). Selection stops at ``budget`` items or as soon as no
candidate has a positive gain (negative static scores therefore exclude items).

Validity gating (ratio rho in [0, 1], paper "Validity gating for diversity"): the pool P keeps
every valid item and the invalid items with the highest static score (ties: lower index) up to
the largest count that keeps valid / |P| >= rho. P is both the candidate set and the ground set
of the facility term (as in the paper's code; with rho = 1 invalid items are never selected).
rho = 0 keeps everything.

Methods: ``standard`` (argmax over all candidates every step), ``lazy`` (Minoux 1978: a max-heap of
stale gains; by submodularity a stale gain bounds the current one, and because IEEE rounding is
monotone the bound also holds in floating point, so lazy returns the same selection as standard
with ties broken identically, lowest index first) and ``stochastic`` (Mirzasoleiman et al. 2015:
each step scans a random sample of ceil(n / budget * log(1 / epsilon)) remaining candidates).
``diversity="dispersion"`` swaps the facility term for the released reference code's rule,
w_div (1 - max_{s in S} sim(x, s)), for comparison runs (see ``subm_select``).

The greedy loops are Numba kernels (``core.subm.kernels``); they all work on the 2**-15
fixed-point similarity of ``core.subm.fixed_point`` (``QuantisedSimilarity``), so two items whose
float gains differ by less than about |P| * 2**-16 may be ordered differently than on the
float input.
"""

from __future__ import annotations

import math

import numpy as np

from raptb.core.subm.fixed_point import SCALE, QuantisedSimilarity, quantise_similarity
from raptb.core.subm.kernels import greedy_lazy, greedy_standard, greedy_stochastic

__all__ = [
    "DIVERSITY",
    "LAZY_BATCH_MIN_N",
    "METHODS",
    "SCALE",
    "QuantisedSimilarity",
    "power_bin_alpha",
    "quantise_similarity",
    "subm_select",
    "subm_value",
    "validity_pool",
]

METHODS = ("standard", "lazy", "stochastic")
DIVERSITY = ("facility", "dispersion")
#: Smallest pool for which lazy re-evaluates four stale heap tops per pass (rows of >= 4 KiB come
#: from DRAM and four concurrent row streams hide latency; smaller matrices sit in cache, where
#: the extra re-evaluations only cost). Read at call time, so tests can lower it.
LAZY_BATCH_MIN_N = 2048


def validity_pool(valid: np.ndarray, static: np.ndarray, ratio: float) -> np.ndarray:
    """Indices (ascending) of the gated pool: all valid items plus the best invalid ones.

    Invalid items are ranked by static score (ties: lower index) and admitted while
    n_valid / |pool| >= ratio still holds. ``ratio`` 0 keeps every item, 1 keeps valid items only.
    """
    valid = np.asarray(valid, dtype=bool)
    static = np.asarray(static, dtype=np.float64)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"gating_ratio must be in [0, 1], got {ratio}")
    n_valid = int(valid.sum())
    invalid = np.flatnonzero(~valid)
    if ratio == 0.0:
        n_inv = invalid.size
    else:
        bound = n_valid * (1.0 - ratio) / ratio
        n_inv = invalid.size if bound >= invalid.size else math.floor(bound)
        # Guard the float floor: admit exactly the largest count satisfying the ratio.
        while n_inv > 0 and n_valid < ratio * (n_valid + n_inv):
            n_inv -= 1
        while n_inv < invalid.size and n_valid >= ratio * (n_valid + n_inv + 1):
            n_inv += 1
    order = invalid[np.lexsort((invalid, -static[invalid]))]
    return np.sort(np.concatenate([np.flatnonzero(valid), order[:n_inv]]))


def _check_vector(name: str, arr: np.ndarray, n: int) -> None:
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must have shape [{n}] (one per ground-set item), got {arr.shape}")


def _prepare(
    similarity: np.ndarray | QuantisedSimilarity,
    static: np.ndarray,
    length_bin: np.ndarray,
    w_div: float,
    w_len: float,
    bin_alpha: np.ndarray | None,
    valid: np.ndarray | None,
    gating_ratio: float,
    check_symmetry: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Validate inputs; return (pool, quantised sim on pool, static, bins on pool, alpha, row
    sums of the quantised sim on pool, or an empty array when the pool is a strict subset)."""
    if not isinstance(similarity, QuantisedSimilarity):
        similarity = QuantisedSimilarity.from_float(similarity, check_symmetry=check_symmetry)
    q, rowsum = similarity.values, similarity.row_sums
    n = q.shape[0]
    static_arr = np.asarray(static, dtype=np.float64)
    _check_vector("static", static_arr, n)
    if not np.all(np.isfinite(static_arr)):
        raise ValueError("static contains NaN or infinite values")
    bins = np.asarray(length_bin)
    _check_vector("length_bin", bins, n)
    if n and not np.issubdtype(bins.dtype, np.integer):
        raise ValueError(f"length_bin must be an integer array, got dtype {bins.dtype}")
    bins = bins.astype(np.int64)
    if n and bins.min() < 0:
        raise ValueError("length_bin must be non-negative")
    n_bins = int(bins.max()) + 1 if n else 1
    for name, w in (("w_div", w_div), ("w_len", w_len)):
        if not (math.isfinite(w) and w >= 0.0):
            raise ValueError(f"{name} must be a finite non-negative number, got {w}")
    if bin_alpha is None:
        alpha = np.ones(n_bins, dtype=np.float64)
    else:
        alpha = np.asarray(bin_alpha, dtype=np.float64)
        if alpha.ndim != 1 or alpha.shape[0] < n_bins:
            raise ValueError(
                f"bin_alpha must be 1-D with at least {n_bins} bins, got {alpha.shape}"
            )
        if not np.all(np.isfinite(alpha)) or np.any(alpha < 0):
            raise ValueError("bin_alpha must be finite and non-negative")
    if not 0.0 <= gating_ratio <= 1.0:
        raise ValueError(f"gating_ratio must be in [0, 1], got {gating_ratio}")
    if valid is None:
        pool = np.arange(n)
    else:
        valid_arr = np.asarray(valid)
        _check_vector("valid", valid_arr, n)
        if valid_arr.dtype != np.bool_:
            raise ValueError(f"valid must be a bool array, got dtype {valid_arr.dtype}")
        pool = validity_pool(valid_arr, static_arr, gating_ratio)
    if pool.size != n:
        q = q[np.ix_(pool, pool)]
        rowsum = np.empty(0, dtype=np.int64)
    return pool, q, static_arr[pool], bins[pool], alpha, rowsum


def subm_select(
    similarity: np.ndarray | QuantisedSimilarity,
    static: np.ndarray,
    length_bin: np.ndarray,
    budget: int,
    *,
    w_div: float = 1.0,
    w_len: float = 1.0,
    bin_alpha: np.ndarray | None = None,
    valid: np.ndarray | None = None,
    gating_ratio: float = 0.0,
    method: str = "lazy",
    epsilon: float = 0.1,
    rng: np.random.Generator | None = None,
    check_symmetry: bool = True,
    diversity: str = "facility",
) -> np.ndarray:
    """Greedy SubM selection; returns int64 indices into the ground set, in selection order.

    Args:
        similarity: [n, n] symmetric float similarity in [0, 1] (rounded to the 2**-15 grid
            here), or a ``QuantisedSimilarity`` already on it (no rounding, no checks).
        static: [n] static score s(x) = w_rew r(x) + w_val 1[valid(x)] (caller's weights).
        length_bin: [n] non-negative integer length bin of each item.
        budget: maximum number of items to select (>= 0).
        w_div, w_len: weights of the facility and length-coverage terms (>= 0).
        bin_alpha: [n_bins] non-negative bin weights alpha_b; ``None`` is uniform 1.
        valid: [n] bool validity, needed for gating; ``None`` treats all as valid.
        gating_ratio: rho in [0, 1] (see module docstring).
        method: ``standard``, ``lazy`` (default, same result as standard) or ``stochastic``.
        epsilon: stochastic greedy accuracy in (0, 1); sample size ceil(n / budget log(1/eps)).
        rng: generator seeding the stochastic method (required for it, ignored otherwise).
        check_symmetry: for a float ``similarity``, verify |S - S^T| <= one grid step
            (2**-15) over all pairs. The check reads the matrix column-wise and costs more
            than the lazy selection at |G| = 4096 (~18 vs ~12 ms); callers whose matrix is
            symmetric by construction may turn it off (or pass ``SimilarityCache.quantised``'s
            matrix, which needs neither the check nor the rounding). Range and NaN checks
            always run.
        diversity: ``facility`` (default: the paper's facility-location term above) or
            ``dispersion``, the released reference code's rule, offered for comparison: the
            diversity gain of x is w_div (1 - max_{s in S} sim(x, s)) (w_div for S empty). It
            is not the marginal gain of a set function, so no approximation guarantee holds,
            but gains still only shrink as S grows and ``lazy`` still equals ``standard``.
    """
    if diversity not in DIVERSITY:
        raise ValueError(f"diversity must be one of {DIVERSITY}, got {diversity!r}")
    dispersion = diversity == "dispersion"
    if isinstance(budget, bool) or not isinstance(budget, int | np.integer) or budget < 0:
        raise ValueError(f"budget must be a non-negative integer, got {budget!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    pool, sim, static_p, bins_p, alpha, rowsum = _prepare(
        similarity, static, length_bin, w_div, w_len, bin_alpha, valid, gating_ratio, check_symmetry
    )
    budget = int(budget)
    if budget == 0 or pool.size == 0:
        return np.empty(0, dtype=np.int64)
    if method == "standard":
        picked = greedy_standard(sim, static_p, bins_p, alpha, budget, w_div, w_len, dispersion)
    elif method == "lazy":
        batched = pool.size >= LAZY_BATCH_MIN_N
        picked = greedy_lazy(
            sim, static_p, bins_p, alpha, budget, w_div, w_len, rowsum, batched, dispersion
        )
    else:
        if not 0.0 < epsilon < 1.0:
            raise ValueError(f"epsilon must be in (0, 1), got {epsilon}")
        if rng is None:
            raise ValueError("rng is required for method='stochastic'")
        m = pool.size
        sample_size = max(1, math.ceil(m / min(budget, m) * math.log(1.0 / epsilon)))
        picked = greedy_stochastic(
            sim, static_p, bins_p, alpha, budget, w_div, w_len, sample_size, rng, dispersion
        )
    return pool[picked]


def subm_value(
    selected: np.ndarray,
    similarity: np.ndarray | QuantisedSimilarity,
    static: np.ndarray,
    length_bin: np.ndarray,
    *,
    w_div: float = 1.0,
    w_len: float = 1.0,
    bin_alpha: np.ndarray | None = None,
    valid: np.ndarray | None = None,
    gating_ratio: float = 0.0,
) -> float:
    """f(S) in float64 for ``selected`` (distinct indices into the ground set, all in the pool),
    on the same 2**-15 quantised similarity as ``subm_select``."""
    pool, sim, static_p, bins_p, alpha, _ = _prepare(
        similarity, static, length_bin, w_div, w_len, bin_alpha, valid, gating_ratio
    )
    sel = np.asarray(selected, dtype=np.int64).reshape(-1)
    if np.unique(sel).size != sel.size:
        raise ValueError("selected must hold distinct indices")
    pos = np.searchsorted(pool, sel)
    if sel.size and (
        np.any(pos >= pool.size) or np.any(pool[np.minimum(pos, pool.size - 1)] != sel)
    ):
        raise ValueError("selected contains indices outside the gated pool")
    if sel.size == 0:
        return 0.0
    facility = int(sim[pos].max(axis=0).sum(dtype=np.int64)) / SCALE
    counts = np.bincount(bins_p[pos], minlength=alpha.shape[0])
    length = float(np.sum(alpha[: counts.size] * np.log1p(counts)))
    return float(static_p[pos].sum()) + w_div * facility + w_len * length


def power_bin_alpha(n_bins: int, power: float = 1.0) -> np.ndarray:
    """Bin weights alpha_b = ((b + 1) / n_bins) ** power, b = 0..n_bins-1 (favours long bins)."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    return ((np.arange(n_bins) + 1.0) / n_bins) ** power
