"""GRPO (``--loss grpo``), as TRL's: one optimizer step per logged step over one generation batch
(the step's batch_size x grad_accum rows): advantages over all its rows (every process's:
``scale_rewards = "batch"`` divides by their std), dapo/cispo normalised by all its actions, the
loss accumulated over micro-batches of batch_size rows (app.training.rl_step). The advantages are
the objective's (``GRPO.advantages``): GRPO's group normalisation, or a subclass's (Pass@k's,
UCPO's, which also reads each row's sequence log-prob)."""

from __future__ import annotations

import time
from typing import Any

import torch

from raptb.app.training.algorithm import Loop
from raptb.app.training.algorithms.rl_rollout import (
    OnPolicyRows,
    RLAlgorithm,
    RLStats,
    rl_record,
)
from raptb.app.training.rl_step import rl_loss_step, score_actions
from raptb.app.training.step import LossResult, Trajectories
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
        sequences = self._sequence_log_probs(rollout)
        # one gather: every process's rewards (rank order = row order), action count, and the
        # rows' sequence log-probs and action counts when the advantages read them
        shared = loop.dist.all_gather_object((terminal.tolist(), actions, sequences))
        everyone = torch.tensor([r for rank, _, _ in shared for r in rank], dtype=terminal.dtype)
        if sequences is None:
            adv, std = objective.advantages(everyone)
        else:
            seq = torch.tensor([v for _, _, s in shared for v in s[0]], dtype=terminal.dtype)
            lens = torch.tensor([v for _, _, s in shared for v in s[1]])
            adv, std = objective.advantages(everyone, seq, lens)
        own = slice(loop.dist.rank * len(terminal), (loop.dist.rank + 1) * len(terminal))
        adv, std = adv[own].to(terminal.device), std[own].to(terminal.device)
        num_items = sum(count for _, count, _ in shared) / loop.dist.world_size
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

    def _sequence_log_probs(self, rollout: OnPolicyRows) -> tuple[list[float], list[int]] | None:
        """Each row's sequence log-prob (sum over its tau + 1 actions at the rollout's
        temperature, no gradient) and action count, when the objective's advantages read them
        (``reads_sequence_log_probs``: one extra teacher-forced pass); else None."""
        if not self.objective.reads_sequence_log_probs:
            return None
        policy, log_probs, lengths = self.loop.policy, [], []
        with torch.no_grad():
            for piece in rollout.pieces:
                actions, _ = score_actions(
                    policy, piece.prompt, piece.tokens, piece.length, None, piece.temperature
                )
                log_probs += actions.sum(dim=1).tolist()
                lengths += (piece.length + 1).tolist()
        return log_probs, lengths
