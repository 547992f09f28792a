"""Position-wise token marginals and their stabilised KL / JS divergences.

q_t(v) = C_t(v) / Z_t over sequences longer than t (a [T, V] array over a vocabulary of V
tokens); stabilised KL_eps(p||q) = sum_{v in union support} (p+eps) log((p+eps)/(q+eps)),
eps = 1e-9, and JS_eps = (KL_eps(p||m) + KL_eps(q||m)) / 2 with m = (p+q)/2. The scalars of
``marginal_divergences`` average over t = 0..T_max-1 with T_max the longest sequence in either
set.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from raptb.core.metrics._arrays import TokenSequence, encode

DIVERGENCE_EPS = 1e-9


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
    codes, _ = encode(sequences, vocabulary)
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
    correct_sequences: Sequence[TokenSequence],
    oracle_sequences: Sequence[TokenSequence],
    eps: float = DIVERGENCE_EPS,
) -> MarginalDivergences:
    """KL(pi -> p*), KL(p* -> pi) and JS_tok averaged over t = 0..T_max-1.

    pi is the marginal of the correct samples. A position where one set has no survivors
    compares against an all-zero marginal (the formula taken literally), so missing lengths in
    the samples show up as a large KL(p* -> pi). All zero when either set is empty (zero
    denominator).
    """
    if not correct_sequences or not oracle_sequences:
        return MarginalDivergences(0.0, 0.0, 0.0)
    t_max = max(max(map(len, correct_sequences)), max(map(len, oracle_sequences)))
    if t_max == 0:
        return MarginalDivergences(0.0, 0.0, 0.0)
    vocabulary: dict[Hashable, int] = {}
    pi = token_marginals(correct_sequences, vocabulary, t_max)
    p_star = token_marginals(oracle_sequences, vocabulary, t_max)
    width = len(vocabulary)
    # pi was built before p* added its unseen tokens: pad to the shared vocabulary.
    pi = np.pad(pi, ((0, 0), (0, width - pi.shape[1])))
    kl_pi_p = np.mean([stabilised_kl(pi[t], p_star[t], eps) for t in range(t_max)])
    kl_p_pi = np.mean([stabilised_kl(p_star[t], pi[t], eps) for t in range(t_max)])
    js = np.mean([stabilised_js(pi[t], p_star[t], eps) for t in range(t_max)])
    return MarginalDivergences(float(kl_pi_p), float(kl_p_pi), float(js))
