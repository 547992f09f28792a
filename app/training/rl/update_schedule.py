"""The update schedule PPO and ROVER share (TRL's ``num_ppo_epochs`` x ``num_mini_batches``): the
check that a process's rows split into the mini-batches, the rollout counted over processes, the
passes of shuffled mini-batches with one optimizer step each, and the step's record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from raptb.app.training.algorithm import Loop
from raptb.app.training.micro_batch import MicroBatchTotals, combine_micro_batch
from raptb.app.training.rl.ppo_update import mini_batches
from raptb.app.training.rl.rollout import OnPolicyRows, RLStats, rl_record
from raptb.app.training.step import LossResult
from raptb.app.training.training_error import TrainingError


def check_mini_batches(loop: Loop) -> None:
    """A TrainingError when a process's rows per step do not split into rl.num_mini_batches."""
    cfg = loop.cfg
    rows = cfg.optim.grad_accum * loop.rank_batch
    if rows % cfg.rl.num_mini_batches:
        raise TrainingError(
            f"each of the {loop.dist.world_size} processes trains on {rows} rows per step "
            f"(grad_accum x its share of batch_size), not a multiple of "
            f"rl.num_mini_batches {cfg.rl.num_mini_batches}: change rl.num_mini_batches, "
            "optim.batch_size, optim.grad_accum or the number of processes"
        )


def mini_batch_updates(
    loop: Loop, rows: int, loss: Callable[[np.ndarray], LossResult | None]
) -> list[LossResult] | None:
    """rl.num_ppo_epochs passes over ``rows`` rows, each a fresh permutation (``loop.rng``) cut
    into rl.num_mini_batches mini-batches: ``loss(mini_batch)`` backpropagates one, then one
    optimizer step. None, with the gradients dropped, when a loss is None (the optimizer steps
    already taken stay)."""
    cfg = loop.cfg
    passes: list[LossResult] = []
    for _ in range(cfg.rl.num_ppo_epochs):
        for mini_batch in mini_batches(loop.rng, rows, cfg.rl.num_mini_batches):
            loop.optimizer.zero_grad(set_to_none=True)
            result = loss(mini_batch)
            if result is None:
                loop.optimizer.zero_grad(set_to_none=True)
                return None
            loop.apply_gradients()
            passes.append(result)
    return passes


def mean_result(passes: list[LossResult]) -> LossResult:
    """The loss and each diagnostic averaged over the update's mini-batches."""
    return LossResult(
        float(np.mean([p.loss for p in passes])),
        {k: float(np.mean([p.diagnostics[k] for p in passes])) for k in passes[0].diagnostics},
    )


def counted_rollout(loop: Loop, rollout: OnPolicyRows) -> MicroBatchTotals:
    """The step's rollout over all processes (what the record and unique_correct count); its
    successful texts are entered as seen."""
    seen = combine_micro_batch(
        loop.dist, LossResult(0.0, {}), rollout.correct, rollout.on_policy, rewards=rollout.rewards
    )
    loop.correct_seen.update(seen.correct)
    return seen


def update_record(
    loop: Loop, seen: MicroBatchTotals, passes: list[LossResult], seconds: float, updates: str
) -> dict[str, Any]:
    """The step's record: the rollout's reward and acc, the loss and diagnostics averaged over
    the update's mini-batches and the processes, and the number of optimizer steps (``updates``)."""
    losses = combine_micro_batch(loop.dist, mean_result(passes), [], 0)
    stats = RLStats(
        losses.loss, losses.diagnostics, seen.on_policy, len(seen.correct), seen.rewards
    )
    record = rl_record(loop, [stats], [stats], seconds)
    record[updates] = len(passes)
    return record
