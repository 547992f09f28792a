"""GRPO over an optimizer step as TRL's over one generation batch (app.training.rl.grpo).

On one fixed rollout of 32 rows, 4 prompts of 8, whose answer lengths and reward scales depend
on the prompt (the case where per-micro-batch normalisation differs most), the step's gradient
is compared with an independent float64 transcription of TRL's formula: advantages from
``GRPOTrainer._generate_and_score_completions`` (group mean, ``nanstd`` over the group or, for
``scale_rewards = "batch"``, over the whole generation batch, + 1e-4) and the loss of
``GRPOTrainer._compute_loss`` per micro-batch (grpo/bnpo/dr_grpo divided by the gradient
accumulation steps, dapo/cispo by ``num_items_in_batch``, the generation batch's token count),
summed over the micro-batches; read in huggingface/trl ``trl/trainer/grpo_trainer.py`` and
``trl/trainer/utils.py`` (``nanstd``) at commit f2cd577. The transcription's gradient with respect
to each action's log-prob, pushed through the model's log-probs, is the reference gradient.
TRL's micro-batches here are the generation batch's rows in order (TRL shuffles them first,
which changes nothing but bnpo: raptb's bnpo step is TRL's for an unshuffled split,
docs/rl-baselines.md), and dr_grpo's ``max_completion_length`` is the action width (raptb's cap,
max_length + 1; TRL's configured default is 512).

Then the invariance: dapo, cispo, grpo and dr_grpo give the same update for batch_size 8 x
grad_accum 4 and 32 x 1; bnpo (a token mean per micro-batch, in TRL too) matches TRL for each
split, and the two splits differ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from raptb.app.training.rl.rollout import OnPolicyRows
from raptb.app.training.step import Trajectories
from raptb.app.training.train import Trainer
from raptb.core.rl.batch import action_log_probs
from tests.app.test_train import small_config

PROMPTS = ("Expr24:", "Make 24 from four digits:", "24?", "Find 24 with + - * /:")
ROWS = 8  # per prompt; the step holds 4 x 8 = 32 rows


def fixed_rollout(trainer: Trainer) -> OnPolicyRows:
    """4 prompts x 8 rows of random legal tokens, the prompt setting the answer length (prompt k:
    about 2k + 1 tokens) and the reward scale ((k + 1)^2)."""
    rng = np.random.default_rng(0)
    policy, big_t = trainer.policy, trainer.task.max_length
    pieces, terminal = [], []
    for k, prompt in enumerate(PROMPTS):
        lengths = [min(big_t, 2 * k + 1 + b % 3) for b in range(ROWS)]
        rows = tuple(tuple(int(t) for t in rng.choice(policy.legal_ids, n)) for n in lengths)
        tokens = torch.full((ROWS, big_t), policy.pad_id, dtype=torch.long)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = torch.tensor(row)
        pieces.append(
            Trajectories(
                prompt=prompt,
                tokens=tokens,
                length=torch.tensor(lengths),
                rows=rows,
                texts=tuple(policy.row_text(r) for r in rows),
                on_policy=tuple(range(ROWS)),
                stored_u=None,
                temperature=1.0,
                timings=None,
            )
        )
        terminal.append(torch.tensor(rng.normal(size=ROWS) * (k + 1) ** 2, dtype=torch.float32))
    return OnPolicyRows(tuple(pieces), tuple(terminal), [])


def step_gradient(trainer: Trainer, rollout: OnPolicyRows, batch_size: int) -> list[torch.Tensor]:
    """The gradients the trainer's GRPO step applies, on ``rollout`` in micro-batches of
    ``batch_size`` rows (the optimizer step itself left out, so the weights stay)."""
    grads: list[torch.Tensor] = []
    params = [p for p in trainer.policy.model.parameters() if p.requires_grad]
    trainer.rank_batch = batch_size
    trainer.algorithm._on_policy_rows = lambda: rollout
    trainer.apply_gradients = lambda: grads.extend(p.grad.detach().clone() for p in params)
    assert trainer._optimizer_step() is not None
    return grads


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """TRL's ``nanstd`` (no NaN here): Bessel-corrected."""
    mean = x.mean() if dim is None else x.mean(dim, keepdim=True)
    var = ((x - mean) ** 2).mean() if dim is None else ((x - mean) ** 2).mean(dim)
    n = x.numel() if dim is None else x.shape[dim]
    return (var * n / (n - 1)).sqrt()


