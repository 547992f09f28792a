"""Coverage of an enumerated solution set Y* (Expr24) by the correct samples.

Unique = distinct correct sequences, CovCount = |Unique ∩ Y*|, Cov = CovCount / |Y*|,
NormCov = CovCount / min(N, |Y*|) with N the number of draws (so a run that drew fewer samples
than |Y*| can still reach 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
