"""GRPO (``--loss grpo``), as TRL's: one optimizer step per logged step over one generation batch
(the step's batch_size x grad_accum rows): advantages over all its rows (every process's:
``scale_rewards = "batch"`` divides by their std), dapo/cispo normalised by all its actions, the
loss accumulated over micro-batches of batch_size rows (app.training.rl_step)."""

from __future__ import annotations

import time
from typing import Any

import torch

from raptb.app.training.algorithm import Loop
from raptb.app.training.algorithms.rl_rollout import RLAlgorithm, RLStats, rl_record
from raptb.app.training.rl_step import rl_loss_step
from raptb.app.training.step import LossResult, Trajectories
from raptb.core.rl.advantages import group_advantages
from raptb.core.rl.grpo import GRPO


class GRPOAlgorithm(RLAlgorithm):
    """Trains with GRPO (app.training.algorithm's shape): no trainable state beside the policy."""

    objective: GRPO

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        self.objective = loop.cfg.build_objective()

    def optimizer_step(self) -> dict[str, Any] | None:
        """Roll out the step's rows, take the advantages over all of them and normalise
        dapo/cispo by their action count, then backpropagate the loss over micro-batches of
        batch_size rows. None when the loss is not finite somewhere."""
        loop, objective = self.loop, self.objective
        loop.policy.model.train()
        loop.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        rollout = self._on_policy_rows()
        terminal = torch.cat(rollout.terminal)
        actions = int(sum(int(piece.length.sum()) + len(piece.rows) for piece in rollout.pieces))
        # one gather: every process's rewards (rank order = row order) and action count
        shared = loop.dist.all_gather_object((terminal.tolist(), actions))
        everyone = torch.tensor([r for rank, _ in shared for r in rank], dtype=terminal.dtype)
        adv, std = group_advantages(everyone, objective.num_generations, objective.scale_rewards)
        own = slice(loop.dist.rank * len(terminal), (loop.dist.rank + 1) * len(terminal))
        adv, std = adv[own].to(terminal.device), std[own].to(terminal.device)
        num_items = sum(count for _, count in shared) / loop.dist.world_size
        batches = rollout.micro_batches(loop.rank_batch)
        agree = loop.dist.all_true if loop.dist.sharding else None

        def loss(parts: list[tuple[Trajectories, torch.Tensor]], rows: slice) -> LossResult | None:
            return rl_loss_step(
                loop.policy,
                objective,
                parts,
                1.0 / len(batches),  # TRL's: each micro-batch's loss over grad_accum
                agree=agree,
                advantages=(adv[rows], std[rows]),
                num_items_in_batch=num_items,
                grad_accum=len(batches),
            )

        totals = loop.accumulate(
            batches,
            loss,
            correct=rollout.correct,
            on_policy=rollout.on_policy,
            rewards=rollout.rewards,
        )
        if totals is None:
            return None
        stats = RLStats(
            totals.loss, totals.diagnostics, totals.on_policy, len(totals.correct), totals.rewards
        )
        return rl_record(loop, [stats], [stats], time.perf_counter() - start)
