"""Prefix-collapse diagnostics: how the correct samples share their first k tokens.

At depth k over the survivors l >= k (n_k of them): Surv = n_k / n_correct, PefEnt = entropy of
the length-k prefix distribution, Eff = exp(PefEnt), Top1 = largest prefix frequency,
UniqueRate = distinct prefixes / n_k.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from raptb.core.metrics._arrays import TokenSequence, safe_div


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

    ``sequences`` are the correct samples. At a depth with no survivors every value is 0.
    """
    longest = max((len(seq) for seq in sequences), default=0)
    depth_limit = longest if max_depth is None else max_depth
    if depth_limit < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    n_correct = len(sequences)
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
        rows["surv"].append(safe_div(n_k, n_correct))
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
