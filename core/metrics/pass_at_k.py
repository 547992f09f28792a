"""The unbiased pass@k estimator of Chen et al. 2021 (Codex, arXiv 2107.03374, eq. 1).

For a prompt with n samples of which c are correct, the probability that k samples drawn
without replacement from the n include a correct one is

    pass@k(n, c) = 1 - C(n - c, k) / C(n, k)                      (1 when n - c < k)

an unbiased estimate of 1 - (1 - p)^k for the prompt's success rate p. The binomial ratio is
taken as the product prod_{i = n-c+1}^{n} (1 - k / i), as in the paper's numpy code (its
Figure 3; openai/human-eval, ``human_eval/evaluation.py``, ``estimate_pass_at_k``), which
neither overflows nor loses digits at n = 6,400. Over several prompts the estimates are
averaged, each prompt weighing the same.

k larger than a prompt's n cannot be estimated from that prompt; :func:`mean_pass_at_k` then
returns None (``null`` in metrics.json), where human-eval leaves the key out.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from raptb.core.metrics._arrays import as_flags, check_same_length

DEFAULT_PASS_K = (1, 8, 64, 256)
"""The k values every evaluation reports."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k) for one prompt: n samples, c correct, 1 <= k <= n."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(
    n: Sequence[int] | np.ndarray, c: Sequence[int] | np.ndarray, k: int
) -> float | None:
    """Mean over prompts of pass@k(n_p, c_p); n, c: [P]. None when some n_p < k or P = 0."""
    sizes = np.asarray(n, dtype=np.int64)
    hits = np.asarray(c, dtype=np.int64)
    if sizes.ndim != 1 or sizes.shape != hits.shape:
        raise ValueError(
            f"n and c must be [P] arrays of one shape, got {sizes.shape}, {hits.shape}"
        )
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if sizes.size == 0 or int(sizes.min()) < k:
        return None
    return float(np.mean([pass_at_k(int(a), int(b), k) for a, b in zip(sizes, hits, strict=True)]))


def pass_at_k_report(
    prompts: Iterable[Hashable],
    correct: Iterable[bool] | np.ndarray,
    ks: Sequence[int] = DEFAULT_PASS_K,
) -> dict[str, float | None]:
    """{str(k): mean pass@k} with the samples grouped by prompt; prompts, correct: [N]."""
    flags = as_flags(correct)
    codes: dict[Hashable, int] = {}
    index = np.array([codes.setdefault(p, len(codes)) for p in prompts], dtype=np.int64)
    check_same_length(prompts=index, correct=flags)
    n = np.bincount(index, minlength=len(codes))
    c = np.bincount(index[flags], minlength=len(codes))
    return {str(k): mean_pass_at_k(n, c, k) for k in ks}
