"""The GFlowNet step's row plan: which of a step's rows are drawn from the replay buffer, spliced
in from the oracle, or sampled by the policy and at which temperature (app.training.step_batch's
module docstring states the rule; the shared step layer lays out and rolls out whatever plan it
is given)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raptb.app.training.gflownet.mix_schedule import Mix
from raptb.app.training.step_batch import ORACLE, REPLAYED, SAMPLED, RowPlan
from raptb.core.replay import ReplayBuffer, ReplayItem


def plan_rows(
    prompts: Sequence[str],
    mix: Mix,
    *,
    buffer: ReplayBuffer | None,
    oracle: ReplayBuffer | None,
    rng: np.random.Generator,
) -> RowPlan:
    """Each row's behaviour and its buffer or oracle item (see the module docstring); ``rng``
    (shared by all processes) draws every choice, in this order."""
    n = len(prompts)
    u_replay, u_temp, u_oracle = rng.random(n), rng.random(n), rng.random(n)
    drawn_temp = rng.uniform(mix.temp_lo, mix.temp_hi, n)
    replayed = _holds(buffer, prompts) & (u_replay < mix.p_replay)
    spliced = _holds(oracle, prompts) & ~replayed & (u_oracle < mix.p_oracle * mix.oracle_fraction)
    kind = np.full(n, SAMPLED, dtype=np.int8)
    kind[spliced], kind[replayed] = ORACLE, REPLAYED
    temperature = np.where(u_temp < mix.low_temp_prob, drawn_temp, 1.0)
    temperature[kind != SAMPLED] = 1.0
    items: dict[int, ReplayItem] = {}
    for source, which in ((buffer, REPLAYED), (oracle, ORACLE)):
        for prompt in dict.fromkeys(prompts):
            rows = [r for r in range(n) if kind[r] == which and prompts[r] == prompt]
            if rows and source is not None:
                items.update(zip(rows, source.sample(len(rows), rng, prompt), strict=True))
    return RowPlan(tuple(prompts), kind, temperature, items)


def _holds(buffer: ReplayBuffer | None, prompts: Sequence[str]) -> np.ndarray:
    """bool [R]: whether ``buffer`` holds items for each row's prompt (False without a buffer)."""
    stored = set() if buffer is None else set(buffer.prompts())
    return np.array([p in stored for p in prompts], dtype=bool)
