"""PPO loss for language-model RLHF (Ziegler et al. 2019; Ouyang et al. 2022), in the action layout.

Follows TRL's ``PPOConfig`` names and defaults and ``PPOTrainer.train`` (TRL's experimental PPO,
``trl/experimental/ppo/``), with the terminal reward at the stop action (``core.rl.batch``). From
the rollout (all detached): per-action KL to the reference

    kl_t = log pi_old_t - log pi_ref_t              (kl_estimator "k1", TRL's default)
    kl_t = exp(log pi_ref_t - log pi_old_t) - (log pi_ref_t - log pi_old_t) - 1     ("k3")

per-action rewards r_t = -kl_coef kl_t (t <= tau) plus the terminal reward R at t = tau
(optionally whitened without shifting the mean, ``whiten_rewards``), GAE advantages and returns
from the rollout-time values (``core.rl.advantages.gae``), advantages whitened over the batch's
actions (TRL always does this; ``whiten_advantages=False`` turns it off). TRL computes these once
over its whole rollout batch before the PPO epochs: ``advantages`` does that for any batch, and
the loss takes its result (``targets``) for a subset of the rows, else computes it from the
batch it is given. Then, with
rho_t = exp(log pi_t - log pi_old_t) and m the action mask,

    pg_loss = mean_m max(-A rho, -A clip(rho, 1 - cliprange, 1 + cliprange))
    vf_loss = 0.5 mean_m max((V - G)^2, (clip(V, V_old - cliprange_value, V_old + cliprange_value)
                                         - G)^2)
    loss    = pg_loss + vf_coef vf_loss - entropy_coef mean_m H

(mean_m: mean over every action of the batch, TRL's ``masked_mean``). TRL's PPO has no
entropy bonus (entropy_coef defaults to 0 here).

**Differences from TRL**, deliberate: TRL adds the score one position *after* the EOS token (a
padding position whose value is trained and which feeds the EOS advantage through GAE); here the
reward arrives at the stop action itself and values are trained on states 0..tau only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from raptb.core.autograd import stop_gradient
from raptb.core.checks import check_range
from raptb.core.rl.advantages import (
    KL_ESTIMATORS,
    KLEstimator,
    gae,
    kl_estimate,
    masked_mean,
    masked_whiten,
    token_rewards,
)
from raptb.core.rl.base import RLObjective
from raptb.core.rl.batch import RLBatch

Array = Any
Diagnostics = dict[str, float]
Targets = tuple[Array, Array, Array | None]
"""(advantages, returns, kl) [B, T+1] of ``PPO.advantages``."""


@dataclass(frozen=True)
class PPO(RLObjective):
    """Clipped PPO with a value head and GAE; defaults are TRL's ``PPOConfig`` defaults."""

    name: ClassVar[str] = "ppo"
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    kl_coef: float = 0.05
    kl_estimator: Literal["k1", "k3"] = "k1"
    gamma: float = 1.0
    lam: float = 0.95
    whiten_rewards: bool = False
    whiten_advantages: bool = True
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        check_range("cliprange", self.cliprange, 0.0, math.inf)
        check_range("cliprange_value", self.cliprange_value, 0.0, math.inf)
        check_range("vf_coef", self.vf_coef, 0.0, math.inf)
        check_range("kl_coef", self.kl_coef, 0.0, math.inf)
        check_range("gamma", self.gamma, 0.0, 1.0)
        check_range("lam", self.lam, 0.0, 1.0)
        check_range("entropy_coef", self.entropy_coef, 0.0, math.inf)
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"kl_estimator: must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}"
            )
        for flag in ("whiten_rewards", "whiten_advantages"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag}: must be a bool, got {getattr(self, flag)!r}")

    @property
    def uses_reference(self) -> bool:
        """The per-token KL penalty in the rewards reads the reference when kl_coef != 0."""
        return self.kl_coef != 0.0

    def advantages(self, batch: RLBatch) -> Targets:
        """Detached (advantages, returns, kl) [B, T+1] from the rollout, 0 after tau.

        kl is the per-action KL estimate (None without reference log-probs); advantages are
        whitened when ``whiten_advantages``.
        """
        xp = batch.xp
        mask = batch.action_mask
        estimator: KLEstimator = self.kl_estimator
        old = batch.masked(stop_gradient(batch.old_log_probs))
        kl = None
        if batch.ref_log_probs is not None:
            ref = batch.masked(stop_gradient(batch.ref_log_probs))
            kl = batch.masked(kl_estimate(old, ref, estimator))
        rewards = token_rewards(
            stop_gradient(batch.rewards), batch.length, batch.num_actions, kl, self.kl_coef
        )
        if self.whiten_rewards:
            rewards = batch.masked(masked_whiten(rewards, mask, shift_mean=False))
        old_values = batch.masked(stop_gradient(batch.old_values))
        adv, returns = gae(rewards, old_values, batch.length, self.gamma, self.lam)
        if self.whiten_advantages:
            adv = xp.where(mask, masked_whiten(adv, mask), xp.zeros_like(adv))
        return adv, returns, kl

    def __call__(self, batch: RLBatch, targets: Targets | None = None) -> tuple[Array, Diagnostics]:
        """Loss and detached diagnostics of one micro-batch (no grad_accum scaling applied).

        Needs ``values`` (with gradients) and ``old_values``; ``ref_log_probs`` when kl_coef != 0;
        ``entropy`` when entropy_coef != 0. ``targets``: the (advantages, returns, kl) of these
        rows, computed once over a larger rollout by ``advantages`` (each [B, T+1], kl None
        without a reference); None computes them from ``batch``.
        """
        xp = batch.xp
        if batch.values is None or batch.old_values is None:
            raise ValueError("PPO needs values and old_values (a value head)")
        if self.kl_coef != 0.0 and batch.ref_log_probs is None:
            raise ValueError("PPO with kl_coef != 0 needs ref_log_probs (the reference model)")
        if self.entropy_coef != 0.0 and batch.entropy is None:
            raise ValueError("PPO with entropy_coef != 0 needs the per-state entropy")
        mask = batch.action_mask
        adv, returns, kl = self.advantages(batch) if targets is None else targets
        for name, arr in zip(("advantages", "returns"), (adv, returns), strict=True):
            if tuple(arr.shape) != tuple(batch.log_probs.shape):
                raise ValueError(
                    f"targets: {name} has shape {tuple(arr.shape)}, the batch "
                    f"{tuple(batch.log_probs.shape)}"
                )
        adv, returns = batch.masked(stop_gradient(adv)), batch.masked(stop_gradient(returns))

        values = batch.masked(batch.values)
        old_values = batch.masked(stop_gradient(batch.old_values))
        values_clipped = xp.minimum(
            xp.maximum(values, old_values - self.cliprange_value),
            old_values + self.cliprange_value,
        )
        vf_losses1 = (values - returns) ** 2
        vf_losses2 = (values_clipped - returns) ** 2
        vf_loss = 0.5 * masked_mean(xp.maximum(vf_losses1, vf_losses2), mask)

        log_probs = batch.masked(batch.log_probs)
        log_ratio = log_probs - batch.masked(stop_gradient(batch.old_log_probs))
        ratio = xp.exp(log_ratio)
        pg_losses = -adv * ratio
        pg_losses2 = -adv * xp.clip(ratio, 1.0 - self.cliprange, 1.0 + self.cliprange)
        pg_loss = masked_mean(xp.maximum(pg_losses, pg_losses2), mask)
        loss = pg_loss + self.vf_coef * vf_loss

        entropy_mean = None
        if batch.entropy is not None:
            entropy_mean = masked_mean(batch.entropy, mask)
            if self.entropy_coef != 0.0:
                loss = loss - self.entropy_coef * entropy_mean

        dtype = log_probs.dtype
        nan = float("nan")
        stats = {
            "loss": loss,
            "policy_loss": pg_loss,
            "value_loss": vf_loss,
            "clip_frac": masked_mean(xp.astype(pg_losses2 > pg_losses, dtype), mask),
            "value_clip_frac": masked_mean(xp.astype(vf_losses2 > vf_losses1, dtype), mask),
            "approx_kl": 0.5 * masked_mean(log_ratio**2, mask),
            "ratio_mean": masked_mean(ratio, mask),
            "advantage_mean": masked_mean(adv, mask),
            "return_mean": masked_mean(returns, mask),
            "value_mean": masked_mean(values, mask),
            "reward_mean": xp.mean(stop_gradient(batch.rewards)),
            "sampled_neg_log_prob": masked_mean(-log_probs, mask),
        }
        out = {k: float(stop_gradient(v)) for k, v in stats.items()}
        # TRL's objective/kl: the per-sequence sum of the per-action KL, averaged over sequences
        out["kl"] = nan if kl is None else float(xp.mean(xp.sum(kl, axis=1)))
        out["entropy"] = nan if entropy_mean is None else float(stop_gradient(entropy_mean))
        return loss, out
