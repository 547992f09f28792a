"""The behaviour mix at a training step (replay.md): p_replay, p_oracle and the low-temperature
range [T_lo, T_hi] move linearly from their start to their end over the run's schedule steps;
``low_temp_prob`` and ``oracle_fraction`` are constant."""

from __future__ import annotations

from dataclasses import dataclass

from raptb.app.configuration.config import TrainConfig
from raptb.core.schedules import LinearSchedule


@dataclass(frozen=True)
class Mix:
    """The behaviour mix of one optimizer step (replay.md), its schedules evaluated at the step.

    p_replay: probability that a row is drawn from the buffer (app.training.step_batch: per row).
    low_temp_prob: probability that an on-policy row uses a temperature drawn from
        [temp_lo, temp_hi].
    p_oracle: with ``oracle_fraction``, an on-policy row is replaced by an oracle solution with
        probability p_oracle x oracle_fraction (Oracle replay only).
    """

    p_replay: float
    low_temp_prob: float
    temp_lo: float
    temp_hi: float
    p_oracle: float
    oracle_fraction: float


class MixSchedule:
    """``at(step)``: the :class:`Mix` of step ``step`` of a run configured by
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
