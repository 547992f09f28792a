"""Coverage of an enumerated solution set Y* (Expr24) by the correct samples.

Unique = distinct correct sequences, CovCount = |Unique ∩ Y*|, Cov = CovCount / |Y*|,
NormCov = CovCount / min(N, |Y*|) with N the number of draws (so a run that drew fewer samples
than |Y*| can still reach 1).

For context, :func:`target_distinct` is what the target would give at the same N: the expected
number of distinct solutions in N independent draws from p*, uniform over Y* (the p* of the KL
columns; Expr24's target with kappa = 0), |Y*| (1 - (1 - 1/|Y*|)^N).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raptb.core.metrics._arrays import TokenSequence, safe_div


@dataclass(frozen=True)
class Coverage:
    """Coverage of the enumerated solution set Y* by the correct samples."""

    unique: int
    cov_count: int
    cov: float
    norm_cov: float


def coverage(
    correct_sequences: Sequence[TokenSequence],
    solutions: Sequence[TokenSequence],
    n_samples: int,
) -> Coverage:
    """Unique, CovCount, Cov = CovCount/|Y*|, NormCov = CovCount/min(N, |Y*|).

    ``n_samples`` is N, the number of draws including the ones that are not correct.
    """
    if n_samples < len(correct_sequences):
        raise ValueError(
            f"n_samples ({n_samples}) must be >= the number of correct sequences "
            f"({len(correct_sequences)})"
        )
    distinct = {tuple(seq) for seq in correct_sequences}
    oracle = {tuple(seq) for seq in solutions}
    cov_count = len(distinct & oracle)
    return Coverage(
        unique=len(distinct),
        cov_count=cov_count,
        cov=safe_div(cov_count, len(oracle)),
        norm_cov=safe_div(cov_count, min(n_samples, len(oracle))),
    )


def target_distinct(n_solutions: int, n_draws: int) -> float:
    """Expected distinct solutions in ``n_draws`` draws from the uniform distribution over
    ``n_solutions``: |Y*| (1 - (1 - 1/|Y*|)^N), as -expm1(N log1p(-1/|Y*|)) so that large |Y*|
    loses no digits. 0 when there are no solutions or no draws.
    """
    if n_solutions < 0 or n_draws < 0:
        raise ValueError(f"n_solutions ({n_solutions}) and n_draws ({n_draws}) must be >= 0")
    if n_solutions == 0 or n_draws == 0:
        return 0.0
    if n_solutions == 1:
        return 1.0  # log1p(-1) = -inf
    return float(-n_solutions * np.expm1(n_draws * np.log1p(-1.0 / n_solutions)))
