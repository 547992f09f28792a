"""What the RL baselines share (app.training.rl.grpo, app.training.rl.ppo): the
on-policy rollout of a step's rows with the terminal reward each row is judged by, the reference
rule, and the metrics record under TRL's names.

Against the GFlowNet algorithm: the loss is ``core.rl.grpo`` / ``core.rl.ppo`` built from the
``[rl]`` section (TRL's names and defaults); there is no replay (the config only takes replay
'none') and no logZ; rollouts are on-policy at ``rl.temperature`` (``[sampling]`` is not read).
Both roll out a step's batch_size x grad_accum rows at once (app.training.step_batch). The reference
model (adapter disabled, or a frozen copy taken before the first step) is only evaluated when the
KL penalty is on (GRPO beta, PPO kl_coef) or the reward is log R with kappa > 0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raptb.app.training.algorithm import Loop
from raptb.app.training.micro_batch import MicroBatch, MicroBatchLoss
from raptb.app.training.rl.rl_step import sequence_rewards
from raptb.app.training.step import Trajectories, correct_texts, reward
from raptb.app.training.step_batch import collect_step, micro_batches, on_policy_plan
from raptb.core.rl.base import RLObjective


@dataclass(frozen=True)
class OnPolicyRows:
    """The step's rows on this process: pieces of one prompt each (app.training.step_batch), the
    terminal reward [b] of each piece's rows, and the successful on-policy texts (of the rows
    ``discarded`` too)."""

    pieces: tuple[Trajectories, ...]
    terminal: tuple[torch.Tensor, ...]
    correct: list[str]
    # rows sampled then left out of the step (GRPO's dynamic sampling), counted for Acc with
    # their successful texts in ``correct``
    discarded: int = 0

    @property
    def on_policy(self) -> int:
        return sum(len(piece.on_policy) for piece in self.pieces) + self.discarded

    @property
    def rewards(self) -> list[float]:
        return torch.cat(self.terminal).tolist()

    def micro_batches(self, size: int) -> list[list[tuple[Trajectories, torch.Tensor]]]:
        """Consecutive micro-batches of ``size`` rows, each as (piece rows, their terminal)."""
        sizes = [len(piece.rows) for piece in self.pieces]
        return [
            [(self.pieces[i].take(rows), self.terminal[i][rows]) for i, rows in parts]
            for parts in micro_batches(sizes, size)
        ]


@dataclass(frozen=True)
class RLStats:
    """What the record reads of a step's rollout (over all processes) or of a loss pass."""

    loss: float
    diagnostics: dict[str, float]
    on_policy: int
    hits: int
    rewards: list[float]


def on_policy_rows(loop: Loop) -> OnPolicyRows:
    """This process's share of the step's rows (one rollout), their task rewards and the
    terminal reward each row is judged by."""
    cfg = loop.cfg
    own, prompts = loop.step_rows()
    # every row on-policy at rl.temperature (TRL's per-method default), at which
    # app.training.rl.rl_step scores log pi as TRL does: the sampling policy is the trained one up
    # to the grammar mask
    plan = on_policy_plan(prompts, cfg.rl.temperature, loop.rng)
    step = collect_step(loop.policy, loop.task, plan, own, generator=loop.generator)
    return scored_rows(loop, step.pieces)


def scored_rows(loop: Loop, pieces: Sequence[Trajectories]) -> OnPolicyRows:
    """``pieces`` of on-policy rows with the terminal reward each row is judged by and their
    successful texts."""
    cfg = loop.cfg
    weights = loop.reward_schedule.at(loop.step)  # lambda and T_R schedules apply here too
    kappa = weights.kappa if cfg.rl.reward == "log_r" else 0.0
    terminal, correct = [], []
    for piece in pieces:
        rewards = reward(loop.scorer, loop.policy, piece, kappa, weights.scale)
        correct += correct_texts(loop.task, piece, rewards, loop.spec)
        terminal.append(sequence_rewards(rewards, piece.length, cfg.rl.reward))
    return OnPolicyRows(tuple(pieces), tuple(terminal), correct)


class RLAlgorithm:
    """What GRPO and PPO share of app.training.algorithm's shape: the rollout, the reference rule,
    and no logZ, replay buffer or run-state entries (PPO adds its value head)."""

    objective: RLObjective

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def param_groups(self) -> list[dict[str, Any]]:
        return []

    def uses_reference(self) -> bool:
        """The reference is read by the KL penalty (GRPO beta, PPO kl_coef) and by a log R
        reward with kappa > 0, not by the default task reward without KL."""
        cfg = self.loop.cfg
        uses_prior = cfg.rl.reward == "log_r" and cfg.reward.kappa > 0
        return self.objective.uses_reference or uses_prior

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        """Nothing to restore."""

    def run_state(self) -> dict[str, Any]:
        return {}

    def load_run_state(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""

    def _on_policy_rows(self) -> OnPolicyRows:
        return on_policy_rows(self.loop)


def rl_record(
    loop: Loop, rollouts: Sequence[Any], passes: Sequence[Any], seconds: float
) -> dict[str, Any]:
    """reward mean/std and acc over the step's ``rollouts`` (each with on_policy, hits,
    rewards); loss and the loss's diagnostics averaged over the ``passes`` (each with loss,
    diagnostics: GRPO's micro-batches, PPO's mini-batch updates) under TRL's names (kl,
    clip_frac, value_loss, ...; None where undefined)."""
    on_policy = sum(s.on_policy for s in rollouts)
    rewards = np.concatenate([s.rewards for s in rollouts])
    record: dict[str, Any] = {
        "step": loop.step + 1,
        "loss": float(np.mean([s.loss for s in passes])),
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "acc": sum(s.hits for s in rollouts) / on_policy if on_policy else None,
        "unique_correct": len(loop.correct_seen),
    }
    for key in passes[0].diagnostics:
        value = float(np.mean([s.diagnostics[key] for s in passes]))
        name = "reward_group_std" if key == "reward_std" else key
        record.setdefault(name, value if np.isfinite(value) else None)
    record.update(nonfinite_skipped=loop.nonfinite_total, seconds=seconds)
    return record


def one_pass_record(
    loop: Loop,
    rollout: OnPolicyRows,
    batches: Sequence[MicroBatch],
    loss: MicroBatchLoss,
    seconds_from: float,
) -> dict[str, Any] | None:
    """One optimizer step of ``loss`` over ``batches``, the micro-batches of ``rollout`` (the
    loop's ``accumulate``), and its record (``rl_record``, the time since ``seconds_from``); None
    when the loss was not finite somewhere."""
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
    return rl_record(loop, [stats], [stats], time.perf_counter() - seconds_from)
