"""The RL baselines' trainer (``--loss grpo`` / ``--loss ppo``): the GFlowNet trainer's loop,
checkpoints and logging around the stages of ``app.rl_step``.

What differs from ``app.train.Trainer``: the loss is ``core.grpo`` / ``core.ppo`` built from the
``[rl]`` section (TRL's names and defaults); there is no replay (the config only takes replay
'none') and logZ is never trained (it stays in the optimizer without a gradient); rollouts are
on-policy at ``rl.temperature`` (``[sampling]`` is not read); PPO's value head sits on
the policy's last hidden states, is trained at the policy's learning rate without weight decay,
and is saved in ``trainer.pt``. Both roll out a step's batch_size x grad_accum rows at once
(app.step_batch). GRPO takes one optimizer step per logged step over that generation batch, as
TRL: advantages over all its rows (every process's), dapo/cispo normalised by all its actions,
the loss accumulated over micro-batches of batch_size rows; PPO's logged step is one PPO update
on TRL's schedule (``app.ppo_update``): the step's rows are fixed micro-batch by micro-batch, then
``rl.num_ppo_epochs`` x ``rl.num_mini_batches`` optimizer steps train on them, with dropout off in
the policy and the value head (as TRL's PPO). The reference model (adapter disabled, or a frozen
copy taken before the first step) is only evaluated when the KL penalty is on (GRPO beta, PPO
kl_coef) or the reward is log R with kappa > 0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raptb.adapters.value_head import ValueHead
from raptb.app.micro_batch import combine_micro_batch
from raptb.app.mix_schedule import Mix
from raptb.app.ppo_update import (
    PPORollout,
    disable_dropout,
    fixed_rollout,
    mini_batch_loss,
    mini_batches,
    step_targets,
)
from raptb.app.rl_step import needs_reference, rl_loss_step, sequence_rewards
from raptb.app.step import LossResult, Trajectories, correct_texts, reward
from raptb.app.step_batch import collect_step, micro_batches, plan_rows
from raptb.app.train import Trainer, TrainingError, step_result
from raptb.core.advantages import group_advantages
from raptb.core.grpo import GRPO
from raptb.core.ppo import PPO
from raptb.core.rl_objectives import RLObjective, rl_objective_by_name


@dataclass(frozen=True)
class _Rollout:
    """The step's rows on this process: pieces of one prompt each (app.step_batch), the terminal
    reward [b] of each piece's rows, and the successful on-policy texts."""

    pieces: tuple[Trajectories, ...]
    terminal: tuple[torch.Tensor, ...]
    correct: list[str]

    @property
    def on_policy(self) -> int:
        return sum(len(piece.on_policy) for piece in self.pieces)

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
class _RLStats:
    """What the record reads of a step's rollout (over all processes) or of a loss pass."""

    loss: float
    diagnostics: dict[str, float]
    on_policy: int
    hits: int
    rewards: list[float]


def on_policy_mix(temperature: float) -> Mix:
    """Every row on-policy at ``temperature`` (``rl.temperature``, TRL's per-method default), at
    which app.rl_step scores log pi as TRL does, so the sampling policy is the trained one up to
    the grammar mask: no replay, no oracle, and the "low temperature" draw always taken on the
    one-point range [T, T]."""
    return Mix(
        p_replay=0.0,
        low_temp_prob=1.0,
        temp_lo=temperature,
        temp_hi=temperature,
        p_oracle=0.0,
        oracle_fraction=0.0,
    )


