"""ROVER, Random Policy Valuation for Diverse Reasoning (He et al. 2025, "Random Policy Valuation
is Enough for LLM Reasoning with Verifiable Rewards", https://arxiv.org/abs/2509.24981),
``--loss rover``.

On a tree-shaped deterministic MDP with a binary terminal reward, the Q-values of the *uniform*
random policy rank the actions well enough that a softmax over them is a good (and diverse)
policy. ROVER parametrises Q by the policy itself, Q(s, a) = log pi(a|s) - log pi_old(a|s), and
regresses it onto the uniform policy's Bellman target. Per row b of a group of num_generations
and action column t <= tau (the action layout of ``core.rl.batch``: the stop is an action):

    Q_t      = log pi(a_t | s_t) - log pi_old(a_t | s_t)
    V_t      = mean_{a in A(s_t)} [log pi(a | s_t) - log pi_old(a | s_t)]     (``state_values``)
    r~_b     = r_b - mean_group(r)       (/ (std_group(r) + 1e-6) with norm_adv_by_std_in_grpo)
    target_t = r~_b + stopgrad(V_{t+1})  for t < tau;   r~_b at the stop (t = tau: terminal)
    loss     = mean over the micro-batch's actions of (Q_t - target_t)^2

so at the fixed point Q(s, a) = r~ + mean_{a'} Q(s', a'), the uniform policy's Q-values (the
centred reward counted at every action, as the authors' target is). A(s) is the set of actions
averaged over: the authors take the model's whole vocabulary; raptb also offers the children of
s in the prefix tree (the tokens the grammar allows and the stop where it is allowed,
adapters.lm.tree_actions), the actions of the uniform policy on the tree (docs/rl-baselines.md).
Transcribed from the authors' Countdown code (tinnerhrhe/ROVER, commit b0fa587:
``Countdown/verl/trainer/ppo/core_algos.py`` ``compute_rover_reward`` and
``compute_rover_loss``, ``Countdown/verl/workers/actor/dp_actor.py``
``DataParallelROVERActor.update_policy``). With pi_old = pi (the first optimizer step of a
rollout) Q = 0 and V = 0 in value, and the gradient is -2 r~ grad log pi: the targets matter from
the second optimizer step of a rollout on, which is why the algorithm takes several
(``rl.num_mini_batches``, PPO's schedule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from array_api_compat import array_namespace, device

from raptb.core.autograd import stop_gradient
from raptb.core.rl.advantages import masked_mean
from raptb.core.rl.base import RLObjective
from raptb.core.rl.batch import RLBatch

Array = Any
Diagnostics = dict[str, float]
ActionSet = Literal["tree", "vocabulary"]
ACTION_SETS: tuple[str, ...] = ("tree", "vocabulary")
# the authors' constant added to the group std when rewards are scaled
ROVER_STD_EPS = 1e-6


def mean_over_actions(log_probs: Array, allowed: Array) -> Array:
    """Mean [B, A] over the allowed actions of ``log_probs`` [B, A, K] (``allowed`` bool, same
    shape); 0 where no action is allowed (the states after a row's stop)."""
    xp = array_namespace(log_probs, allowed)
    weights = xp.astype(allowed, log_probs.dtype)
    count = xp.sum(weights, axis=2)
    total = xp.sum(xp.where(allowed, log_probs, xp.zeros_like(log_probs)), axis=2)
    return total / xp.maximum(count, xp.ones_like(count))


def rover_rewards(rewards: Array, num_generations: int, scale: bool = False) -> Array:
    """r~ [B]: each reward minus its group's mean (divided by the group's Bessel std + 1e-6 when
    ``scale``), groups of ``num_generations`` consecutive rows."""
    xp = array_namespace(rewards)
    b = int(rewards.shape[0])
    if b % num_generations:
        raise ValueError(
            f"num_generations: the batch of {b} rows must hold whole groups of "
            f"num_generations = {num_generations} samples"
        )
    grouped = xp.reshape(rewards, (b // num_generations, num_generations))
    centred = grouped - xp.mean(grouped, axis=1, keepdims=True)
    if scale:
        centred = centred / (xp.std(grouped, axis=1, correction=1, keepdims=True) + ROVER_STD_EPS)
    return xp.reshape(centred, (b,))


def next_state_values(state_values: Array, length: Array) -> Array:
    """[B, A]: column t < tau holds ``state_values`` at t + 1, the stop's column (and after) 0."""
    xp = array_namespace(state_values, length)
    shifted = xp.concat([state_values[:, 1:], xp.zeros_like(state_values[:, :1])], axis=1)
    cols = xp.arange(int(state_values.shape[1]), device=device(length))[None, :]
    return xp.where(cols < length[:, None], shifted, xp.zeros_like(shifted))


@dataclass(frozen=True)
class ROVER(RLObjective):
    """ROVER's regression of the policy's Q-values onto the uniform policy's (module docstring).

    ``num_generations``: rows per group (the rewards are centred per group);
    ``norm_adv_by_std_in_grpo``: also divide by the group's std (the authors' switch, off);
    ``rover_action_set``: the actions the uniform policy averages over, "tree" (the prefix
    tree's children) or "vocabulary" (the authors')."""

    name: ClassVar[str] = "rover"
    grouped: ClassVar[bool] = True
    num_generations: int = 8
    norm_adv_by_std_in_grpo: bool = False
    rover_action_set: ActionSet = "tree"

    def __post_init__(self) -> None:
        n = self.num_generations
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"num_generations: must be an integer >= 2, got {n!r}")
        if self.rover_action_set not in ACTION_SETS:
            raise ValueError(
                f"rover_action_set: must be one of {ACTION_SETS}, got {self.rover_action_set!r}"
            )

    def __call__(
        self,
        batch: RLBatch,
        *,
        state_values: Array,
        centred_rewards: Array | None = None,
    ) -> tuple[Array, Diagnostics]:
        """Loss and detached diagnostics of one micro-batch.

        ``state_values`` [B, A]: V_k at each state k, the mean over A(s_k) of log pi - log pi_old
        (no gradient is taken through it); ``centred_rewards`` [B]: r~ of these rows over their
        whole groups, or None to centre this batch's rewards (it must then hold whole groups).
        """
        xp = batch.xp
        mask = xp.astype(batch.action_mask, batch.log_probs.dtype)
        if centred_rewards is None:
            centred = rover_rewards(
                stop_gradient(batch.rewards), self.num_generations, self.norm_adv_by_std_in_grpo
            )
        else:
            centred = stop_gradient(centred_rewards)
        q = batch.masked(batch.log_probs) - batch.masked(stop_gradient(batch.old_log_probs))
        next_v = next_state_values(stop_gradient(state_values), batch.length)
        target = centred[:, None] + next_v
        loss = masked_mean((q - target) ** 2, batch.action_mask)
        return loss, {
            "loss": float(stop_gradient(loss)),
            "reward_mean": float(xp.mean(batch.rewards)),
            "advantage_abs_mean": float(xp.mean(xp.abs(centred))),
            "q_mean": float(stop_gradient(masked_mean(q, batch.action_mask))),
            "target_mean": float(masked_mean(target, batch.action_mask)),
            "next_q_mean": float(masked_mean(next_v, batch.action_mask)),
            "sampled_neg_log_prob": float(
                stop_gradient(xp.sum(-batch.masked(batch.log_probs) * mask) / xp.sum(mask))
            ),
        }
