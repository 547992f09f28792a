"""What a training algorithm declares to the neutral loop of app.training.train, and what it may
read of the loop.

The loop (``app.training.train.Trainer``) owns what every run shares: the task and its spec, the
policy, the reward calls and prefix scorer, the reward schedule, the optimizer (the policy's
parameter group first), the step counter, the shared and per-rank RNG streams, the successful
texts seen, checkpoints, the metrics log, stop signals, non-finite handling, and gradient
averaging, clipping and application. An algorithm (``app.training.gflownet.algorithm`` for the
GFlowNet objectives; ``app.training.rl``'s ``grpo``, ``ppo`` and ``rover``) owns its step's work
(its rollout, its loss call on a micro-batch, its record: the loop's ``accumulate`` runs the
micro-batches, combines them over ranks and applies or skips the update), its own trainable
state and its parameter groups (logZ for the GFlowNet, the value head for PPO), the fields of
its metrics record and what it adds to a checkpoint. A new algorithm is one module with a class
of this shape, named by its loss's entry in app.configuration.losses (``Loss.algorithm``, a
plug-in's through the ``raptb.losses`` entry points).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.tasks.registry import TaskSpec
from raptb.app.configuration.config import TrainConfig
from raptb.app.distribution.distributed import DistContext
from raptb.app.reward.prefix import PrefixScorer
from raptb.app.reward.schedule import RewardSchedule
from raptb.app.training.micro_batch import MicroBatch, MicroBatchLoss, MicroBatchTotals
from raptb.core.ports import Task
from raptb.core.replay import ReplayItem


class Loop(Protocol):
    """What an algorithm reads of the loop that runs it (app.training.train.Trainer)."""

    cfg: TrainConfig
    run_dir: Path
    dist: DistContext
    rank_batch: int
    task: Task
    spec: TaskSpec
    policy: HFPolicy
    scorer: PrefixScorer
    reward_schedule: RewardSchedule
    optimizer: torch.optim.Optimizer
    rng: np.random.Generator
    generator: torch.Generator
    step: int
    nonfinite_total: int
    correct_seen: set[str]

    def step_rows(self) -> tuple[range, list[str]]:
        """This rank's share of the step's rows and the prompt of every global row."""
        ...

    def accumulate(
        self,
        batches: Sequence[MicroBatch],
        loss: MicroBatchLoss,
        *,
        correct: Sequence[str],
        on_policy: int,
        items: Sequence[ReplayItem] = (),
        rewards: Sequence[float] = (),
    ) -> MicroBatchTotals | None:
        """One optimizer step over micro-batches: ``loss`` on each, the outcome over ranks, the
        gradients applied (the totals) or dropped (None); see ``Trainer.accumulate``."""
        ...

    def apply_gradients(self) -> None:
        """Average the accumulated gradients over ranks, clip them, take one optimizer step."""
        ...


class Algorithm(Protocol):
    """One training algorithm, built by the loop as ``cls(loop)`` once the policy exists (before
    the optimizer, whose parameter groups it adds to, and before any checkpoint is loaded)."""

    objective: Any
    """Its loss (a core objective), which the run's ``loss`` names."""

    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW parameter groups of its own trainable state, after the policy's group."""
        ...

    def uses_reference(self) -> bool:
        """Whether its training reads the frozen reference model (the loop freezes one)."""
        ...

    def optimizer_step(self) -> dict[str, Any] | None:
        """One logged step: its metrics record (``step`` = the loop's step + 1), or None when
        the loss was not finite on some rank (every rank then skips the step together)."""
        ...

    def extra_state(self) -> dict[str, Any]:
        """Tensors it adds to a checkpoint's ``trainer.pt``."""
        ...

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        """Restore them (``saved``: the whole ``trainer.pt``)."""
        ...

    def run_state(self) -> dict[str, Any]:
        """Entries it adds to a checkpoint's ``state`` (arrays and JSON values)."""
        ...

    def load_run_state(self, state: dict[str, Any]) -> None:
        """Restore them (``state``: the whole ``state``)."""
        ...
