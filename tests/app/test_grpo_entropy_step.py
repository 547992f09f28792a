"""GRPO's entropy bonus through a training step (app.training.rl.grpo): the step's
gradient is TRL's dapo step loss minus the coefficient times the window's mean per-action entropy
(tests/core/authors_reference.py), the coefficient static or the adaptive controller's (0 on the
first step, then moved by entropy_coef_delta); the entropy is the full softmax's at the rollout's
temperature (checked against torch's Categorical)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raptb.adapters.lm.rollout_record import softmax_entropy
from raptb.app.training.train import Trainer
from raptb.core.rl.batch import action_log_probs
from tests.app.test_grpo_step import assert_close, fixed_rollout, step_gradient, trl_loss
from tests.app.test_train import small_config


def make(tmp_path: Path, **rl: object) -> Trainer:
    options = {f"rl.{k}": v for k, v in rl.items()}
    config = small_config(
        loss="grpo",
        steps=2,
        **{"rl.num_generations": 4, "optim.batch_size": 8, "optim.grad_accum": 4, **options},
    )
    trainer = Trainer(config, tmp_path, progress=False)
    trainer.policy.model.eval()
    trainer.policy.model.train = lambda mode=True: trainer.policy.model
    return trainer


def reference_gradient(trainer: Trainer, rollout, coef: float) -> list[torch.Tensor]:
    """TRL's dapo step loss (one process, 4 micro-batches) minus coef x the window's mean
    per-action entropy, differentiated through the model."""
    logps, entropies = [], []
    for p in rollout.pieces:
        log_pf, log_pterm, h = trainer.policy.score_with_entropy(p.prompt, p.tokens, p.length)
        logps.append(action_log_probs(log_pf, log_pterm, p.length))
        entropies.append(h)
    logp, entropy = torch.cat(logps), torch.cat(entropies)
    length = torch.cat([p.length for p in rollout.pieces])
    mask = (torch.arange(logp.shape[1])[None, :] <= length[:, None]).double()
    leaf = logp.detach().double().requires_grad_()
    objective = trainer.algorithm.objective
    policy = trl_loss(
        leaf,
        mask,
        torch.cat(rollout.terminal).double(),
        loss_type="dapo",
        scale_rewards="group",
        num_generations=4,
        grad_accum=4,
        epsilon=objective.epsilon,
        epsilon_high=objective.upper_epsilon,
    )
    (d_logp,) = torch.autograd.grad(policy, leaf)
    total = (d_logp.float() * logp).sum() - coef * (entropy * mask.float()).sum() / mask.sum()
    params = [p for p in trainer.policy.model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(total, params))


def test_static_entropy_bonus_step(tmp_path: Path) -> None:
    trainer = make(tmp_path, entropy_coef=0.3)
    rollout = fixed_rollout(trainer)
    assert_close(step_gradient(trainer, rollout, 8), reference_gradient(trainer, rollout, 0.3))


def test_adaptive_entropy_steps(tmp_path: Path) -> None:
    trainer = make(tmp_path, use_adaptive_entropy=True, entropy_coef=0.2, entropy_target=100.0)
    rollout = fixed_rollout(trainer)
    # first step: no measurement yet, no bonus (TRL's +inf start); then entropy <= target: +delta
    assert_close(step_gradient(trainer, rollout, 8), reference_gradient(trainer, rollout, 0.0))
    control = trainer.algorithm.entropy_control
    assert control.coef == pytest.approx(0.205) and control.last_entropy < 100.0
    assert trainer.algorithm.run_state() == {
        "entropy_coef": control.coef,
        "last_world_entropy": control.last_entropy,
    }
    assert_close(step_gradient(trainer, rollout, 8), reference_gradient(trainer, rollout, 0.205))


def test_softmax_entropy_is_the_categoricals() -> None:
    logits = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(0)) * 3
    for temperature in (1.0, 0.7):
        expected = torch.distributions.Categorical(logits=logits / temperature).entropy()
        torch.testing.assert_close(softmax_entropy(logits, temperature), expected)


def test_entropy_defaults_are_the_installed_trls() -> None:
    trl = pytest.importorskip("trl")
    import dataclasses

    from raptb.core.rl.grpo import GRPO

    theirs = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    ours = {f.name: f.default for f in dataclasses.fields(GRPO)}
    names = (
        "entropy_coef",
        "use_adaptive_entropy",
        "entropy_coef_min",
        "entropy_coef_max",
        "entropy_coef_delta",
        "entropy_target",
    )
    assert {n: ours[n] for n in names} == {n: theirs[n] for n in names}
