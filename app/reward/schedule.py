"""The reward's weights at a training step: lambda and the reward temperature, scheduled.

log R_k = (kappa log P_ref(prefix_k + stop) + lambda(t) S(prefix_k)) / T_R(t), so the reward stage
(``app.training.step.reward``) weighs the task scores by ``scale`` = lambda(t) / T_R(t) and the
reference prior by ``kappa`` / T_R(t); u_k = scale S(prefix_k) stays the task-only part that RapTB
absorbs. lambda and T_R move linearly from their start to their end over the run's schedule steps
(the paper's CommonGen release: lambda 5 -> 50, T_R 1.5 -> 1); with both constant the weights are
(kappa, lambda) at every step, exactly the unscheduled reward.
"""

from __future__ import annotations

from dataclasses import dataclass

from raptb.app.configuration.sections import RewardConfig
from raptb.core.schedules import LinearSchedule


@dataclass(frozen=True)
class RewardWeights:
    """kappa: weight of log P_ref; scale: weight of S (both already divided by T_R); rescore:
    whether replayed rows are scored again rather than reusing their stored u."""

    kappa: float
    scale: float
    rescore: bool


class RewardSchedule:
    """``at(step)``: the :class:`RewardWeights` of step ``step`` of a run configured by
    ``config`` whose schedules run over ``horizon`` optimizer steps."""

    def __init__(self, config: RewardConfig, horizon: int) -> None:
        self.kappa = config.kappa
        self.scale = LinearSchedule(
            config.reward_scale, _end(config.reward_scale, config.reward_scale_end), horizon
        )
        self.temperature = LinearSchedule(
            config.temperature, _end(config.temperature, config.temperature_end), horizon
        )
        self.scheduled = any(s.start != s.end for s in (self.scale, self.temperature))
        rescore = config.rescore_replay
        self.rescore = self.scheduled if rescore is None else rescore

    def at(self, step: int) -> RewardWeights:
        temperature = self.temperature(step)  # x / 1.0 == x exactly: T_R = 1 changes nothing
        return RewardWeights(
            kappa=self.kappa / temperature,
            scale=self.scale(step) / temperature,
            rescore=self.rescore,
        )


def _end(start: float, end: float | None) -> float:
    return start if end is None else end
