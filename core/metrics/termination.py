"""Termination drift against the reference model (paper: Delta log p_term, CommonGen table).

Delta log p_term = mean_i log p_term^theta(x_i at tau_i) - mean_i log p_term^ref(x_i at tau_i),
both evaluated on the *same* samples x_i of the trained policy; negative values mean the trained
policy stops less readily than the pre-trained anchor (SubTB's length saturation).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def delta_log_pterm(
    trained: Iterable[float] | np.ndarray, reference: Iterable[float] | np.ndarray
) -> float:
    """Mean of ``trained`` minus mean of ``reference`` log p_term over the same samples.

    Raises:
        ValueError: when the arrays differ in length, are empty, or hold a non-finite value.
    """
    a = np.asarray(trained, dtype=np.float64).ravel()
    b = np.asarray(reference, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(
            f"delta_log_pterm: trained has {a.size} samples, reference {b.size}; "
            "they must score the same samples"
        )
    if a.size == 0:
        raise ValueError("delta_log_pterm: no samples")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("delta_log_pterm: log p_term values must be finite")
    return float(a.mean() - b.mean())
