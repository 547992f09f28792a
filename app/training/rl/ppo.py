"""PPO (``--loss ppo``), as TRL's: one logged step is one PPO update
(app.training.rl.ppo_update): the step's rows are fixed micro-batch by micro-batch (old
log-probs, values, advantages), then ``rl.num_ppo_epochs`` x ``rl.num_mini_batches`` optimizer
steps train on them, with dropout off in the policy and the value head. The value head sits on
the policy's last hidden states, is trained at the policy's learning rate without weight decay,
and is saved in ``trainer.pt``."""

from __future__ import annotations

import time
from typing import Any

from raptb.adapters.lm.value_head import ValueHead
from raptb.app.training.algorithm import Loop
from raptb.app.training.rl.ppo_update import (
    PPORollout,
    disable_dropout,
    fixed_rollout,
    mini_batch_loss,
    step_targets,
)
from raptb.app.training.rl.rollout import RLAlgorithm
from raptb.app.training.rl.update_schedule import (
    check_mini_batches,
    counted_rollout,
    mini_batch_updates,
    update_record,
)
from raptb.core.rl.ppo import PPO


class PPOAlgorithm(RLAlgorithm):
    """Trains with PPO (app.training.algorithm's shape): the value head is its own trainable
    state."""

    objective: PPO

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        check_mini_batches(loop)
        self.objective = loop.cfg.build_objective()
        disable_dropout(loop.policy.model)
        hidden_size = int(loop.policy.model.config.hidden_size)
        self.value_head = ValueHead(hidden_size, dropout=0.0).to(loop.policy.device)

    def param_groups(self) -> list[dict[str, Any]]:
        params = list(self.value_head.parameters())
        return [{"params": params, "lr": self.loop.cfg.optim.lr, "weight_decay": 0.0}]

    def extra_state(self) -> dict[str, Any]:
        return {"value_head": self.value_head.state_dict()}

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        self.value_head.load_state_dict(saved["value_head"])

    def optimizer_step(self) -> dict[str, Any] | None:
        """One PPO update (TRL's): roll out the step's micro-batches, fix the old log-probs,
        values and advantages, then num_ppo_epochs passes of num_mini_batches optimizer steps.
        None, with every process skipping together, when a rollout quantity or a loss is not
        finite (the optimizer steps already taken in this update stay)."""
        loop, objective, value_head = self.loop, self.objective, self.value_head
        loop.policy.model.train()
        value_head.train()
        start = time.perf_counter()
        rollout = self._on_policy_rows()
        # the step's rollout over all processes: what the record and unique_correct count
        seen = counted_rollout(loop, rollout)
        reference = objective.uses_reference
        # old log-probs and values micro-batch by micro-batch (memory), a prompt per forward
        fixed = [
            fixed_rollout(loop.policy, value_head, batch, terminal, reference=reference)
            for parts in rollout.micro_batches(loop.rank_batch)
            for batch, terminal in parts
        ]
        kept: list[PPORollout] = [f for f in fixed if f is not None]
        if loop.dist.any_true(len(kept) < len(fixed)):
            return None
        targets = step_targets(objective, kept)
        rows = sum(f.rows for f in kept)
        # optimizer steps follow inside the update: agree before each backward
        agree = loop.dist.all_true if loop.dist.world_size > 1 else None
        passes = mini_batch_updates(
            loop,
            rows,
            lambda mini_batch: mini_batch_loss(
                loop.policy, objective, value_head, kept, targets, mini_batch, agree
            ),
        )
        if passes is None:  # on every process alike: mini_batch_loss agreed on it
            return None
        return update_record(loop, seen, passes, time.perf_counter() - start, "ppo_updates")
