"""IPS-GRPO, inverse probability scaling inside GRPO (Sinha, Elango and Liu 2026, "Expected Return
Causes Outcome-Level Mode Collapse in Reinforcement Learning and How to Fix It with Inverse
Probability Scaling", arXiv 2601.21669, PMLR v306), ``--loss ips_grpo``.

The paper's diagnosis: under the expected return E_{x ~ p}[r(x)] the update of an outcome's logit
carries the probability multiplier p(x) (Sec. 3, Eq. (2): dz_x/dt = p_x a_x), so the log-ratio of
two outcomes grows linearly in their reward difference and the policy collapses onto a few
outcomes. Its correction scales each terminal reward by the inverse of its outcome's probability,
r~(x) = r(x) / p(x), whose flow (Sec. 4, Eq. (5): dz_x/dt = r_x - p_x sum_k r_k) has the
reward-proportional fixed point p(x) = r(x) / sum_k r(k). IPS-GRPO (Sec. 4, Algorithm 1) estimates
p(x) inside each group of G samples of a prompt by the outcome's share of the group, clipped from
below at epsilon (Eq. (9)), and runs a standard GRPO update on the scaled rewards (Algorithm 1,
line 6: "all other terms and steps remain unchanged"). Per group with rewards r_i and terminal
outcomes x_i:

    n_i  = #{j in group : x_j = x_i}                 the outcome's count in the group
    p^_i = max(n_i / G, epsilon)                      Eq. (9)
    r~_i = r_i / p^_i
    A_i  = GRPO's advantage of r~ (core.rl.grpo: group mean, TRL's std + 1e-4, ``scale_rewards``)

An outcome is the terminal object the reward judges; on raptb's tasks that is the row's finished
text, so x_i is the row's token sequence (two rows of one group with the same tokens are the same
outcome). Since n_i >= 1 for every sampled outcome, epsilon binds only when epsilon > 1 / G: the
default (``ips_epsilon`` 0.01) leaves p^ = n / G untouched for groups of up to 100 samples. The
paper's text beyond its abstract was not reachable from where this module was written: the
equation numbers and Algorithm 1's line are those a published review of the paper quotes
(docs/rl-baselines.md says which and what follows from it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from array_api_compat import array_namespace, device

from raptb.core.checks import check_range
from raptb.core.rl.advantages import check_whole_groups, group_advantages
from raptb.core.rl.grpo import GRPO

Array = Any


def inverse_probability_scaled(
    rewards: Array, outcomes: Sequence[Hashable], num_generations: int, epsilon: float
) -> Array:
    """r~ [B]: each reward over its outcome's clipped share of its group, max(n / G, epsilon)
    (``rewards`` [B] in consecutive groups of ``num_generations``; ``outcomes`` one hashable per
    row, equal for rows of one outcome)."""
    xp = array_namespace(rewards)
    b, g = int(rewards.shape[0]), num_generations
    if len(outcomes) != b:
        raise ValueError(f"IPS-GRPO: {len(outcomes)} outcomes for {b} rows")
    check_whole_groups(b, g)
    shares: list[float] = []
    for start in range(0, b, g):
        counts = Counter(outcomes[start : start + g])
        shares += [max(counts[x] / g, epsilon) for x in outcomes[start : start + g]]
    return rewards / xp.asarray(shares, dtype=rewards.dtype, device=device(rewards))


@dataclass(frozen=True)
class IPSGRPO(GRPO):
    """GRPO on inverse-probability-scaled rewards r / max(n / G, ``ips_epsilon``) (the module
    docstring; ``ips_epsilon`` in (0, 1], the paper's clip epsilon of Eq. (9)). GRPO's other
    fields are its loss's (TRL's)."""

    name: ClassVar[str] = "ips_grpo"
    reads_outcomes: ClassVar[bool] = True
    ips_epsilon: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("ips_epsilon", self.ips_epsilon, 0.0, 1.0, lo_open=True)

    def advantages(
        self,
        rewards: Array,
        sequence_log_probs: Array | None = None,
        lengths: Array | None = None,
        outcomes: Sequence[Hashable] | None = None,
    ) -> tuple[Array, Array]:
        """GRPO's advantages and std of the scaled rewards; needs each row's ``outcomes``."""
        if outcomes is None:
            raise ValueError("IPS-GRPO needs each row's outcome (its text)")
        scaled = inverse_probability_scaled(
            rewards, outcomes, self.num_generations, self.ips_epsilon
        )
        return group_advantages(scaled, self.num_generations, self.scale_rewards)