class RLTrainer(Trainer):
    """Trains one GRPO or PPO run described by a ``TrainConfig`` into ``run_dir``."""

    objective: RLObjective
    value_head: ValueHead | None

    def _build_objective(self) -> RLObjective:
        cfg = self.cfg
        rows = cfg.optim.grad_accum * self.rank_batch
        if cfg.loss == "ppo" and rows % cfg.rl.num_mini_batches:
            raise TrainingError(
                f"each of the {self.dist.world_size} processes trains on {rows} rows per step "
                f"(grad_accum x its share of batch_size), not a multiple of "
                f"rl.num_mini_batches {cfg.rl.num_mini_batches}: change rl.num_mini_batches, "
                "optim.batch_size, optim.grad_accum or the number of processes"
            )
        objective = rl_objective_by_name(cfg.loss, **cfg.rl_objective_kwargs())
        self.value_head = None
        if isinstance(objective, PPO):
            disable_dropout(self.policy.model)
            hidden_size = int(self.policy.model.config.hidden_size)
            self.value_head = ValueHead(hidden_size, dropout=0.0).to(self.policy.device)
        return objective

    def _uses_reference(self) -> bool:
        """The reference is read by the KL penalty (GRPO beta, PPO kl_coef) and by a log R
        reward with kappa > 0, not by the default task reward without KL."""
        uses_prior = self.cfg.rl.reward == "log_r" and self.cfg.reward.kappa > 0
        return needs_reference(self.objective) or uses_prior

    def _extra_param_groups(self) -> list[dict[str, Any]]:
        if self.value_head is None:
            return []
        params = list(self.value_head.parameters())
        return [{"params": params, "lr": self.cfg.optim.lr, "weight_decay": 0.0}]

    def extra_state(self) -> dict[str, Any]:
        return {} if self.value_head is None else {"value_head": self.value_head.state_dict()}

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        if self.value_head is not None:
            self.value_head.load_state_dict(saved["value_head"])

    def _roll_out(self) -> _Rollout:
        """This process's share of the step's rows (one rollout), their task rewards and the
        terminal reward each row is judged by."""
        cfg = self.cfg
        own, prompts = self._step_rows()
        plan = plan_rows(
            prompts, on_policy_mix(cfg.rl.temperature), buffer=None, oracle=None, rng=self.rng
        )
        step = collect_step(self.policy, self.task, plan, own, generator=self.generator)
        weights = self.reward_schedule.at(self.step)  # lambda and T_R schedules apply here too
        kappa = weights.kappa if cfg.rl.reward == "log_r" else 0.0
        terminal, correct = [], []
        for piece in step.pieces:
            rewards = reward(self.scorer, self.policy, piece, kappa, weights.scale)
            correct += correct_texts(self.task, piece, rewards, self.spec)
            terminal.append(sequence_rewards(rewards, piece.length, cfg.rl.reward))
        return _Rollout(step.pieces, tuple(terminal), correct)

    def _grpo_step(self, objective: GRPO) -> dict[str, Any] | None:
        """GRPO's step, as TRL's over one generation batch: roll out the step's rows, take the
        advantages over all of them (every process's: ``scale_rewards = "batch"`` divides by
        their std) and normalise dapo/cispo by their action count, then backpropagate the loss
        over micro-batches of batch_size rows. None when the loss is not finite somewhere."""
        self.policy.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        rollout = self._roll_out()
        terminal = torch.cat(rollout.terminal)
        actions = int(sum(int(piece.length.sum()) + len(piece.rows) for piece in rollout.pieces))
        # one gather: every process's rewards (rank order = row order) and action count
        shared = self.dist.all_gather_object((terminal.tolist(), actions))
        everyone = torch.tensor([r for rank, _ in shared for r in rank], dtype=terminal.dtype)
        adv, std = group_advantages(everyone, objective.num_generations, objective.scale_rewards)
        own = slice(self.dist.rank * len(terminal), (self.dist.rank + 1) * len(terminal))
        adv, std = adv[own].to(terminal.device), std[own].to(terminal.device)
        num_items = sum(count for _, count in shared) / self.dist.world_size
        batches = rollout.micro_batches(self.rank_batch)
        agree = self.dist.all_true if self.dist.sharding else None
        results: list[tuple[int, LossResult]] = []
        first = 0
        for parts in batches:
            size = sum(len(batch.rows) for batch, _ in parts)
            rows = slice(first, first + size)
            first += size
            result = rl_loss_step(
                self.policy,
                objective,
                parts,
                1.0 / len(batches),
                agree=agree,
                advantages=(adv[rows], std[rows]),
                num_items_in_batch=num_items,
                grad_accum=len(batches),
            )
            if result is None:
                break
            results.append((size, result))
        finite = len(results) == len(batches)
        totals = combine_micro_batch(
            self.dist,
            step_result(results) if finite else None,
            rollout.correct,
            rollout.on_policy,
            rewards=rollout.rewards,
        )
        self.correct_seen.update(totals.correct)
        if not totals.finite:
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self._apply_gradients()
        stats = _RLStats(
            totals.loss, totals.diagnostics, totals.on_policy, len(totals.correct), totals.rewards
        )
        return self._record([stats], [stats], time.perf_counter() - start)

    def _optimizer_step(self) -> dict[str, Any] | None:
        if isinstance(self.objective, GRPO):
            return self._grpo_step(self.objective)
        if self.value_head is None or not isinstance(self.objective, PPO):
            raise TrainingError(f"no RL step for {type(self.objective).__name__}")
        return self._ppo_update(self.objective, self.value_head)

    def _ppo_update(self, objective: PPO, value_head: ValueHead) -> dict[str, Any] | None:
        """One PPO update (TRL's): roll out the step's micro-batches, fix the old log-probs,
        values and advantages, then num_ppo_epochs passes of num_mini_batches optimizer steps.
        None, with every process skipping together, when a rollout quantity or a loss is not
        finite (the optimizer steps already taken in this update stay)."""
        cfg = self.cfg
        self.policy.model.train()
        value_head.train()
        start = time.perf_counter()
        rollout = self._roll_out()
        # the step's rollout over all processes: what the record and unique_correct count
        seen = combine_micro_batch(
            self.dist,
            LossResult(0.0, {}),
            rollout.correct,
            rollout.on_policy,
            rewards=rollout.rewards,
        )
        self.correct_seen.update(seen.correct)
        reference = needs_reference(objective)
        # old log-probs and values micro-batch by micro-batch (memory), a prompt per forward
        fixed = [
            fixed_rollout(self.policy, value_head, batch, terminal, reference=reference)
            for parts in rollout.micro_batches(self.rank_batch)
            for batch, terminal in parts
        ]
        kept: list[PPORollout] = [f for f in fixed if f is not None]
        if self.dist.any_true(len(kept) < len(fixed)):
            return None
        targets = step_targets(objective, kept)
        rows = sum(f.rows for f in kept)
        passes: list[LossResult] = []
        for _ in range(cfg.rl.num_ppo_epochs):
            for mini_batch in mini_batches(self.rng, rows, cfg.rl.num_mini_batches):
                self.optimizer.zero_grad(set_to_none=True)
                # optimizer steps follow inside the update: agree before each backward
                agree = self.dist.all_true if self.dist.world_size > 1 else None
                result = mini_batch_loss(
                    self.policy, objective, value_head, kept, targets, mini_batch, agree
                )
                if result is None:  # on every process alike: mini_batch_loss agreed on it
                    self.optimizer.zero_grad(set_to_none=True)
                    return None
                self._apply_gradients()
                passes.append(result)
        mean = LossResult(
            float(np.mean([p.loss for p in passes])),
            {k: float(np.mean([p.diagnostics[k] for p in passes])) for k in passes[0].diagnostics},
        )
        losses = combine_micro_batch(self.dist, mean, [], 0)  # averaged over processes
        stats = _RLStats(
            loss=losses.loss,
            diagnostics=losses.diagnostics,
            on_policy=seen.on_policy,
            hits=len(seen.correct),
            rewards=seen.rewards,
        )
        record = self._record([stats], [stats], time.perf_counter() - start)
        record["ppo_updates"] = len(passes)
        return record

    def _record(
        self, rollouts: Sequence[Any], passes: Sequence[Any], seconds: float
    ) -> dict[str, Any]:
        """reward mean/std and acc over the step's ``rollouts`` (each with on_policy, hits,
        rewards); loss and the loss's diagnostics averaged over the ``passes`` (each with loss,
        diagnostics: GRPO's micro-batches, PPO's mini-batch updates) under TRL's names (kl,
        clip_frac, value_loss, ...; None where undefined)."""
        on_policy = sum(s.on_policy for s in rollouts)
        rewards = np.concatenate([s.rewards for s in rollouts])
        record: dict[str, Any] = {
            "step": self.step + 1,
            "loss": float(np.mean([s.loss for s in passes])),
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "acc": sum(s.hits for s in rollouts) / on_policy if on_policy else None,
            "unique_correct": len(self.correct_seen),
        }
        for key in passes[0].diagnostics:
            value = float(np.mean([s.diagnostics[key] for s in passes]))
            name = "reward_group_std" if key == "reward_std" else key
            record.setdefault(name, value if np.isfinite(value) else None)
        record.update(nonfinite_skipped=self.nonfinite_total, seconds=seconds)
        return record
