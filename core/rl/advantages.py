"""Advantages for the RL baselines: GRPO group normalisation, PPO token rewards and GAE.

Written once against the array API (numpy for the property tests, torch in training), with the
conventions of TRL (``trl/trainer/grpo_trainer.py``, ``trl/experimental/ppo/ppo_trainer.py`` and
its ``masked_whiten``), in the action layout of ``core.rl.batch`` (A = T + 1 columns, the last
used column of a row, tau, is the stop action). Nothing here takes gradients: advantages are data.

- ``group_advantages`` (GRPO, Shao et al. 2024): rows are consecutive groups of
  ``num_generations`` samples of one prompt. A_i = r_i - mean_group(r), divided by (std + 1e-4)
  where std is the Bessel-corrected standard deviation of the group (``scale_rewards="group"``)
  or of the whole batch (``"batch"``; the mean is still the group's), or not divided
  (``"none"``, Dr. GRPO). A group of one sample has std 0 (TRL's rule), hence advantage 0.
- ``kl_estimate``: per-action KL(pi || pi_ref) estimators of Schulman's "Approximating KL
  divergence": k1 = log pi - log pi_ref; k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1
  (>= 0, GRPO's estimator).
- ``token_rewards`` (classic RLHF PPO, Ziegler et al. 2019): r_t = -kl_coef * kl_t for t <= tau,
  plus the terminal reward R at the stop action t = tau.
- ``gae`` (Schulman et al. 2016): delta_t = r_t + gamma V_{t+1} - V_t with V_{tau+1} = 0 (the
  episode ends with the stop), A_t = sum_{s=t}^{tau} (gamma lam)^(s-t) delta_s, returns
  G_t = A_t + V_t.
- ``masked_whiten`` (TRL): (x - mean) / sqrt(var + 1e-8) over the masked entries, var with
  Bessel's correction; ``shift_mean=False`` adds the mean back (TRL's ``whiten_rewards``).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from array_api_compat import array_namespace, device

Array = Any
ScaleRewards = Literal["group", "batch", "none"]
KLEstimator = Literal["k1", "k3"]

SCALE_REWARDS: tuple[str, ...] = ("group", "batch", "none")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k3")
# TRL's constants: 1e-4 added to the reward std (GRPO), 1e-8 to the variance when whitening (PPO)
REWARD_STD_EPS = 1e-4
WHITEN_EPS = 1e-8


def _bessel_std(x: Array, axis: int | None) -> Array:
    """Bessel-corrected std along ``axis`` (keepdims), 0 where fewer than two values."""
    xp = array_namespace(x)
    n = int(x.shape[axis]) if axis is not None else math.prod(int(s) for s in x.shape)
    if n < 2:
        shape = (1,) * x.ndim
        return xp.zeros(shape if axis is None else (x.shape[0], 1), dtype=x.dtype, device=device(x))
    return xp.std(x, axis=axis, correction=1, keepdims=True)


def check_whole_groups(rows: int, num_generations: int) -> None:
    """Raise ValueError unless ``rows`` is a multiple of ``num_generations``."""
    if rows % num_generations:
        raise ValueError(
            f"num_generations: the batch of {rows} rows must hold whole groups of "
            f"num_generations = {num_generations} samples"
        )


def group_advantages(
    rewards: Array, num_generations: int, scale_rewards: ScaleRewards = "group"
) -> tuple[Array, Array]:
    """GRPO advantages [B] and the std [B] each row was (or would be) divided by.

    ``rewards`` [B] holds B / num_generations consecutive groups. The returned std is the one
    TRL logs as ``frac_reward_zero_std`` when 0 (for ``"none"`` the group std, as in TRL).
    """
    xp = array_namespace(rewards)
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards: must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    if isinstance(num_generations, bool) or not isinstance(num_generations, int):
        raise ValueError(f"num_generations: must be an integer, got {num_generations!r}")
    b = int(rewards.shape[0])
    if num_generations < 1 or b % num_generations:
        raise ValueError(
            f"num_generations: the batch of {b} rows must hold whole groups of "
            f"num_generations = {num_generations} samples"
        )
    grouped = xp.reshape(rewards, (b // num_generations, num_generations))
    centred = grouped - xp.mean(grouped, axis=1, keepdims=True)
    if scale_rewards == "batch":
        std = _bessel_std(rewards, None) * xp.ones_like(grouped)
    else:
        std = _bessel_std(grouped, 1) * xp.ones_like(grouped)
    adv = centred if scale_rewards == "none" else centred / (std + REWARD_STD_EPS)
    return xp.reshape(adv, (b,)), xp.reshape(std, (b,))


def masked_mean(values: Array, mask: Array) -> Array:
    """Mean of ``values`` over the entries where ``mask`` is true (0 for an empty mask)."""
    xp = array_namespace(values, mask)
    total = xp.sum(xp.where(mask, values, xp.zeros_like(values)))
    count = xp.sum(xp.astype(mask, values.dtype))
    return total / xp.maximum(count, xp.ones_like(count))


def masked_whiten(values: Array, mask: Array, shift_mean: bool = True) -> Array:
    """TRL's ``masked_whiten``: (values - mean) / sqrt(var + 1e-8) over the masked entries.

    var is Bessel-corrected (n / (n - 1)); a single masked entry has var 0 here (TRL divides by
    zero). With ``shift_mean=False`` the mean is added back. Masked-out entries are whitened too
    (the caller zeroes them); they never enter the statistics.
    """
    xp = array_namespace(values, mask)
    mean = masked_mean(values, mask)
    n = xp.sum(xp.astype(mask, values.dtype))
    var = masked_mean((values - mean) ** 2, mask)
    bessel = xp.where(n > 1, n / xp.where(n > 1, n - 1, xp.ones_like(n)), xp.zeros_like(n))
    whitened = (values - mean) / xp.sqrt(var * bessel + WHITEN_EPS)
    return whitened if shift_mean else whitened + mean


def kl_estimate(log_probs: Array, ref_log_probs: Array, estimator: KLEstimator = "k3") -> Array:
    """Per-action estimate of KL(pi || pi_ref) from sampled-action log-probs (same shape)."""
    xp = array_namespace(log_probs, ref_log_probs)
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator: must be one of {KL_ESTIMATORS}, got {estimator!r}")
    if estimator == "k1":
        return log_probs - ref_log_probs
    log_ratio = ref_log_probs - log_probs
    return xp.exp(log_ratio) - log_ratio - 1.0


def token_rewards(
    rewards: Array, length: Array, num_actions: int, kl: Array | None = None, kl_coef: float = 0.0
) -> Array:
    """[B, num_actions] per-action rewards: -kl_coef * kl_t for t <= tau, + rewards[b] at t = tau.

    ``rewards`` [B] terminal rewards; ``kl`` [B, num_actions] per-action KL estimates, or None
    for no penalty.
    """
    xp = array_namespace(rewards, length)
    cols = xp.arange(num_actions, device=device(length))[None, :]
    out = xp.astype(cols == length[:, None], rewards.dtype) * rewards[:, None]
    if kl is None or kl_coef == 0.0:
        return out
    return out + xp.where(cols <= length[:, None], -kl_coef * kl, xp.zeros_like(kl))


def gae(
    rewards: Array, values: Array, length: Array, gamma: float = 1.0, lam: float = 0.95
) -> tuple[Array, Array]:
    """GAE advantages and returns, both [B, T+1] and 0 after tau.

    ``rewards`` [B, T+1] per-action rewards, ``values`` [B, T+1] V(s_{0:k}); the value after the
    stop is 0. Computed as one matrix product with W[t, s] = (gamma lam)^(s - t) for s >= t (the
    closed form of TRL's backward recursion A_t = delta_t + gamma lam A_{t+1}).
    """
    xp = array_namespace(rewards, values, length)
    a = int(values.shape[1])
    idx = xp.arange(a, device=device(values))
    used = idx[None, :] <= length[:, None]
    zeros = xp.zeros_like(values)
    v = xp.where(used, values, zeros)
    r = xp.where(used, rewards, zeros)
    v_next = xp.concat([v[:, 1:], zeros[:, :1]], axis=1)
    delta = xp.where(used, r + gamma * v_next - v, zeros)
    span = idx[None, :] - idx[:, None]  # [t, s] = s - t
    decay = xp.where(
        span >= 0,
        float(gamma * lam) ** xp.astype(xp.maximum(span, xp.zeros_like(span)), values.dtype),
        xp.zeros((a, a), dtype=values.dtype, device=device(values)),
    )
    advantages = xp.matmul(delta, xp.permute_dims(decay, (1, 0)))
    advantages = xp.where(used, advantages, zeros)
    return advantages, xp.where(used, advantages + v, zeros)
