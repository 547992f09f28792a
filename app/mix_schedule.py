"""The behaviour mix at a training step (replay.md): p_replay, p_oracle and the low-temperature
range [T_lo, T_hi] move linearly from their start to their end over the run's schedule steps;
``low_temp_prob`` and ``oracle_fraction`` are constant."""

from __future__ import annotations

from raptb.app.config import TrainConfig
from raptb.app.step import Mix
from raptb.core.schedules import LinearSchedule


class MixSchedule:
    """``at(step)``: the :class:`~raptb.app.step.Mix` of step ``step`` of a run configured by
    ``config`` whose schedules run over ``horizon`` optimizer steps."""

    def __init__(self, config: TrainConfig, horizon: int) -> None:
        self.p_replay = LinearSchedule(*config.replay.p_replay, horizon)
        self.p_oracle = LinearSchedule(*config.replay.p_oracle, horizon)
        self.temp_lo = LinearSchedule(*config.sampling.temp_lo, horizon)
        self.temp_hi = LinearSchedule(*config.sampling.temp_hi, horizon)
        self.low_temp_prob = config.sampling.low_temp_prob
        self.oracle_fraction = config.replay.oracle_fraction

    def at(self, step: int) -> Mix:
        return Mix(
            p_replay=self.p_replay(step),
            low_temp_prob=self.low_temp_prob,
            temp_lo=self.temp_lo(step),
            temp_hi=self.temp_hi(step),
            p_oracle=self.p_oracle(step),
            oracle_fraction=self.oracle_fraction,
        )
