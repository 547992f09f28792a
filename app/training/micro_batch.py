"""One micro-batch over all ranks: every rank's loss, diagnostics, correct texts, new replay
items and rewards, combined identically on all ranks by one gather (app.distribution.distributed's
``DistContext.all_gather_object``; on one process the gather is the rank's own outcome)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from raptb.adapters.lm.lanes import Lanes, split
from raptb.app.distribution.distributed import DistContext
from raptb.app.training.step import LossResult, Trajectories
from raptb.core.replay import ReplayItem

MicroBatch = Sequence[tuple[Trajectories, Any]]
"""A micro-batch: pieces of rows of one prompt each, with what the algorithm scores them by (the
GFlowNet's Rewards, the RL baselines' terminal rewards)."""
MicroBatchLoss = Callable[[MicroBatch, slice], LossResult | None]
"""An algorithm's loss call on a micro-batch (this rank's rows ``slice`` of the step): backward of
its weighted loss, its LossResult, or None when it is not finite."""


def run_micro_batches(
    batches: Sequence[MicroBatch],
    loss: MicroBatchLoss,
    lanes: Lanes | None = None,
    params: Sequence[torch.Tensor] = (),
) -> list[tuple[int, LossResult]]:
    """Each micro-batch's (rows, LossResult), in order, up to the first whose loss is not finite
    (the ones after it are not run: the step is dropped). With ``lanes`` of more than one,
    contiguous groups of micro-batches run in lanes side by side, their gradients with respect
    to ``params`` summed in lane order (adapters.lm.lanes); a group stops at its own first
    non-finite loss."""
    sizes = [sum(len(batch.rows) for batch, _ in parts) for parts in batches]
    starts = np.cumsum([0, *sizes]).tolist()

    def group(indices: range) -> list[tuple[int, LossResult]]:
        results = []
        for i in indices:
            result = loss(batches[i], slice(starts[i], starts[i + 1]))
            if result is None:
                break
            results.append((sizes[i], result))
        return results

    if lanes is None or lanes.count == 1 or len(batches) < 2:
        return group(range(len(batches)))
    groups = split(len(batches), lanes.count)
    outcomes = lanes.run([partial(group, indices) for indices in groups], gradients=params)
    results = []
    for indices, outcome in zip(groups, outcomes, strict=True):
        results.extend(outcome)
        if len(outcome) < len(indices):
            break
    return results


@dataclass(frozen=True)
class MicroBatchTotals:
    """One micro-batch over all ranks.

    finite: whether the loss was finite on every rank (else every rank skips the step).
    loss, diagnostics: means over ranks (the ranks' shares are equal, so this is the global mean).
    on_policy: on-policy rows summed over ranks; correct: their successful texts, rank order.
    items: the new replay items of every rank, rank order (the one list each rank adds to its
    buffer); rewards: every rank's per-row rewards, rank order.
    """

    finite: bool
    loss: float
    diagnostics: dict[str, float]
    on_policy: int
    correct: list[str]
    items: list[ReplayItem]
    rewards: list[float]


def combine_micro_batch(
    ctx: DistContext,
    result: LossResult | None,
    correct: Sequence[str],
    on_policy: int,
    items: Sequence[ReplayItem] = (),
    rewards: Sequence[float] = (),
) -> MicroBatchTotals:
    """Every rank's micro-batch outcome, combined identically on all ranks (one gather)."""
    ranks = ctx.all_gather_object((result, list(correct), on_policy, list(items), list(rewards)))
    results = [rank[0] for rank in ranks if rank[0] is not None]
    finite = len(results) == len(ranks)
    keys = results[0].diagnostics if finite else {}
    return MicroBatchTotals(
        finite=finite,
        loss=float(np.mean([r.loss for r in results])) if finite else float("nan"),
        diagnostics={k: float(np.mean([r.diagnostics[k] for r in results])) for k in keys},
        on_policy=sum(rank[2] for rank in ranks),
        correct=[text for rank in ranks for text in rank[1]],
        items=[item for rank in ranks for item in rank[3]],
        rewards=[value for rank in ranks for value in rank[4]],
    )


def step_result(results: list[tuple[int, LossResult]]) -> LossResult:
    """A step's loss and diagnostics from its micro-batches' (rows, result): means weighted by
    rows, i.e. over the step's rows for a loss that is a mean over rows."""
    rows = sum(size for size, _ in results)
    keys = results[0][1].diagnostics
    return LossResult(
        sum(size * r.loss for size, r in results) / rows,
        {k: sum(size * r.diagnostics[k] for size, r in results) / rows for k in keys},
    )
