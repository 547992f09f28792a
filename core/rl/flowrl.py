"""FlowRL, trajectory balance for LLM reasoning (Zhu et al. 2025, "FlowRL: Matching Reward
Distributions for LLM Reasoning", arXiv 2509.15207), ``--loss flowrl``.

FlowRL fits the policy to the distribution proportional to exp(beta r~) pi_ref with a
trajectory-balance residual on length-normalised log-probabilities. Per row b of a group of
``num_generations`` samples of one prompt, with its L_b = tau_b + 1 actions (the stop included,
the response's EOS), A_b the group's GRPO advantage of the task reward (verl's
``compute_grpo_outcome_advantage``: (r - mean) / (Bessel std + 1e-6)) and log Z the learned log
partition function:

    mean_L(x)  = sum_{t <= tau} x_t / (L + 1e-8)                   verl's masked_mean
    delta_b    = log Z + mean_L(log pi) - beta mean_L(A_b) - mean_L(log pi_ref)
    w_b        = stopgrad(min(exp(sum_{t <= tau} (log pi - log pi_old)), 10))
    loss       = mean_b w_b delta_b^2

with beta = ``flowrl_beta_coef`` (15, hard-coded by the authors, "as per paper"). Transcribed from
volcengine/verl ``recipe/flowrl/flowrl_actor.py`` ``FlowRLActor.compute_flowrl`` at commit
f11af2d5358ee808590f11230f9438e9c8f944a5 (the recipe's "pure implementation", kept unchanged in
verl-project/verl-recipe ``flowrl/flowrl_actor.py``), where the reward passed in is the GRPO
advantage (``reward=advantages``, its run script's ``adv_estimator=grpo``). The authors' first
version (Xuekai-Zhu/verl_FlowRL ``compute_flowrl_objective_vanilla``) is the same without the cap
of 10 on w. With one pass per rollout pi_old is pi detached, so w = 1 (verl's ``on_policy``).

log Z: verl's is ``ProjZModule``, a 3-layer MLP of the prompt's mean last hidden state, trained
with the actor. raptb's is one learned scalar (the algorithm's, app.training.rl.flowrl): the tasks'
rows of a step share one prompt or a few, and a scalar is what raptb's GFlowNet objectives learn
(docs/rl-baselines.md says what follows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from array_api_compat import array_namespace

from raptb.core.autograd import stop_gradient
from raptb.core.checks import check_range
from raptb.core.rl.advantages import check_whole_groups, masked_mean
from raptb.core.rl.base import RLObjective
from raptb.core.rl.batch import RLBatch

Array = Any
Diagnostics = dict[str, float]
# the authors' constants: verl's masked_mean denominator offset, its GRPO std offset, and the cap
# of the sequence importance weight
FLOWRL_MEAN_EPS = 1e-8
FLOWRL_STD_EPS = 1e-6
FLOWRL_WEIGHT_CAP = 10.0


def verl_grpo_advantages(rewards: Array, num_generations: int) -> tuple[Array, Array]:
    """verl's GRPO advantages [B] of ``rewards`` [B] (consecutive groups of ``num_generations``):
    (r - mean) / (Bessel std + 1e-6), and the std [B] of each row's group."""
    xp = array_namespace(rewards)
    b, n = int(rewards.shape[0]), num_generations
    check_whole_groups(b, n)
    grouped = xp.reshape(rewards, (b // n, n))
    std = xp.std(grouped, axis=1, correction=1, keepdims=True) * xp.ones_like(grouped)
    adv = (grouped - xp.mean(grouped, axis=1, keepdims=True)) / (std + FLOWRL_STD_EPS)
    return xp.reshape(adv, (b,)), xp.reshape(std, (b,))


@dataclass(frozen=True)
class FlowRL(RLObjective):
    """FlowRL's trajectory-balance loss (the module docstring): ``num_generations`` samples per
    group (>= 2), ``flowrl_beta_coef`` > 0 the weight of the advantage in the log reward."""

    name: ClassVar[str] = "flowrl"
    grouped: ClassVar[bool] = True
    num_generations: int = 8
    flowrl_beta_coef: float = 15.0

    def __post_init__(self) -> None:
        n = self.num_generations
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"num_generations: must be an integer >= 2, got {n!r}")
        check_range("flowrl_beta_coef", self.flowrl_beta_coef, 0.0, math.inf, lo_open=True)

    @property
    def uses_reference(self) -> bool:
        """The residual reads log pi_ref."""
        return True

    def advantages(self, rewards: Array) -> tuple[Array, Array]:
        """verl's GRPO advantages and group std of ``rewards`` [B]."""
        return verl_grpo_advantages(rewards, self.num_generations)

    def __call__(
        self,
        batch: RLBatch,
        *,
        log_z: Array,
        advantages: tuple[Array, Array] | None = None,
    ) -> tuple[Array, Diagnostics]:
        """Loss and detached diagnostics of one micro-batch. ``log_z``: the log partition
        function (a scalar, or one per row [B]); ``advantages``: (A [B], std [B]) of these rows
        over the whole step; None: from this batch's rewards (whole groups)."""
        xp = batch.xp
        if batch.ref_log_probs is None:
            raise ValueError("FlowRL needs ref_log_probs (the reference model)")
        mask = xp.astype(batch.action_mask, batch.log_probs.dtype)
        count = xp.sum(mask, axis=1) + FLOWRL_MEAN_EPS
        if advantages is None:
            adv, std = self.advantages(stop_gradient(batch.rewards))
        else:
            adv, std = (stop_gradient(a) for a in advantages)
        log_probs = batch.masked(batch.log_probs)
        ref = batch.masked(stop_gradient(batch.ref_log_probs))
        avg_log_prob = xp.sum(log_probs * mask, axis=1) / count
        avg_ref_log_prob = xp.sum(ref * mask, axis=1) / count
        seq_log_reward = xp.sum(adv[:, None] * mask, axis=1) / count
        delta = log_z + avg_log_prob - self.flowrl_beta_coef * seq_log_reward - avg_ref_log_prob
        log_w = xp.sum(
            (log_probs - batch.masked(stop_gradient(batch.old_log_probs))) * mask, axis=1
        )
        weight = stop_gradient(xp.minimum(xp.exp(log_w), xp.full_like(log_w, FLOWRL_WEIGHT_CAP)))
        loss = xp.mean(weight * delta**2)
        return loss, {
            "loss": float(stop_gradient(loss)),
            "log_z": float(stop_gradient(xp.mean(log_z * xp.ones_like(delta)))),
            "reward_std": float(xp.mean(std)),
            "advantage_abs_mean": float(xp.mean(xp.abs(adv))),
            "importance_weight": float(xp.mean(weight)),
            "residual_abs_mean": float(stop_gradient(xp.mean(xp.abs(delta)))),
            "kl": float(stop_gradient(masked_mean(log_probs - ref, batch.action_mask))),
            "sampled_neg_log_prob": float(
                stop_gradient(masked_mean(-log_probs, batch.action_mask))
            ),
        }
