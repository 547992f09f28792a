"""Absorbed suffix targets of RapTB (paper Sec. 3.4, eqs. 5-7, and appendix "Absorbed suffix
backups", eqs. 23-25).

For a trajectory of length tau with task-only prefix rewards u_0..u_tau and backup window end
h = min(tau, K) (K the horizon cap, None = tau), for every k <= h:

    u_max_k  = max_{j in [k, h]} u_j
    u_soft_k = (1/beta) log sum_{j in [k, h]} exp(beta u_j - beta rho (j - k))
    u_tgt_k  = alpha u_max_k + (1 - alpha) u_soft_k          (target = "mix")

Positions k > h get -inf (not 0: with negative rewards a 0 fill would floor the target at 0, a bug
of the paper's reference code).

Both suffix reductions are computed by a doubling (Hillis-Steele) scan: after the pass with
stride s every position holds the reduction over [k, k + 2s). This needs ceil(log2(T+1)) passes of
[B, T+1] array work, no Python loop over trajectories or positions, and stays exact in log space
(``logaddexp``) for any reward magnitude.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from array_api_compat import array_namespace, device

Array = Any
TargetMode = Literal["max", "soft", "mix"]
TARGET_MODES: tuple[str, ...] = ("max", "soft", "mix")


def backup_window_end(length: Array, horizon: int | None) -> Array:
    """h = min(tau, K) per trajectory ([B] integer array); K = None means no cap."""
    if horizon is None:
        return length
    xp = array_namespace(length)
    return xp.minimum(length, xp.asarray(horizon, dtype=length.dtype, device=device(length)))


def absorbed_targets(
    u: Array,
    length: Array,
    alpha: float,
    beta: float,
    rho: float,
    horizon: int | None = None,
    mode: TargetMode = "mix",
) -> Array:
    """Absorbed targets u_tgt [B, T+1] from task-only rewards ``u`` [B, T+1] and ``length`` [B].

    Entries k > h = min(tau, horizon) are -inf. ``u`` carries no gradient in training (it is data),
    so the result is a constant of the loss.
    """
    if mode not in TARGET_MODES:
        raise ValueError(f"target: must be one of {TARGET_MODES}, got {mode!r}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: must lie in [0, 1], got {alpha}")
    if not (beta > 0.0 and math.isfinite(beta)):
        raise ValueError(f"beta: must be a finite number > 0, got {beta}")
    if not (rho >= 0.0 and math.isfinite(rho)):
        raise ValueError(f"rho: must be a finite number >= 0, got {rho}")
    if horizon is not None and horizon < 1:
        raise ValueError(f"horizon: must be None or an integer >= 1, got {horizon}")
    xp = array_namespace(u, length)
    if u.ndim != 2 or tuple(length.shape) != (u.shape[0],):
        raise ValueError(
            f"u: expected [B, T+1] with length [B], got {tuple(u.shape)} and {tuple(length.shape)}"
        )
    n_cols = int(u.shape[1])
    dev = device(u)
    cols = xp.arange(n_cols, device=dev)
    h = backup_window_end(length, horizon)
    in_window = cols[None, :] <= h[:, None]
    neg_inf = xp.full_like(u, -math.inf)

    # Suffix max and suffix discounted log-sum-exp, both over [k, h], by a doubling scan.
    run_max = xp.where(in_window, u, neg_inf)
    run_lse = xp.where(in_window, beta * u, neg_inf)
    stride = 1
    while stride < n_cols:
        pad = neg_inf[:, :stride]
        run_max = xp.maximum(run_max, xp.concat([run_max[:, stride:], pad], axis=1))
        shifted = xp.concat([run_lse[:, stride:], pad], axis=1) - (beta * rho * stride)
        run_lse = xp.logaddexp(run_lse, shifted)
        stride *= 2

    if mode == "max":
        return run_max
    u_soft = run_lse / beta
    if mode == "soft":
        return u_soft
    zero = xp.zeros_like(u)
    mixed = alpha * xp.where(in_window, run_max, zero) + (1.0 - alpha) * xp.where(
        in_window, u_soft, zero
    )
    return xp.where(in_window, mixed, neg_inf)
