"""DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
https://arxiv.org/abs/2503.14476) as a preset of GRPO, ``--loss dapo``: the objective

    J = E[ 1 / sum_i |o_i| sum_i sum_t min(w_it A_i, clip(w_it, 1 - eps_low, 1 + eps_high) A_i) ]
    subject to 0 < |{o_i : o_i correct}| < G

is GRPO's loss with TRL's ``loss_type = "dapo"`` (the token-level mean over the generation batch),
clip-higher (``epsilon`` 0.2, ``epsilon_high`` 0.28, the paper's) and no KL (``beta`` 0); the
constraint is the dynamic sampling of GRPO's algorithm (``rl.filter_groups``,
app.training.rl.dynamic_sampling). Its loss entry (app.configuration.losses) presets the
clip-higher and the dynamic sampling under the file and the flags. DAPO's overlong reward shaping
is not used: a rollout's length is capped by the task's grammar, never truncated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from raptb.core.rl.grpo import GRPO

# the paper's clip-higher upper range (its lower one is GRPO's epsilon, 0.2)
DAPO_EPSILON_HIGH = 0.28


@dataclass(frozen=True)
class DAPO(GRPO):
    """GRPO with DAPO's clip-higher (GRPO's default loss_type is already TRL's dapo); the
    fields are GRPO's (TRL's names)."""

    name: ClassVar[str] = "dapo"
    epsilon_high: float | None = DAPO_EPSILON_HIGH
