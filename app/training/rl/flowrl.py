"""FlowRL (``--loss flowrl``, core.rl.flowrl), as verl's recipe trains it: one optimizer step per
logged step over the step's on-policy rows (GRPO's schedule, one pass: the importance weight is
1), the advantages verl's GRPO ones over every process's rows, the loss the mean over each
micro-batch's rows weighted by its share of the step (verl's ``loss_scale_factor``), the
reference model read by every step. Its own trainable state is log Z, one scalar (verl's
``ProjZModule`` is a network of the prompt's hidden state; docs/rl-baselines.md), trained with
the policy's optimizer at the policy's learning rate without weight decay, starting at
``optim.log_z_init``, and saved in ``trainer.pt``."""

from __future__ import annotations

import time
from typing import Any

import torch

from raptb.app.training.algorithm import Loop
from raptb.app.training.rl.rl_step import rl_loss_step
from raptb.app.training.rl.rollout import RLAlgorithm, one_pass_record
from raptb.app.training.step import LossResult, Trajectories
from raptb.core.rl.flowrl import FlowRL


class FlowRLAlgorithm(RLAlgorithm):
    """Trains with FlowRL (app.training.algorithm's shape): log Z is its own trainable state."""

    objective: FlowRL

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        self.objective = loop.cfg.build_objective()
        init = torch.tensor(loop.cfg.optim.log_z_init, dtype=torch.float32)
        self.log_z = torch.nn.Parameter(init.to(loop.policy.device))

    def param_groups(self) -> list[dict[str, Any]]:
        # verl trains ProjZModule in the actor's optimizer: the policy's learning rate
        return [{"params": [self.log_z], "lr": self.loop.cfg.optim.lr, "weight_decay": 0.0}]

    def extra_state(self) -> dict[str, Any]:
        return {"log_z": self.log_z.detach().clone()}

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        with torch.no_grad():
            self.log_z.copy_(saved["log_z"])

    def optimizer_step(self) -> dict[str, Any] | None:
        """Roll out the step's rows, take verl's GRPO advantages over all of them, then
        backpropagate the trajectory-balance loss over micro-batches of batch_size rows. None
        when the loss is not finite somewhere."""
        loop, objective = self.loop, self.objective
        loop.policy.model.train()
        loop.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        rollout = self._on_policy_rows()
        terminal = torch.cat(rollout.terminal)
        shared = loop.dist.all_gather_object(terminal.tolist())
        everyone = torch.tensor([r for rank in shared for r in rank], dtype=terminal.dtype)
        adv, std = objective.advantages(everyone)
        own = slice(loop.dist.rank * len(terminal), (loop.dist.rank + 1) * len(terminal))
        adv, std = adv[own].to(terminal.device), std[own].to(terminal.device)
        batches = rollout.micro_batches(loop.rank_batch)
        agree = loop.dist.all_true if loop.dist.sharding else None

        def loss(parts: list[tuple[Trajectories, torch.Tensor]], rows: slice) -> LossResult | None:
            return rl_loss_step(
                loop.policy,
                objective,
                parts,
                1.0 / len(batches),
                agree=agree,
                advantages=(adv[rows], std[rows]),
                log_z=self.log_z,
            )

        record = one_pass_record(loop, rollout, batches, loss, start)
        if record is None:
            return None
        record["log_z"] = float(self.log_z.detach())
        return record
