"""Pass@k, UCPO and G²RPO trained by GRPO's algorithm (app.training.rl.grpo): the step's gradient
on a fixed rollout is TRL's dapo loss on the advantages of the authors' lines
(tests/core/authors_reference.py; G²RPO's, raptb's reading of its abstract, row by row), UCPO's
and G²RPO's read from the rows' sequence log-probs the algorithm scores before the step (at the
rollout's temperature, without gradients)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from raptb.app.training.train import Trainer
from raptb.core.rl.batch import action_log_probs
from tests.app.test_grpo_step import assert_close, fixed_rollout, step_gradient
from tests.app.test_train import small_config
from tests.core import authors_reference as authors


def make(tmp_path: Path, loss: str, **rl: object) -> Trainer:
    options = {f"rl.{k}": v for k, v in rl.items()}
    config = small_config(
        loss=loss,
        steps=1,
        **{"rl.num_generations": 4, "optim.batch_size": 8, "optim.grad_accum": 4, **options},
    )
    trainer = Trainer(config, tmp_path, progress=False)
    trainer.policy.model.eval()  # no dropout: the extra scoring pass sees the same function
    trainer.policy.model.train = lambda mode=True: trainer.policy.model
    return trainer


def reference_gradient(trainer: Trainer, rollout, advantages) -> list[torch.Tensor]:
    """d/d theta of TRL's dapo loss (one process, one pass: ratio 1) on ``advantages`` [B]:
    -sum_b sum_{t <= tau} A_b log pi / (number of actions)."""
    parts = [
        action_log_probs(*trainer.policy.score(p.prompt, p.tokens, p.length), p.length)
        for p in rollout.pieces
    ]
    logps = torch.cat(parts)
    length = torch.cat([p.length for p in rollout.pieces])
    mask = (torch.arange(logps.shape[1])[None, :] <= length[:, None]).float()
    loss = -(torch.as_tensor(advantages, dtype=torch.float32)[:, None] * logps * mask).sum()
    params = [p for p in trainer.policy.model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss / mask.sum(), params))


def old_log_probs(trainer: Trainer, rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's per-action log-probs [B, T] before the step (float64) and its action mask."""
    with torch.no_grad():
        parts = [
            action_log_probs(*trainer.policy.score(p.prompt, p.tokens, p.length), p.length)
            for p in rollout.pieces
        ]
    old = torch.cat(parts).double()
    length = torch.cat([p.length for p in rollout.pieces])
    return old, (torch.arange(old.shape[1])[None, :] <= length[:, None]).double()


def binary(rollout):
    """The rollout with 0/1 rewards (the authors' reward): positive rewards count as correct."""
    return replace(rollout, terminal=tuple((t > 0).float() for t in rollout.terminal))


def test_passk_step_is_the_authors_advantages_under_dapo(tmp_path: Path) -> None:
    trainer = make(tmp_path, "passk", pass_k=2)
    rollout = binary(fixed_rollout(trainer))
    rewards = torch.cat(rollout.terminal).numpy().astype(np.float64)
    adv = np.concatenate([authors.passk_calc_adv(g, 2) for g in rewards.reshape(-1, 4)])
    expected = reference_gradient(trainer, rollout, adv)
    assert_close(step_gradient(trainer, rollout, 8), expected)


@pytest.mark.parametrize("tau", [0.2, 1.0])
def test_ucpo_step_is_the_authors_advantages_under_dapo(tmp_path: Path, tau: float) -> None:
    trainer = make(tmp_path, "ucpo", ucpo_tau=tau)
    rollout = fixed_rollout(trainer)
    old, mask = old_log_probs(trainer, rollout)
    rewards = torch.cat(rollout.terminal).double()
    token_rewards = torch.zeros_like(old)
    token_rewards[:, 0] = rewards
    adv = authors.ucpo_invq_advantages(
        token_rewards, mask, old, torch.arange(len(rewards)) // 4, tau=tau
    )
    assert (rewards > 0).view(-1, 4).sum(1).max() > 1  # a group whose correct set is reshaped
    expected = reference_gradient(trainer, rollout, adv.numpy())
    assert_close(step_gradient(trainer, rollout, 8), expected)


def test_g2rpo_step_is_grpo_plus_the_bonus_under_dapo(tmp_path: Path) -> None:
    # the bonus read from the rows' teacher-forced sequence log-probs (the algorithm's extra pass)
    trainer = make(tmp_path, "g2rpo", g2rpo_lambda=0.5, g2rpo_cap=4.0)
    rollout = fixed_rollout(trainer)
    old, mask = old_log_probs(trainer, rollout)
    sequence = (old * mask).sum(1).tolist()
    rewards = torch.cat(rollout.terminal).double().tolist()
    adv = []
    for g in range(0, len(rewards), 4):
        r = rewards[g : g + 4]
        mean = sum(r) / 4
        std = (sum((x - mean) ** 2 for x in r) / 3) ** 0.5
        for x, lp in zip(r, sequence[g : g + 4], strict=True):
            bonus = 0.5 * min(1.0 / (4 * np.exp(lp)), 4.0) if x > 0 else 0.0
            adv.append((x - mean) / (std + 1e-4) + bonus)
    assert any(x > 0 for x in rewards)  # some rows get the bonus
    expected = reference_gradient(trainer, rollout, np.array(adv))
    assert_close(step_gradient(trainer, rollout, 8), expected)
