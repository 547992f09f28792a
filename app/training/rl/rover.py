"""ROVER (``--loss rover``, core.rl.rover) on PPO's update schedule: one logged step rolls out the
step's rows, fixes what the targets compare against (the old action log-probs and the old mean
log-prob over each state's actions, micro-batch by micro-batch, without gradient; the group-
centred rewards), then ``rl.num_ppo_epochs`` passes of ``rl.num_mini_batches`` shuffled
mini-batches take one optimizer step each (app.training.rl.ppo_update's ``mini_batches``), as the
authors' trainer takes several mini-batch updates per rollout (their Countdown run: one epoch of
four). Each mini-batch's rows are scored one part (a micro-batch's rows of one prompt) at a time;
each part's loss (a masked mean over its actions) is weighted by its share of the mini-batch's
rows. Dropout is off in the policy, so the first optimizer step sees Q = 0 exactly.

The actions a state's mean runs over are ``rl.rover_action_set``'s: "tree", the children of the
state in the prefix tree (adapters.lm.tree_actions, fixed once per rollout), or "vocabulary", the
model's whole vocabulary (the authors')."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raptb.adapters.lm.tree_actions import (
    sub_vocabulary_log_probs,
    tree_action_mask,
    vocabulary_mean_log_prob,
)
from raptb.app.training.algorithm import Loop
from raptb.app.training.rl.ppo_update import disable_dropout
from raptb.app.training.rl.rl_step import all_finite
from raptb.app.training.rl.rollout import RLAlgorithm
from raptb.app.training.rl.update_schedule import (
    check_mini_batches,
    counted_rollout,
    mini_batch_updates,
    update_record,
)
from raptb.app.training.step import LossResult, Trajectories, agreed_finite
from raptb.core.rl.batch import RLBatch, action_log_probs
from raptb.core.rl.rover import ROVER, mean_over_actions, rover_rewards


@dataclass(frozen=True)
class ROVERPart:
    """One part of the rollout (rows of one prompt in one micro-batch) and what stays fixed."""

    batch: Trajectories
    terminal: torch.Tensor
    """[b] terminal rewards."""
    centred: torch.Tensor
    """[b] group-centred rewards r~."""
    old_log_probs: torch.Tensor
    """[b, A] action log-probs at rollout time."""
    old_state_means: torch.Tensor
    """[b, A] mean log-prob over each state's actions at rollout time."""
    actions: torch.Tensor | None
    """[b, A, L + 1] the tree's children of each state ("tree"), or None ("vocabulary")."""

    @property
    def rows(self) -> int:
        return int(self.old_log_probs.shape[0])


class ROVERAlgorithm(RLAlgorithm):
    """Trains with ROVER (app.training.algorithm's shape): no trainable state beside the policy."""

    objective: ROVER

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        check_mini_batches(loop)
        self.objective = loop.cfg.build_objective()
        disable_dropout(loop.policy.model)

    def state_means(
        self, batch: Trajectories, index: torch.Tensor | None, actions: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Action log-probs [b, A] (with gradients) and the mean log-prob over each state's
        actions [b, A] of ``batch``'s rows ``index`` (all when None), one forward pass."""
        policy = self.loop.policy
        tokens, length = batch.tokens, batch.length
        if index is not None:
            tokens, length = tokens[index], length[index]
        temperature = batch.temperature
        if actions is None:
            per_state = vocabulary_mean_log_prob(temperature)
        else:
            per_state = sub_vocabulary_log_probs(policy, temperature)
        log_pf, log_pterm, values = policy.score_with_states(
            batch.prompt, tokens, length, per_state, temperature
        )
        if actions is not None:
            values = mean_over_actions(values, actions.to(values.device))
        return action_log_probs(log_pf, log_pterm, length), values

    @torch.no_grad()
    def fixed_part(
        self, batch: Trajectories, terminal: torch.Tensor, centred: torch.Tensor
    ) -> ROVERPart | None:
        """What the part's targets compare against, from one pass without gradient; None when a
        log-prob is not finite."""
        actions = None
        if self.objective.rover_action_set == "tree":
            task = self.loop.task
            actions = tree_action_mask(
                self.loop.policy, batch.tokens, batch.length, task.min_length, task.max_length
            )
        log_probs, means = self.state_means(batch, None, actions)
        if not all_finite(log_probs, means):
            return None
        return ROVERPart(batch, terminal, centred, log_probs, means, actions)

    def optimizer_step(self) -> dict[str, Any] | None:
        """Roll out, fix the targets' reference quantities, then num_ppo_epochs x
        num_mini_batches optimizer steps. None, every process together, when something is not
        finite (the optimizer steps already taken stay)."""
        loop, objective = self.loop, self.objective
        loop.policy.model.train()
        start = time.perf_counter()
        rollout = self._on_policy_rows()
        seen = counted_rollout(loop, rollout)
        centred = rover_rewards(
            torch.cat(rollout.terminal),
            objective.num_generations,
            objective.norm_adv_by_std_in_grpo,
        )
        fixed, first = [], 0
        for parts in rollout.micro_batches(loop.rank_batch):
            for batch, terminal in parts:
                rows = slice(first, first + len(batch.rows))
                first = rows.stop
                fixed.append(self.fixed_part(batch, terminal, centred[rows]))
        kept = [f for f in fixed if f is not None]
        if loop.dist.any_true(len(kept) < len(fixed)):
            return None
        total = sum(part.rows for part in kept)
        passes = mini_batch_updates(loop, total, lambda rows: self.mini_batch_loss(kept, rows))
        if passes is None:
            return None
        return update_record(loop, seen, passes, time.perf_counter() - start, "rover_updates")

    def mini_batch_loss(self, parts: list[ROVERPart], rows: np.ndarray) -> LossResult | None:
        """Backpropagate the loss of the step's ``rows`` (indices into the parts' rows in order),
        each part's loss weighted by its share of them; None when one is not finite."""
        agree = self.loop.dist.all_true if self.loop.dist.world_size > 1 else None
        loss, start = 0.0, 0
        diagnostics: dict[str, float] = {}
        for part in parts:
            stop = start + part.rows
            own = rows[(rows >= start) & (rows < stop)] - start
            start = stop
            if not len(own):
                continue
            index = torch.as_tensor(own, device=part.batch.tokens.device)
            actions = None if part.actions is None else part.actions[index.cpu()]
            log_probs, means = self.state_means(part.batch, index, actions)
            value: torch.Tensor | None = None
            if all_finite(log_probs, means):
                batch = RLBatch(
                    log_probs=log_probs,
                    old_log_probs=part.old_log_probs[index],
                    rewards=part.terminal[index].to(log_probs.dtype),
                    length=part.batch.length[index],
                )
                value, part_diagnostics = self.objective(
                    batch,
                    state_values=(means - part.old_state_means[index]).detach(),
                    centred_rewards=part.centred[index].to(log_probs.dtype),
                )
            if not agreed_finite(value, agree) or value is None:
                return None
            share = len(own) / len(rows)
            (value * share).backward()
            loss += share * float(value.detach())
            for key, item in part_diagnostics.items():
                diagnostics[key] = diagnostics.get(key, 0.0) + share * item
        return LossResult(loss, diagnostics)
