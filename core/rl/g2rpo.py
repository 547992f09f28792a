"""G²RPO, Geometric GRPO (Rad, Filom, Keivan, Mohajerin Esfahani and Kamalinejad, ICML 2026,
"G²RPO: Geometric GRPO; Escaping LLM's Reasoning Rut to Break Accuracy-Entropy Trade-off",
https://icml.cc/virtual/2026/poster/61763), ``--loss g2rpo``: GRPO whose correct samples get an
advantage bonus inversely proportional to the probability of their mode.

raptb's reading of the method: the paper's formula is not public (2026-11-28: the abstract only,
no code), so the bonus below is written from the abstract's description ("adding granularity
bonuses inversely proportional to mode probabilities" at the advantage level) and is not
transcribed from the authors. On a task whose texts are their own modes (Expr24: each correct
expression), the mode's probability is the policy's probability of the sample. Per group of n
samples of one prompt with rewards r and sequence log-probs log pi_old(y_i) (the sum over its
actions, the stop included, under the rollout policy):

    A_i  = GRPO's advantage of r_i (core.rl.grpo, ``scale_rewards`` as GRPO's)
    b_i  = lambda min(1 / (n pi_old(y_i)), c)    for a correct row (r_i > 0), else 0
    A_i <- A_i + b_i

with lambda = ``g2rpo_lambda`` and the cap c = ``g2rpo_cap``. The geometric reading: without the
cap, the bonus's expected policy-gradient term over a group is

    E[sum_i b_i grad log pi(y_i)] = n sum_y pi(y) lambda / (n pi(y)) grad log pi(y)
                                  = lambda sum_{y in Y*} grad log pi(y),

the same push on every correct mode whatever its probability (GRPO's own term pushes each in
proportion to its probability: the winner-take-all field the paper names), the gradient of
lambda |Y*| times minus the cross-entropy of the uniform distribution over Y* to pi. The cap
bounds the variance that 1 / pi brings when a rare mode is drawn (the abstract's "side effects
can be mitigated"); a mode with pi_old(y) >= 1 / (n c) gets less than the cap, the most likely
ones the least. The defaults, lambda 0.1 and c = 1000, are the screen's (studies/
diversity_zoo_screen.toml, Expr24, two seeds): with c = 10 the bonus is the same lambda c for
nearly every correct text of the embedded model (pi_old(y) < 1 / (8 x 10)), a flat reward, and
every run collapsed onto one solution at lambda 0.1 and 0.5; with c = 1000 it tells the rare
texts from the common ones and the runs kept hundreds. When the paper's formula is published, a
test against it replaces the hand-computed ones (tests/core/test_g2rpo.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from array_api_compat import array_namespace

from raptb.core.checks import check_range
from raptb.core.gfn.mode_bonus import mode_bonus_weights
from raptb.core.rl.grpo import GRPO

Array = Any


def g2rpo_bonus(
    rewards: Array, sequence_log_probs: Array, num_generations: int, weight: float, cap: float
) -> Array:
    """The bonus b [B] of each row: ``weight`` min(1 / (n pi_old(y)), ``cap``) where the reward is
    > 0, else 0 (the module docstring); computed in log space, exp(min(-log n - log pi, log c))."""
    xp = array_namespace(rewards)
    n = xp.full_like(sequence_log_probs, num_generations)
    return weight * mode_bonus_weights(sequence_log_probs, rewards > 0, n, cap)


@dataclass(frozen=True)
class G2RPO(GRPO):
    """GRPO plus G²RPO's bonus on the correct rows, inversely proportional to their probability
    (``g2rpo_lambda`` >= 0, the bonus's weight: 0 is GRPO; ``g2rpo_cap`` > 0, its bound before the
    weight). raptb's reading of the abstract (the module docstring); GRPO's other fields are its
    loss's (TRL's)."""

    name: ClassVar[str] = "g2rpo"
    reads_sequence_log_probs: ClassVar[bool] = True
    g2rpo_lambda: float = 0.1
    g2rpo_cap: float = 1000.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("g2rpo_lambda", self.g2rpo_lambda, 0.0, math.inf)
        check_range("g2rpo_cap", self.g2rpo_cap, 0.0, math.inf, lo_open=True)

    def advantages(
        self, rewards: Array, sequence_log_probs: Array | None = None, lengths: Array | None = None
    ) -> tuple[Array, Array]:
        """GRPO's advantages plus the bonus, and GRPO's std; needs ``sequence_log_probs``."""
        if sequence_log_probs is None:
            raise ValueError("G2RPO needs the rows' sequence log-probs")
        adv, std = super().advantages(rewards)
        bonus = g2rpo_bonus(
            rewards, sequence_log_probs, self.num_generations, self.g2rpo_lambda, self.g2rpo_cap
        )
        return adv + bonus, std
