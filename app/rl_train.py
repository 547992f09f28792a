"""The RL baselines' trainer (``--loss grpo`` / ``--loss ppo``): the GFlowNet trainer's loop,
checkpoints and logging around the stages of ``app.rl_step``.

What differs from ``app.train.Trainer``: the loss is ``core.grpo`` / ``core.ppo`` built from the
``[rl]`` section (TRL's names and defaults); there is no replay (the config only takes replay
'none') and logZ is never trained (it stays in the optimizer without a gradient); rollouts are
on-policy at temperature 1 (``[sampling]`` is not read); PPO's value head sits on
the policy's last hidden states, is trained at the policy's learning rate without weight decay,
and is saved in ``trainer.pt``. The reference model (adapter disabled, or a frozen copy taken
before the first step) is only evaluated when the KL penalty is on (GRPO beta, PPO kl_coef) or
the reward is log R with kappa > 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from raptb.adapters.lora import is_peft_model
from raptb.adapters.value_head import ValueHead
from raptb.app.config import RL_LOSSES, TrainConfig
from raptb.app.distributed import DistContext
from raptb.app.rl_step import needs_reference, rl_loss_step, sequence_rewards
from raptb.app.step import correct_texts, reward, roll_out
from raptb.app.train import Trainer, TrainingError, _MicroStats
from raptb.core.ppo import PPO
from raptb.core.rl_objectives import RLObjective, rl_objective_by_name


@dataclass
class _RLStats(_MicroStats):
    rewards: list[float]
    """The micro-batch's terminal rewards."""


class RLTrainer(Trainer):
    """Trains one GRPO or PPO run described by a ``TrainConfig`` into ``run_dir``."""

    objective: RLObjective
    value_head: ValueHead | None

    def _build_objective(self) -> RLObjective:
        cfg = self.cfg
        if cfg.loss == "grpo" and self.rank_batch % cfg.rl.num_generations:
            raise TrainingError(
                f"each of the {self.dist.world_size} processes samples {self.rank_batch} rows, "
                f"not a multiple of rl.num_generations {cfg.rl.num_generations} (whole GRPO "
                "groups per process): change optim.batch_size or the number of processes"
            )
        objective = rl_objective_by_name(cfg.loss, **cfg.rl_objective_kwargs())
        uses_prior = cfg.rl.reward == "log_r" and cfg.reward.kappa > 0
        if (needs_reference(objective) or uses_prior) and not is_peft_model(self.policy.model):
            self.policy.freeze_reference()  # the base weights, before any update or resume
        self.value_head = None
        if isinstance(objective, PPO):
            hidden_size = int(self.policy.model.config.hidden_size)
            self.value_head = ValueHead(hidden_size).to(self.policy.device)
        return objective

    def _extra_param_groups(self) -> list[dict[str, Any]]:
        if self.value_head is None:
            return []
        params = list(self.value_head.parameters())
        return [{"params": params, "lr": self.cfg.optim.lr, "weight_decay": 0.0}]

    def _extra_state(self) -> dict[str, Any]:
        return {} if self.value_head is None else {"value_head": self.value_head.state_dict()}

    def _load_extra_state(self, saved: dict[str, Any]) -> None:
        if self.value_head is not None:
            self.value_head.load_state_dict(saved["value_head"])

    def _micro_batch(self, prompt: str) -> _RLStats | None:
        cfg = self.cfg
        # on-policy at temperature 1 (TRL's default): log pi is untempered, so the sampling
        # policy is the trained one up to the grammar mask
        # (each process its share of the global micro-batch, as for the GFlowNet objectives)
        batch = roll_out(self.policy, self.task, prompt, self.rank_batch, 1.0, self.generator)
        weights = self.reward_schedule.at(self.step)  # lambda and T_R schedules apply here too
        kappa = weights.kappa if cfg.rl.reward == "log_r" else 0.0
        rewards = reward(self.scorer, self.policy, batch, kappa, weights.scale)
        correct = correct_texts(self.task, batch, rewards)
        self.correct_seen.update(correct)
        terminal = sequence_rewards(rewards, batch.length, cfg.rl.reward)
        result = rl_loss_step(
            self.policy,
            self.objective,
            batch,
            terminal,
            cfg.optim.grad_accum,
            value_head=self.value_head,
        )
        if result is None:
            return None
        return _RLStats(
            loss=result.loss,
            diagnostics=result.diagnostics,
            on_policy=len(batch.on_policy),
            hits=len(correct),
            replayed=False,
            temperature=batch.temperature,
            rewards=terminal.tolist(),
        )

    def _step_record(self, stats: list[Any], seconds: float) -> dict[str, Any]:
        """loss, reward mean/std over the step's samples, the loss's diagnostics averaged over
        the micro-batches (TRL's names: kl, clip_frac, value_loss, ...; None where undefined)."""
        on_policy = sum(s.on_policy for s in stats)
        rewards = np.concatenate([s.rewards for s in stats])
        record: dict[str, Any] = {
            "step": self.step + 1,
            "loss": float(np.mean([s.loss for s in stats])),
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "acc": sum(s.hits for s in stats) / on_policy if on_policy else None,
            "unique_correct": len(self.correct_seen),
        }
        for key in stats[0].diagnostics:
            value = float(np.mean([s.diagnostics[key] for s in stats]))
            name = "reward_group_std" if key == "reward_std" else key
            record.setdefault(name, value if np.isfinite(value) else None)
        record.update(nonfinite_skipped=self.nonfinite_total, seconds=seconds)
        return record


def make_trainer(
    config: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    console: Console | None = None,
    dist: DistContext | None = None,
) -> Trainer:
    """The trainer of ``config.loss``: ``RLTrainer`` for grpo and ppo, else ``Trainer``."""
    cls = RLTrainer if config.loss in RL_LOSSES else Trainer
    return cls(config, run_dir, resume=resume, progress=progress, console=console, dist=dist)
