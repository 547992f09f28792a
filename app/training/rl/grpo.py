"""GRPO (``--loss grpo``), as TRL's: one optimizer step per logged step over one generation batch
(the step's batch_size x grad_accum rows): advantages over all its rows (every process's:
``scale_rewards = "batch"`` divides by their std), dapo/cispo normalised by all its actions, the
loss accumulated over micro-batches of batch_size rows (app.training.rl.rl_step). The advantages are
the objective's (``GRPO.advantages``): GRPO's group normalisation, or a subclass's (Pass@k's;
UCPO's and G²RPO's, which also read each row's sequence log-prob; IPS-GRPO's, which reads each
row's outcome). With ``rl.filter_groups`` the groups whose rewards are all equal are refilled
first (DAPO's dynamic sampling, .dynamic_sampling)."""

from __future__ import annotations

import time
from typing import Any

import torch

from raptb.app.training.algorithm import Loop
from raptb.app.training.rl.dynamic_sampling import refill_zero_variance_groups
from raptb.app.training.rl.rl_step import rl_loss_step, score_actions
from raptb.app.training.rl.rollout import (
    OnPolicyRows,
    RLAlgorithm,
    one_pass_record,
)
from raptb.app.training.step import LossResult, Trajectories
from raptb.core.rl.entropy import AdaptiveEntropy
from raptb.core.rl.grpo import GRPO


class GRPOAlgorithm(RLAlgorithm):
    """Trains with GRPO (app.training.algorithm's shape): no trainable state beside the policy."""

    objective: GRPO

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        self.objective = loop.cfg.build_objective()
        objective = self.objective
        if loop.cfg.rl.filter_groups and loop.dist.sharding:
            raise ValueError(
                "rl.filter_groups (dynamic sampling) is not supported with a sharded model: "
                "its extra rollouts differ by process"
            )
        self.entropy_control = (
            AdaptiveEntropy(
                objective.entropy_coef,
                objective.entropy_target,
                objective.entropy_coef_delta,
                objective.entropy_coef_min,
                objective.entropy_coef_max,
            )
            if objective.use_adaptive_entropy
            else None
        )

    def run_state(self) -> dict[str, Any]:
        """The adaptive entropy controller's coefficient and last entropy (TRL saves both)."""
        control = self.entropy_control
        if control is None:
            return {}
        return {"entropy_coef": control.coef, "last_world_entropy": control.last_entropy}

    def load_run_state(self, state: dict[str, Any]) -> None:
        if self.entropy_control is not None and "entropy_coef" in state:
            self.entropy_control.coef = float(state["entropy_coef"])
            self.entropy_control.last_entropy = float(state["last_world_entropy"])

    def optimizer_step(self) -> dict[str, Any] | None:
        """Roll out the step's rows, take the advantages over all of them and normalise
        dapo/cispo by their action count, then backpropagate the loss over micro-batches of
        batch_size rows. None when the loss is not finite somewhere."""
        loop, objective = self.loop, self.objective
        loop.policy.model.train()
        loop.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        rollout = self._on_policy_rows()
        refill = None
        if loop.cfg.rl.filter_groups:
            rollout, refill = refill_zero_variance_groups(
                loop, rollout, objective.num_generations, loop.cfg.rl.max_num_gen_batches
            )
        terminal = torch.cat(rollout.terminal)
        actions = int(sum(int(piece.length.sum()) + len(piece.rows) for piece in rollout.pieces))
        sequences = self._sequence_log_probs(rollout)
        outcomes = self._outcomes(rollout)
        # one gather: every process's rewards (rank order = row order), action count, and the
        # rows' sequence log-probs and action counts, or outcomes, when the advantages read them
        shared = loop.dist.all_gather_object((terminal.tolist(), actions, sequences, outcomes))
        everyone = torch.tensor([r for rank, *_ in shared for r in rank], dtype=terminal.dtype)
        if outcomes is not None:
            everyone_outcomes = [x for *_, rank in shared for x in rank]
            adv, std = objective.advantages(everyone, outcomes=everyone_outcomes)
        elif sequences is None:
            adv, std = objective.advantages(everyone)
        else:
            seq = torch.tensor([v for _, _, s, _ in shared for v in s[0]], dtype=terminal.dtype)
            lens = torch.tensor([v for _, _, s, _ in shared for v in s[1]])
            adv, std = objective.advantages(everyone, seq, lens)
        own = slice(loop.dist.rank * len(terminal), (loop.dist.rank + 1) * len(terminal))
        adv, std = adv[own].to(terminal.device), std[own].to(terminal.device)
        num_items = sum(count for _, count, *_ in shared) / loop.dist.world_size
        batches = rollout.micro_batches(loop.rank_batch)
        agree = loop.dist.all_true if loop.dist.sharding else None
        control = self.entropy_control
        entropy_coef = None if control is None else control.applied
        entropy_sums: list[tuple[float, int]] = []  # per micro-batch: sum of H, actions

        def loss(parts: list[tuple[Trajectories, torch.Tensor]], rows: slice) -> LossResult | None:
            result = rl_loss_step(
                loop.policy,
                objective,
                parts,
                1.0 / len(batches),  # TRL's: each micro-batch's loss over grad_accum
                agree=agree,
                advantages=(adv[rows], std[rows]),
                num_items_in_batch=num_items,
                grad_accum=len(batches),
                entropy_coef=entropy_coef,
            )
            if result is not None and control is not None:
                count = sum(int(batch.length.sum()) + len(batch.rows) for batch, _ in parts)
                entropy_sums.append((result.diagnostics["entropy"] * count, count))
            return result

        record = one_pass_record(loop, rollout, batches, loss, start)
        if record is None:
            return None
        if refill is not None:
            record.update(refill.record(len(terminal) // objective.num_generations))
        if control is not None:
            # the step's entropy over every process's actions, as TRL's controller measures it
            shared_sums = loop.dist.all_gather_object(entropy_sums)
            total = sum(h for rank in shared_sums for h, _ in rank)
            count = sum(n for rank in shared_sums for _, n in rank)
            control.update(total / max(count, 1))
            record["entropy_coef"] = control.coef
        elif objective.uses_entropy:
            record["entropy_coef"] = objective.entropy_coef
        return record

    def _outcomes(self, rollout: OnPolicyRows) -> list[tuple[int, ...]] | None:
        """Each row's outcome, its token sequence (the stop excluded), when the objective's
        advantages read it (``reads_outcomes``: IPS-GRPO's counts); else None."""
        if not self.objective.reads_outcomes:
            return None
        return [row for piece in rollout.pieces for row in piece.rows]

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
