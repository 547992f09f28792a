"""Evaluation metrics of the paper's appendix "Metrics: Formal Definitions and Protocol".

Pure numpy and stdlib. Notation: N samples x_i with pre-stop token length l_i, a validity flag
(for Expr24, valid means *correct*, i.e. equal to 24), a task score s_i and the raw model
log-prob of stop at the sampled stop step ``log_pterm_stop``. Every metric except Acc and
log p_term is computed on the valid samples; a metric whose denominator is zero is 0.

Sequences are any sequences of hashable tokens (token strings, token ids, or plain strings,
which are sequences of characters). Shapes: per-sample arrays are [N]; per-depth arrays are
[K] for depths k = 1..K; token marginals are [T, V] over a vocabulary of V tokens.

- Acc = n_valid / N; Score = mean s over valid samples.
- Len = mean l, Len50/Len90 = percentiles of l (numpy's linear interpolation) over valid samples;
  Frac[a-b] = Count[a-b] / n_valid with Count[a-b] = #{valid: a <= l <= b} (b = None: open).
- log p_term = mean of ``log_pterm_stop`` over all N samples, and per length.
- UniqStr = number of distinct valid sequences; UniqRate = UniqStr / n_valid.
- Entropy (ragged): for 0-based position t with n_t = #{valid: l > t} > 1, the natural-log
  entropy H_t = -sum_v p_t(v) log(p_t(v) + 1e-10) of the tokens at t; mean of H_t over those t.
- Prefix diagnostics at depth k over survivors l >= k: Surv = n_k / n_valid, PefEnt = entropy
  of the length-k prefix distribution, Eff = exp(PefEnt), Top1 = largest prefix frequency,
  UniqueRate = distinct prefixes / n_k.
- Expr24 coverage against Y*: Unique = distinct valid sequences, CovCount = |Unique ∩ Y*|,
  Cov = CovCount / |Y*|, NormCov = CovCount / min(N, |Y*|).
- Position-wise marginals q_t(v) = C_t(v) / Z_t over sequences longer than t; stabilised
  KL_eps(p||q) = sum_{v in union support} (p+eps) log((p+eps)/(q+eps)), eps = 1e-9,
  JS_eps = (KL_eps(p||m) + KL_eps(q||m)) / 2 with m = (p+q)/2; the scalars average over
  t = 0..T_max-1 with T_max the longest sequence in either set.
- FPDiv = 1 - mean pairwise similarity over distinct pairs (0 with < 2 items); MacroFP = mean
  FPDiv over length bins (0-5, 6-10, 11+ by default).
- SMILES (:func:`smiles_metrics`): UniqStr = distinct valid fragments, UniqMol = distinct
  canonical merged molecules; FPDiv/MacroFP on the Tanimoto similarity of their packed Morgan
  fingerprints (``core.similarity``).
- Across seeds: mean +- t_{S-1, (1+c)/2} sd / sqrt(S) (:func:`mean_ci`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

ENTROPY_EPS = 1e-10
DIVERGENCE_EPS = 1e-9
DEFAULT_FP_BINS: tuple[tuple[int, int | None], ...] = ((0, 5), (6, 10), (11, None))
EXPR24_LENGTHS = (3, 5, 7, 9)

TokenSequence = Sequence[Hashable]
PairwiseSimilarity = Callable[[Sequence[Any], Sequence[Any]], np.ndarray]


def _safe_div(numerator: float, denominator: float) -> float:
    """numerator / denominator, or 0.0 when the denominator is zero (the paper's convention)."""
    return float(numerator) / float(denominator) if denominator else 0.0


def _as_bool(valid: Iterable[bool] | np.ndarray, name: str = "valid") -> np.ndarray:
    array = np.asarray(valid)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array.astype(bool)


def _as_float(values: Iterable[float] | np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array


def _check_same_length(**arrays: np.ndarray) -> None:
    sizes = {name: len(array) for name, array in arrays.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"arrays must have the same length, got {sizes}")


# ----------------------------------------------------------------------------- terminal


def accuracy(valid: Iterable[bool] | np.ndarray) -> float:
    """Acc = n_valid / N (0 for N = 0)."""
    flags = _as_bool(valid)
    return _safe_div(flags.sum(), flags.size)


def mean_score(scores: Iterable[float] | np.ndarray, valid: Iterable[bool] | np.ndarray) -> float:
    """Score = mean task score over valid samples."""
    values, flags = _as_float(scores, "scores"), _as_bool(valid)
    _check_same_length(scores=values, valid=flags)
    return _safe_div(values[flags].sum(), flags.sum())


def _valid_lengths(
    lengths: Iterable[int] | np.ndarray, valid: Iterable[bool] | np.ndarray
) -> np.ndarray:
    values, flags = np.asarray(lengths, dtype=np.int64), _as_bool(valid)
    if values.ndim != 1:
        raise ValueError(f"lengths must be one-dimensional, got shape {values.shape}")
    _check_same_length(lengths=values, valid=flags)
    if (values < 0).any():
        raise ValueError("lengths must be >= 0")
    return values[flags]


def mean_length(lengths: Iterable[int] | np.ndarray, valid: Iterable[bool] | np.ndarray) -> float:
    """Len = mean pre-stop length over valid samples."""
    kept = _valid_lengths(lengths, valid)
    return _safe_div(kept.sum(), kept.size)


def length_percentile(
    lengths: Iterable[int] | np.ndarray, valid: Iterable[bool] | np.ndarray, q: float
) -> float:
    """Len_q = q-th percentile (0..100, linear interpolation) of valid lengths; 0 if none."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    kept = _valid_lengths(lengths, valid)
    return float(np.percentile(kept, q)) if kept.size else 0.0


def length_count(
    lengths: Iterable[int] | np.ndarray,
    valid: Iterable[bool] | np.ndarray,
    low: int,
    high: int | None,
) -> int:
    """Count[low-high] = number of valid samples with low <= length <= high (high None: open)."""
    if high is not None and high < low:
        raise ValueError(f"high must be >= low ({low}), got {high}")
    kept = _valid_lengths(lengths, valid)
    inside = kept >= low if high is None else (kept >= low) & (kept <= high)
    return int(inside.sum())


def length_fraction(
    lengths: Iterable[int] | np.ndarray,
    valid: Iterable[bool] | np.ndarray,
    low: int,
    high: int | None,
) -> float:
    """Frac[low-high] = Count[low-high] / n_valid."""
    count = length_count(lengths, valid, low, high)
    return _safe_div(count, _as_bool(valid).sum())


def mean_log_pterm(log_pterm_stop: Iterable[float] | np.ndarray) -> float:
    """log p_term(tau) = mean over all samples of the raw log-prob of the sampled stop."""
    values = _as_float(log_pterm_stop, "log_pterm_stop")
    return _safe_div(values.sum(), values.size)


def log_pterm_by_length(
    log_pterm_stop: Iterable[float] | np.ndarray, lengths: Iterable[int] | np.ndarray
) -> dict[int, float]:
    """Mean raw stop log-prob of all samples grouped by their length, keys in increasing order."""
    values = _as_float(log_pterm_stop, "log_pterm_stop")
    sizes = np.asarray(lengths, dtype=np.int64)
    _check_same_length(log_pterm_stop=values, lengths=sizes)
    return {int(n): float(values[sizes == n].mean()) for n in np.unique(sizes)}


def unique_count(sequences: Sequence[TokenSequence], valid: Iterable[bool] | np.ndarray) -> int:
    """UniqStr = number of distinct valid sequences (token tuples)."""
    flags = _as_bool(valid)
    if len(sequences) != flags.size:
        raise ValueError(f"sequences and valid differ in length: {len(sequences)} vs {flags.size}")
    return len({tuple(seq) for seq, ok in zip(sequences, flags, strict=True) if ok})


def unique_rate(sequences: Sequence[TokenSequence], valid: Iterable[bool] | np.ndarray) -> float:
    """UniqRate = UniqStr / n_valid."""
    return _safe_div(unique_count(sequences, valid), _as_bool(valid).sum())


# ----------------------------------------------------------------------------- encoding


def _encode(
    sequences: Sequence[TokenSequence], vocabulary: dict[Hashable, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Pad to an int64 code array [n, T_max] (-1 after the end) and lengths [n].

    ``vocabulary`` is extended in place with unseen tokens so that several sets share codes.
    """
    lengths = np.fromiter((len(seq) for seq in sequences), dtype=np.int64, count=len(sequences))
    width = int(lengths.max()) if lengths.size else 0
    codes = np.full((len(sequences), width), -1, dtype=np.int64)
    for row, seq in enumerate(sequences):
        for column, token in enumerate(seq):
            codes[row, column] = vocabulary.setdefault(token, len(vocabulary))
    return codes, lengths


def _entropy(counts: np.ndarray, eps: float) -> float:
    """-sum p log(p + eps) of the distribution proportional to the non-negative ``counts``."""
    probabilities = counts[counts > 0] / counts.sum()
    return float(-(probabilities * np.log(probabilities + eps)).sum())


# ----------------------------------------------------------------------------- entropy


def ragged_token_entropy(sequences: Sequence[TokenSequence]) -> float:
    """Entropy: mean over positions with >= 2 survivors of the token entropy at that position.

    ``sequences`` are the valid samples; returns 0 when no position has two survivors.
    """
    vocabulary: dict[Hashable, int] = {}
    codes, _ = _encode(sequences, vocabulary)
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


# ----------------------------------------------------------------------------- prefixes


@dataclass(frozen=True)
class PrefixDiagnostics:
    """Prefix-collapse diagnostics at depths k = 1..K, each array of shape [K]."""

    depth: np.ndarray
    surv: np.ndarray
    pef_ent: np.ndarray
    eff: np.ndarray
    top1: np.ndarray
    unique_rate: np.ndarray

    def to_dict(self) -> dict[str, list[float]]:
        """JSON-ready lists, keyed by field name."""
        return {name: np.asarray(values).tolist() for name, values in asdict(self).items()}


def prefix_diagnostics(
    sequences: Sequence[TokenSequence], max_depth: int | None = None
) -> PrefixDiagnostics:
    """Surv/PefEnt/Eff/Top1/UniqueRate at depths 1..max_depth (default: the longest sequence).

    ``sequences`` are the valid samples. At a depth with no survivors every value is 0.
    """
    longest = max((len(seq) for seq in sequences), default=0)
    depth_limit = longest if max_depth is None else max_depth
    if depth_limit < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    n_valid = len(sequences)
    rows: dict[str, list[float]] = {key: [] for key in ("surv", "pef", "eff", "top1", "uniq")}
    for k in range(1, depth_limit + 1):
        prefixes = Counter(tuple(seq[:k]) for seq in sequences if len(seq) >= k)
        n_k = sum(prefixes.values())
        if n_k == 0:
            for values in rows.values():
                values.append(0.0)
            continue
        counts = np.fromiter(prefixes.values(), dtype=np.float64, count=len(prefixes))
        probabilities = counts / n_k
        entropy = float(-(probabilities * np.log(probabilities)).sum())
        rows["surv"].append(_safe_div(n_k, n_valid))
        rows["pef"].append(entropy)
        rows["eff"].append(math.exp(entropy))
        rows["top1"].append(float(probabilities.max()))
        rows["uniq"].append(len(prefixes) / n_k)
    return PrefixDiagnostics(
        depth=np.arange(1, depth_limit + 1, dtype=np.int64),
        surv=np.asarray(rows["surv"], dtype=np.float64),
        pef_ent=np.asarray(rows["pef"], dtype=np.float64),
        eff=np.asarray(rows["eff"], dtype=np.float64),
        top1=np.asarray(rows["top1"], dtype=np.float64),
        unique_rate=np.asarray(rows["uniq"], dtype=np.float64),
    )


# ----------------------------------------------------------------------------- coverage


@dataclass(frozen=True)
class Coverage:
    """Coverage of the enumerated solution set Y* by the valid samples."""

    unique: int
    cov_count: int
    cov: float
    norm_cov: float


def coverage(
    valid_sequences: Sequence[TokenSequence],
    solutions: Sequence[TokenSequence],
    n_samples: int,
) -> Coverage:
    """Unique, CovCount, Cov = CovCount/|Y*|, NormCov = CovCount/min(N, |Y*|).

    ``n_samples`` is N, the number of draws including invalid ones.
    """
    if n_samples < len(valid_sequences):
        raise ValueError(
            f"n_samples ({n_samples}) must be >= the number of valid sequences "
            f"({len(valid_sequences)})"
        )
    distinct = {tuple(seq) for seq in valid_sequences}
    oracle = {tuple(seq) for seq in solutions}
    cov_count = len(distinct & oracle)
    return Coverage(
        unique=len(distinct),
        cov_count=cov_count,
        cov=_safe_div(cov_count, len(oracle)),
        norm_cov=_safe_div(cov_count, min(n_samples, len(oracle))),
    )


# ----------------------------------------------------------------------------- marginals


def stabilised_kl(p: np.ndarray, q: np.ndarray, eps: float = DIVERGENCE_EPS) -> float:
    """KL_eps(p||q) = sum over the union support of (p+eps) log((p+eps)/(q+eps)).

    ``p`` and ``q`` are arrays of the same shape [V]; entries where both are 0 are outside the
    union support and contribute nothing (eps alone would otherwise add a spurious term).
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    support = (p > 0) | (q > 0)
    ps, qs = p[support] + eps, q[support] + eps
    return float((ps * np.log(ps / qs)).sum())


def stabilised_js(p: np.ndarray, q: np.ndarray, eps: float = DIVERGENCE_EPS) -> float:
    """JS_eps(p, q) = (KL_eps(p||m) + KL_eps(q||m)) / 2 with m = (p + q) / 2."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    m = (p + q) / 2.0
    return 0.5 * stabilised_kl(p, m, eps) + 0.5 * stabilised_kl(q, m, eps)


def token_marginals(
    sequences: Sequence[TokenSequence], vocabulary: dict[Hashable, int], t_max: int
) -> np.ndarray:
    """Position-wise token marginals [t_max, V] (V = len(vocabulary) after encoding).

    Row t is the token distribution at 0-based position t among sequences longer than t
    (duplicates counted); a row with no such sequence is all zeros. ``vocabulary`` maps tokens
    to columns and is extended in place with unseen tokens.
    """
    codes, _ = _encode(sequences, vocabulary)
    marginals = np.zeros((t_max, len(vocabulary)), dtype=np.float64)
    for t in range(min(t_max, codes.shape[1])):
        present = codes[:, t][codes[:, t] >= 0]
        if present.size:
            marginals[t] = np.bincount(present, minlength=len(vocabulary)) / present.size
    return marginals


@dataclass(frozen=True)
class MarginalDivergences:
    """Position-averaged divergences between sampled (pi) and oracle (p*) token marginals."""

    kl_pi_p: float
    kl_p_pi: float
    js_tok: float


def marginal_divergences(
    valid_sequences: Sequence[TokenSequence],
    oracle_sequences: Sequence[TokenSequence],
    eps: float = DIVERGENCE_EPS,
) -> MarginalDivergences:
    """KL(pi -> p*), KL(p* -> pi) and JS_tok averaged over t = 0..T_max-1.

    A position where one set has no survivors compares against an all-zero marginal (the
    formula taken literally), so missing lengths in the samples show up as a large
    KL(p* -> pi). All zero when either set is empty (zero denominator).
    """
    if not valid_sequences or not oracle_sequences:
        return MarginalDivergences(0.0, 0.0, 0.0)
    t_max = max(max(map(len, valid_sequences)), max(map(len, oracle_sequences)))
    if t_max == 0:
        return MarginalDivergences(0.0, 0.0, 0.0)
    vocabulary: dict[Hashable, int] = {}
    pi = token_marginals(valid_sequences, vocabulary, t_max)
    p_star = token_marginals(oracle_sequences, vocabulary, t_max)
    width = len(vocabulary)
    # pi was built before p* added its unseen tokens: pad to the shared vocabulary.
    pi = np.pad(pi, ((0, 0), (0, width - pi.shape[1])))
    kl_pi_p = np.mean([stabilised_kl(pi[t], p_star[t], eps) for t in range(t_max)])
    kl_p_pi = np.mean([stabilised_kl(p_star[t], pi[t], eps) for t in range(t_max)])
    js = np.mean([stabilised_js(pi[t], p_star[t], eps) for t in range(t_max)])
    return MarginalDivergences(float(kl_pi_p), float(kl_p_pi), float(js))


# ----------------------------------------------------------------------------- similarity


def _similarity_matrix(
    items: Sequence[Any], similarity: np.ndarray | PairwiseSimilarity
) -> np.ndarray:
    matrix = (
        np.asarray(similarity(items, items), dtype=np.float64)
        if callable(similarity)
        else np.asarray(similarity, dtype=np.float64)
    )
    if matrix.shape != (len(items), len(items)):
        raise ValueError(
            f"similarity must be a [{len(items)}, {len(items)}] matrix, got shape {matrix.shape}"
        )
    return matrix


def fp_div(items: Sequence[Any], similarity: np.ndarray | PairwiseSimilarity) -> float:
    """FPDiv = 1 - mean similarity over distinct pairs i < j; 0 with fewer than 2 items.

    ``similarity`` is either the [n, n] matrix for ``items`` or a pairwise function such as
    :meth:`raptb.core.ports.Similarity.pairwise` (``f(a, b) -> [len(a), len(b)]``).
    """
    if len(items) < 2:
        return 0.0
    matrix = _similarity_matrix(items, similarity)
    upper = np.triu_indices(len(items), k=1)
    return float(1.0 - matrix[upper].mean())


def macro_fp_div(
    items: Sequence[Any],
    lengths: Iterable[int] | np.ndarray,
    similarity: np.ndarray | PairwiseSimilarity,
    bins: Sequence[tuple[int, int | None]] = DEFAULT_FP_BINS,
) -> float:
    """MacroFP = mean over length bins [a, b] (b None: open) of FPDiv of the items in the bin."""
    sizes = np.asarray(lengths, dtype=np.int64)
    if sizes.shape != (len(items),):
        raise ValueError(f"lengths must have shape [{len(items)}], got {sizes.shape}")
    if not bins:
        raise ValueError("bins must not be empty")
    matrix = _similarity_matrix(items, similarity) if len(items) else np.zeros((0, 0))
    values = []
    for low, high in bins:
        inside = sizes >= low if high is None else (sizes >= low) & (sizes <= high)
        index = np.flatnonzero(inside)
        members = [items[int(i)] for i in index]
        values.append(fp_div(members, matrix[np.ix_(index, index)]))
    return float(np.mean(values))


# ----------------------------------------------------------------------------- seeds


def _regularised_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) by the Lentz continued fraction (Numerical Recipes' betacf)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    # The fraction converges fast only for x < (a+1)/(a+b+2); use the symmetry otherwise.
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _regularised_incomplete_beta(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def student_t_cdf(x: float, df: float) -> float:
    """CDF of Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    x2 = x * x
    if x2 < df:
        # Near the centre use P(|T| < |x|) = I_{x^2/(df+x^2)}(1/2, df/2): the tail form below
        # would evaluate I at df/(df+x^2) ~ 1 and lose all precision to cancellation.
        central = 0.5 * _regularised_incomplete_beta(0.5, df / 2.0, x2 / (df + x2))
        return 0.5 + central if x >= 0 else 0.5 - central
    tail = 0.5 * _regularised_incomplete_beta(df / 2.0, 0.5, df / (df + x2))
    return 1.0 - tail if x >= 0 else tail


def student_t_quantile(probability: float, df: float) -> float:
    """Quantile of Student's t (bisection on the CDF to ~1e-12; scipy is not a dependency)."""
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {probability}")
    if probability < 0.5:
        return -student_t_quantile(1.0 - probability, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < probability:
        high *= 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if student_t_cdf(middle, df) < probability:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class ConfidenceInterval:
    """mean +- half_width; half_width is NaN for a single value (no spread to estimate)."""

    mean: float
    half_width: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def mean_ci(values: Iterable[float] | np.ndarray, confidence: float = 0.95) -> ConfidenceInterval:
    """Two-sided t-interval over seeds: mean +- t_{S-1,(1+c)/2} * sd(ddof=1) / sqrt(S)."""
    array = _as_float(values, "values")
    if array.size == 0:
        raise ValueError("values must not be empty")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    mean = float(array.mean())
    if array.size == 1:
        return ConfidenceInterval(mean, math.nan)
    quantile = student_t_quantile((1.0 + confidence) / 2.0, array.size - 1)
    return ConfidenceInterval(mean, quantile * float(array.std(ddof=1)) / math.sqrt(array.size))


# ----------------------------------------------------------------------------- Expr24


@dataclass(frozen=True)
class EvalSample:
    """One evaluation sample (also accepted as a mapping with the same keys).

    tokens: generated tokens before the stop (strings or ids); length = len(tokens).
    valid: the task's validity flag (Expr24: the text parses).
    score: the task score (Expr24: 1.0 iff equal to 24).
    log_pterm_stop: raw model log-prob of stop at the sampled stop step.
    text: the decoded text; when given, Y*-based metrics compare its characters (so that a
        tokenizer with multi-character tokens still matches the enumerated solutions).
    """

    tokens: Sequence[Hashable]
    valid: bool
    score: float
    log_pterm_stop: float
    text: str | None = None


def _as_sample(sample: EvalSample | Mapping[str, Any]) -> EvalSample:
    if isinstance(sample, EvalSample):
        return sample
    try:
        return EvalSample(
            tokens=tuple(sample["tokens"]),
            valid=bool(sample["valid"]),
            score=float(sample["score"]),
            log_pterm_stop=float(sample["log_pterm_stop"]),
            text=sample.get("text"),
        )
    except KeyError as error:
        raise ValueError(f"sample is missing the field {error.args[0]!r}") from error


def expr24_metrics(
    samples: Sequence[EvalSample | Mapping[str, Any]],
    solutions: Sequence[str],
    bucket_lengths: Sequence[int] = EXPR24_LENGTHS,
) -> dict[str, Any]:
    """Every Expr24 metric of metrics.md as a JSON-ready dict.

    Valid here means *correct* (parses and equals 24: ``valid`` and ``score == 1``). Keys:
    n_samples, n_valid, acc, score, unique, uniq_rate, cov_count, cov, norm_cov, kl_pi_p,
    kl_p_pi, js_tok, log_pterm, log_pterm_by_length, len_mean, len50, len90,
    count_by_length, frac_by_length, entropy, entropy_by_length, prefix (depth/surv/pef_ent/
    eff/top1/unique_rate lists, depths 1..max(bucket_lengths)). count/frac_by_length cover
    ``bucket_lengths``; per-length dicts have string keys (JSON object keys).
    """
    rows = [_as_sample(sample) for sample in samples]
    correct = np.array([s.valid and s.score == 1.0 for s in rows], dtype=bool)
    token_lengths = np.array([len(s.tokens) for s in rows], dtype=np.int64)
    scores = np.array([s.score for s in rows], dtype=np.float64)
    log_pterm = np.array([s.log_pterm_stop for s in rows], dtype=np.float64)
    valid_tokens = [tuple(s.tokens) for s, ok in zip(rows, correct, strict=True) if ok]
    valid_texts = [
        tuple(s.text) if s.text is not None else tuple(s.tokens)
        for s, ok in zip(rows, correct, strict=True)
        if ok
    ]
    cover = coverage(valid_texts, solutions, len(rows))
    divergences = marginal_divergences(valid_texts, solutions)
    return {
        "n_samples": len(rows),
        "n_valid": int(correct.sum()),
        "acc": accuracy(correct),
        "score": mean_score(scores, correct),
        "unique": cover.unique,
        "uniq_rate": _safe_div(cover.unique, correct.sum()),
        "cov_count": cover.cov_count,
        "cov": cover.cov,
        "norm_cov": cover.norm_cov,
        "kl_pi_p": divergences.kl_pi_p,
        "kl_p_pi": divergences.kl_p_pi,
        "js_tok": divergences.js_tok,
        "log_pterm": mean_log_pterm(log_pterm),
        "log_pterm_by_length": {
            str(n): v for n, v in log_pterm_by_length(log_pterm, token_lengths).items()
        },
        "len_mean": mean_length(token_lengths, correct),
        "len50": length_percentile(token_lengths, correct, 50.0),
        "len90": length_percentile(token_lengths, correct, 90.0),
        "count_by_length": {
            str(n): length_count(token_lengths, correct, n, n) for n in bucket_lengths
        },
        "frac_by_length": {
            str(n): length_fraction(token_lengths, correct, n, n) for n in bucket_lengths
        },
        "entropy": ragged_token_entropy(valid_tokens),
        "entropy_by_length": {str(n): v for n, v in entropy_by_length(valid_tokens).items()},
        "prefix": prefix_diagnostics(
            valid_tokens, max_depth=max(bucket_lengths, default=0)
        ).to_dict(),
    }


# ----------------------------------------------------------------------------- SMILES


def smiles_metrics(
    samples: Sequence[Mapping[str, Any]], fingerprints: np.ndarray, max_depth: int
) -> dict[str, Any]:
    """Every SMILES metric of metrics.md as a JSON-ready dict.

    samples: mappings with ``tokens`` (before the stop), ``valid`` (the merged molecule
        sanitises), ``score`` (its QED), ``log_pterm_stop``, ``text`` (the fragment) and
        ``canonical`` (canonical SMILES of the merged molecule, None when invalid).
    fingerprints: packed uint64 [N, W] Morgan fingerprints of the merged molecules, one row per
        sample (rows of invalid samples are ignored).
    max_depth: deepest prefix depth for the diagnostics (the task's max length).

    Keys: n_samples, n_valid, acc, score, uniq_str, uniq_str_rate, uniq_mol, uniq_mol_rate,
    fp_div, macro_fp, entropy, entropy_by_length, len_mean, len50, len90, log_pterm,
    log_pterm_by_length, by_length ({length: {count, frac, score, fp_div, uniq_mol}} over valid
    samples) and prefix (depth/surv/pef_ent/eff/top1/unique_rate lists, depths 1..max_depth).
    """
    # imported here: the similarity kernels compile with Numba, which only SMILES metrics need
    from raptb.core.similarity import tanimoto_matrix

    fps = np.asarray(fingerprints)
    if fps.ndim != 2 or fps.shape[0] != len(samples):
        raise ValueError(
            f"fingerprints must have shape [{len(samples)}, W], got {tuple(fps.shape)}"
        )
    for field_name in ("tokens", "valid", "score", "log_pterm_stop", "text", "canonical"):
        if samples and field_name not in samples[0]:
            raise ValueError(f"sample is missing the field {field_name!r}")
    valid = np.array([bool(s["valid"]) for s in samples], dtype=bool)
    lengths = np.array([len(s["tokens"]) for s in samples], dtype=np.int64)
    scores = np.array([float(s["score"]) for s in samples], dtype=np.float64)
    log_pterm = np.array([float(s["log_pterm_stop"]) for s in samples], dtype=np.float64)
    index = np.flatnonzero(valid)
    valid_tokens = [tuple(samples[int(i)]["tokens"]) for i in index]
    texts = [samples[int(i)]["text"] for i in index]
    molecules = [samples[int(i)]["canonical"] for i in index]
    valid_lengths = lengths[index]
    similarity = tanimoto_matrix(np.ascontiguousarray(fps[index], dtype=np.uint64))
    n_valid = int(valid.sum())
    by_length = {}
    for n in sorted({int(v) for v in valid_lengths}):
        members = np.flatnonzero(valid_lengths == n)
        by_length[str(n)] = {
            "count": int(members.size),
            "frac": _safe_div(members.size, n_valid),
            "score": float(scores[index[members]].mean()),
            "fp_div": fp_div(list(members), similarity[np.ix_(members, members)]),
            "uniq_mol": len({molecules[int(m)] for m in members}),
        }
    uniq_str, uniq_mol = len(set(texts)), len(set(molecules))
    return {
        "n_samples": len(samples),
        "n_valid": n_valid,
        "acc": accuracy(valid),
        "score": mean_score(scores, valid),
        "uniq_str": uniq_str,
        "uniq_str_rate": _safe_div(uniq_str, n_valid),
        "uniq_mol": uniq_mol,
        "uniq_mol_rate": _safe_div(uniq_mol, n_valid),
        "fp_div": fp_div(molecules, similarity),
        "macro_fp": macro_fp_div(molecules, valid_lengths, similarity),
        "entropy": ragged_token_entropy(valid_tokens),
        "entropy_by_length": {str(n): v for n, v in entropy_by_length(valid_tokens).items()},
        "len_mean": mean_length(lengths, valid),
        "len50": length_percentile(lengths, valid, 50.0),
        "len90": length_percentile(lengths, valid, 90.0),
        "log_pterm": mean_log_pterm(log_pterm),
        "log_pterm_by_length": {
            str(n): v for n, v in log_pterm_by_length(log_pterm, lengths).items()
        },
        "by_length": by_length,
        "prefix": prefix_diagnostics(valid_tokens, max_depth=max_depth).to_dict(),
    }


def sequence_metrics(samples: Sequence[Mapping[str, Any]], max_depth: int) -> dict[str, Any]:
    """Task-agnostic metrics of metrics.md for any task (custom tasks use these).

    samples: mappings with ``tokens`` (before the stop), ``valid``, ``score`` and
    ``log_pterm_stop``. Valid means the task called the text valid. Keys: n_samples, n_valid,
    acc, score, unique, uniq_rate, entropy, entropy_by_length, len_mean, len50, len90, log_pterm,
    log_pterm_by_length and prefix (depths 1..max_depth).
    """
    for field_name in ("tokens", "valid", "score", "log_pterm_stop"):
        if samples and field_name not in samples[0]:
            raise ValueError(f"sample is missing the field {field_name!r}")
    valid = np.array([bool(s["valid"]) for s in samples], dtype=bool)
    lengths = np.array([len(s["tokens"]) for s in samples], dtype=np.int64)
    scores = np.array([float(s["score"]) for s in samples], dtype=np.float64)
    log_pterm = np.array([float(s["log_pterm_stop"]) for s in samples], dtype=np.float64)
    sequences = [tuple(s["tokens"]) for s in samples]
    valid_tokens = [seq for seq, ok in zip(sequences, valid, strict=True) if ok]
    return {
        "n_samples": len(samples),
        "n_valid": int(valid.sum()),
        "acc": accuracy(valid),
        "score": mean_score(scores, valid),
        "unique": unique_count(sequences, valid),
        "uniq_rate": unique_rate(sequences, valid),
        "entropy": ragged_token_entropy(valid_tokens),
        "entropy_by_length": {str(k): v for k, v in entropy_by_length(valid_tokens).items()},
        "len_mean": mean_length(lengths, valid),
        "len50": length_percentile(lengths, valid, 50.0),
        "len90": length_percentile(lengths, valid, 90.0),
        "log_pterm": mean_log_pterm(log_pterm),
        "log_pterm_by_length": {
            str(k): v for k, v in log_pterm_by_length(log_pterm, lengths).items()
        },
        "prefix": prefix_diagnostics(valid_tokens, max_depth=max_depth).to_dict(),
    }
