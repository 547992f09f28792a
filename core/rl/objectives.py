"""Registry of the reward-maximising RL baselines, mirroring
``core.gfn.objectives.objective_by_name``.

``rl_objective_by_name("grpo" | "ppo", **hyperparameters)`` builds the loss; calling it on a
``core.rl.batch.RLBatch`` returns ``(loss, diagnostics)`` with detached float diagnostics. Names
and defaults are TRL's (``core.rl.grpo``, ``core.rl.ppo``); what each declares to the run is
``core.rl.base.RLObjective``'s.
"""

from __future__ import annotations

from typing import Any

from raptb.core.by_name import build_by_name, hyperparameter_names
from raptb.core.registry import Registry
from raptb.core.rl.base import RLObjective
from raptb.core.rl.grpo import GRPO
from raptb.core.rl.ppo import PPO

__all__ = ["RL_OBJECTIVES", "RLObjective", "rl_objective_by_name", "rl_objective_hyperparameters"]

RL_OBJECTIVES: Registry[type[RLObjective]] = Registry(
    "RL objective", lambda cls: getattr(cls, "name", None), (GRPO, PPO)
)


def rl_objective_hyperparameters(name: str) -> tuple[str, ...]:
    """Names of the hyperparameters RL objective ``name`` accepts."""
    return hyperparameter_names(RL_OBJECTIVES, name)


def rl_objective_by_name(name: str, **hyperparameters: Any) -> RLObjective:
    """Build RL objective ``name`` (grpo, ppo) with TRL-named hyperparameters.

    Hyperparameters not taken by that objective raise a ValueError listing the valid ones; values
    out of range raise a ValueError naming the hyperparameter.
    """
    return build_by_name(RL_OBJECTIVES, name, hyperparameters)
