"""Per-sample sequence metrics: Acc, Score, lengths, log p_term, uniqueness and token entropy.

Shapes: per-sample arrays are [N]; ``correct`` flags which samples count as a success (see the
package docstring). Every metric except Acc and log p_term is computed on the correct samples.

- Acc = n_correct / N; Score = mean s over correct samples.
- Len = mean l, Len_q = q-th percentile of l (numpy's linear interpolation) over correct
  samples; Frac[a-b] = Count[a-b] / n_correct with Count[a-b] = #{correct: a <= l <= b}
  (b = None: open).
- log p_term = mean of ``log_pterm_stop`` over all N samples, and per length.
- UniqStr = number of distinct correct sequences; UniqRate = UniqStr / n_correct.
- Entropy (ragged): for 0-based position t with n_t = #{correct: l > t} > 1, the natural-log
  entropy H_t = -sum_v p_t(v) log(p_t(v) + 1e-10) of the tokens at t; mean of H_t over those t.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from raptb.core.metrics._arrays import (
    TokenSequence,
    as_flags,
    as_floats,
    check_same_length,
    encode,
    safe_div,
)

ENTROPY_EPS = 1e-10


def accuracy(correct: Iterable[bool] | np.ndarray) -> float:
    """Acc = n_correct / N (0 for N = 0)."""
    flags = as_flags(correct)
    return safe_div(flags.sum(), flags.size)


def mean_score(scores: Iterable[float] | np.ndarray, correct: Iterable[bool] | np.ndarray) -> float:
    """Score = mean task score over correct samples."""
    values, flags = as_floats(scores, "scores"), as_flags(correct)
    check_same_length(scores=values, correct=flags)
    return safe_div(values[flags].sum(), flags.sum())


def _correct_lengths(
    lengths: Iterable[int] | np.ndarray, correct: Iterable[bool] | np.ndarray
) -> np.ndarray:
    values, flags = np.asarray(lengths, dtype=np.int64), as_flags(correct)
    if values.ndim != 1:
        raise ValueError(f"lengths must be one-dimensional, got shape {values.shape}")
    check_same_length(lengths=values, correct=flags)
    if (values < 0).any():
        raise ValueError("lengths must be >= 0")
    return values[flags]


def mean_length(lengths: Iterable[int] | np.ndarray, correct: Iterable[bool] | np.ndarray) -> float:
    """Len = mean pre-stop length over correct samples."""
    kept = _correct_lengths(lengths, correct)
    return safe_div(kept.sum(), kept.size)


def length_percentile(
    lengths: Iterable[int] | np.ndarray, correct: Iterable[bool] | np.ndarray, q: float
) -> float:
    """Len_q = q-th percentile (0..100, linear interpolation) of correct lengths; 0 if none."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    kept = _correct_lengths(lengths, correct)
    return float(np.percentile(kept, q)) if kept.size else 0.0


def length_count(
    lengths: Iterable[int] | np.ndarray,
    correct: Iterable[bool] | np.ndarray,
    low: int,
    high: int | None,
) -> int:
    """Count[low-high] = number of correct samples with low <= length <= high (None: open)."""
    if high is not None and high < low:
        raise ValueError(f"high must be >= low ({low}), got {high}")
    kept = _correct_lengths(lengths, correct)
    inside = kept >= low if high is None else (kept >= low) & (kept <= high)
    return int(inside.sum())


def length_fraction(
    lengths: Iterable[int] | np.ndarray,
    correct: Iterable[bool] | np.ndarray,
    low: int,
    high: int | None,
) -> float:
    """Frac[low-high] = Count[low-high] / n_correct."""
    count = length_count(lengths, correct, low, high)
    return safe_div(count, as_flags(correct).sum())


def mean_log_pterm(log_pterm_stop: Iterable[float] | np.ndarray) -> float:
    """log p_term(tau) = mean over all samples of the raw log-prob of the sampled stop."""
    values = as_floats(log_pterm_stop, "log_pterm_stop")
    return safe_div(values.sum(), values.size)


def log_pterm_by_length(
    log_pterm_stop: Iterable[float] | np.ndarray, lengths: Iterable[int] | np.ndarray
) -> dict[int, float]:
    """Mean raw stop log-prob of all samples grouped by their length, keys in increasing order."""
    values = as_floats(log_pterm_stop, "log_pterm_stop")
    sizes = np.asarray(lengths, dtype=np.int64)
    check_same_length(log_pterm_stop=values, lengths=sizes)
    return {int(n): float(values[sizes == n].mean()) for n in np.unique(sizes)}


def unique_count(sequences: Sequence[TokenSequence], correct: Iterable[bool] | np.ndarray) -> int:
    """UniqStr = number of distinct correct sequences (token tuples)."""
    flags = as_flags(correct)
    if len(sequences) != flags.size:
        raise ValueError(
            f"sequences and correct differ in length: {len(sequences)} vs {flags.size}"
        )
    return len({tuple(seq) for seq, ok in zip(sequences, flags, strict=True) if ok})


def unique_rate(sequences: Sequence[TokenSequence], correct: Iterable[bool] | np.ndarray) -> float:
    """UniqRate = UniqStr / n_correct."""
    return safe_div(unique_count(sequences, correct), as_flags(correct).sum())


def _entropy(counts: np.ndarray, eps: float) -> float:
    """-sum p log(p + eps) of the distribution proportional to the non-negative ``counts``."""
    probabilities = counts[counts > 0] / counts.sum()
    return float(-(probabilities * np.log(probabilities + eps)).sum())


def ragged_token_entropy(sequences: Sequence[TokenSequence]) -> float:
    """Entropy: mean over positions with >= 2 survivors of the token entropy at that position.

    ``sequences`` are the correct samples; returns 0 when no position has two survivors.
    """
    vocabulary: dict[Hashable, int] = {}
    codes, _ = encode(sequences, vocabulary)
    entropies = []
    for column in codes.T:
        present = column[column >= 0]
        if present.size > 1:
            entropies.append(_entropy(np.bincount(present).astype(np.float64), ENTROPY_EPS))
    return float(np.mean(entropies)) if entropies else 0.0


def entropy_by_length(sequences: Sequence[TokenSequence]) -> dict[int, float]:
    """Entropy(l): ragged entropy of each fixed-length bucket; 0 for <= 1 sample or l = 0."""
    buckets: dict[int, list[TokenSequence]] = {}
    for seq in sequences:
        buckets.setdefault(len(seq), []).append(seq)
    return {
        length: ragged_token_entropy(bucket) if length > 0 and len(bucket) > 1 else 0.0
        for length, bucket in sorted(buckets.items())
    }