def trl_loss(
    logps: torch.Tensor,
    mask: torch.Tensor,
    rewards: torch.Tensor,
    *,
    loss_type: str,
    scale_rewards: str,
    num_generations: int,
    grad_accum: int,
    epsilon: float,
    epsilon_high: float,
) -> torch.Tensor:
    """TRL's step loss on one process, float64: ``logps`` [B, A] the per-token log-probs (one
    pass, so old = logps detached), ``mask`` [B, A], ``rewards`` [B]; the generation batch cut
    into ``grad_accum`` micro-batches in row order, each micro-batch's loss as
    ``_compute_loss`` returns it, summed."""
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(1).repeat_interleave(num_generations)
    if scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(grouped, 1).repeat_interleave(num_generations)
    advantages = (rewards - mean) / (std + 1e-4)
    num_items = mask.sum()
    total = logps.new_zeros(())
    for part in torch.tensor_split(torch.arange(len(rewards)), grad_accum):
        lp, m, adv = logps[part], mask[part], advantages[part].unsqueeze(1)
        coef_1 = torch.exp(lp - lp.detach())
        if loss_type == "cispo":
            per_token = -torch.clamp(coef_1, max=epsilon_high).detach() * adv * lp
        else:
            coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon_high)
            per_token = -torch.min(coef_1 * adv, coef_2 * adv)
        if loss_type == "grpo":
            loss = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean() / grad_accum
        elif loss_type == "bnpo":
            loss = (per_token * m).sum() / m.sum().clamp(min=1.0) / grad_accum
        elif loss_type == "dr_grpo":
            loss = (per_token * m).sum() / (per_token.size(0) * m.shape[1]) / grad_accum
        else:  # dapo, cispo: num_items_in_batch / num_processes (one process)
            loss = (per_token * m).sum() / num_items.clamp(min=1.0)
        total = total + loss
    return total


def trl_gradient(
    trainer: Trainer, rollout: OnPolicyRows, grad_accum: int, scale_rewards: str
) -> list[torch.Tensor]:
    """The model gradient of TRL's step loss: d loss / d logp in float64 (the transcription),
    pushed through the model's own log-probs of the same actions."""
    objective = trainer.algorithm.objective
    parts = []
    for piece in rollout.pieces:
        log_pf, log_pterm = trainer.policy.score(piece.prompt, piece.tokens, piece.length)
        parts.append(action_log_probs(log_pf, log_pterm, piece.length))
    logps = torch.cat(parts)
    length = torch.cat([piece.length for piece in rollout.pieces])
    mask = (torch.arange(logps.shape[1])[None, :] <= length[:, None]).double()
    leaf = logps.detach().double().requires_grad_()
    loss = trl_loss(
        leaf,
        mask,
        torch.cat(rollout.terminal).double(),
        loss_type=objective.loss_type,
        scale_rewards=scale_rewards,
        num_generations=objective.num_generations,
        grad_accum=grad_accum,
        epsilon=objective.epsilon,
        epsilon_high=objective.upper_epsilon,
    )
    (d_logps,) = torch.autograd.grad(loss, leaf)
    params = [p for p in trainer.policy.model.parameters() if p.requires_grad]
    return list(torch.autograd.grad((d_logps.float() * logps).sum(), params))


def make(tmp_path: Path, loss_type: str, scale_rewards: str) -> Trainer:
    config = small_config(
        loss="grpo",
        steps=1,
        **{
            "rl.loss_type": loss_type,
            "rl.scale_rewards": scale_rewards,
            "rl.num_generations": 4,
            "optim.batch_size": 8,
            "optim.grad_accum": 4,
        },
    )
    trainer = Trainer(config, tmp_path, progress=False)
    trainer.policy.model.eval()  # no dropout: the reference rescoring sees the same function
    trainer.policy.model.train = lambda mode=True: trainer.policy.model  # keep it so
    return trainer


def assert_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    ("loss_type", "scale_rewards"),
    [(t, "group") for t in ("dapo", "cispo", "grpo", "dr_grpo", "bnpo")]
    + [("dapo", "batch"), ("grpo", "batch")],
)
def test_grpo_step_is_trls_step(tmp_path: Path, loss_type: str, scale_rewards: str) -> None:
    trainer = make(tmp_path, loss_type, scale_rewards)
    rollout = fixed_rollout(trainer)
    split = step_gradient(trainer, rollout, 8)
    whole = step_gradient(trainer, rollout, 32)
    assert_close(split, trl_gradient(trainer, rollout, 4, scale_rewards))
    assert_close(whole, trl_gradient(trainer, rollout, 1, scale_rewards))
    if loss_type == "bnpo":  # a token mean per micro-batch: the split matters, as in TRL
        assert max(float((x - y).abs().max()) for x, y in zip(split, whole, strict=True)) > 1e-4
    else:
        assert_close(split, whole)
