"""IPS-GRPO (GRPO's algorithm) and FlowRL (its own, app.training.rl.flowrl) through a training
step: on a fixed rollout the step's gradient is, for IPS-GRPO, TRL's dapo loss on the paper's
advantages of the rows' outcomes (tests/core/test_ips_grpo.py's transcription; rows repeated in a
group are one outcome), and, for FlowRL, verl's ``compute_flowrl`` on verl's GRPO advantages
(tests/core/authors_reference.py) with respect to the policy and log Z; then both train through
``raptb train``."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch
from typer.testing import CliRunner

from raptb.app.cli import app
from raptb.app.training.rl.flowrl import FlowRLAlgorithm
from raptb.app.training.rl.rollout import OnPolicyRows
from raptb.app.training.train import Trainer
from raptb.core.rl.batch import action_log_probs
from tests.app.test_grpo_step import assert_close, fixed_rollout, step_gradient
from tests.app.test_grpo_variants_step import make, reference_gradient
from tests.app.test_train import records
from tests.core import authors_reference as authors
from tests.core.test_ips_grpo import paper_advantages


def with_repeats(rollout: OnPolicyRows) -> OnPolicyRows:
    """The rollout with row 1 a copy of row 0 and row 6 of row 4 in each piece (their rewards
    too): groups of 4 where one outcome is drawn twice."""
    pieces, terminal = [], []
    for piece, reward in zip(rollout.pieces, rollout.terminal, strict=True):
        tokens, length, reward = piece.tokens.clone(), piece.length.clone(), reward.clone()
        rows, texts = list(piece.rows), list(piece.texts)
        for src, dst in ((0, 1), (4, 6)):
            tokens[dst], length[dst], reward[dst] = tokens[src], length[src], reward[src]
            rows[dst], texts[dst] = rows[src], texts[src]
        pieces.append(
            replace(piece, tokens=tokens, length=length, rows=tuple(rows), texts=tuple(texts))
        )
        terminal.append(reward)
    return replace(rollout, pieces=tuple(pieces), terminal=tuple(terminal))


def test_ips_grpo_step_is_the_papers_advantages_under_dapo(tmp_path: Path) -> None:
    trainer = make(tmp_path, "ips_grpo")
    rollout = with_repeats(fixed_rollout(trainer))
    rewards = torch.cat(rollout.terminal).double().tolist()
    outcomes = [row for piece in rollout.pieces for row in piece.rows]
    adv = paper_advantages(rewards, outcomes, 4, 0.01)
    grpo = paper_advantages(rewards, list(range(len(rewards))), 4, 0.01)
    assert max(abs(a - b) for a, b in zip(adv, grpo, strict=True)) > 0.1  # the repeats count
    expected = reference_gradient(trainer, rollout, torch.tensor(adv).numpy())
    assert_close(step_gradient(trainer, rollout, 8), expected)


def flowrl_step_gradient(trainer: Trainer, rollout: OnPolicyRows) -> list[torch.Tensor]:
    """The policy's and log Z's gradients the trainer's FlowRL step applies (the update left
    out), in micro-batches of 8 rows."""
    grads = step_gradient(trainer, rollout, 8)
    return [*grads, trainer.algorithm.log_z.grad.detach().clone()]


def verl_gradient(trainer: Trainer, rollout: OnPolicyRows) -> list[torch.Tensor]:
    """d/d(theta, log Z) of verl's compute_flowrl over the step's rows (one pass: old = pi)."""
    policy, log_z = trainer.policy, trainer.algorithm.log_z
    logps, refs = [], []
    for p in rollout.pieces:
        logps.append(action_log_probs(*policy.score(p.prompt, p.tokens, p.length), p.length))
        with torch.no_grad():
            ref = policy.reference_score(p.prompt, p.tokens, p.length, p.temperature)
        refs.append(action_log_probs(*ref, p.length))
    logp, ref = torch.cat(logps), torch.cat(refs)
    length = torch.cat([p.length for p in rollout.pieces])
    b, a = logp.shape
    mask = (torch.arange(a)[None, :] <= length[:, None]).float()
    token_rewards = torch.zeros(b, a)
    token_rewards[torch.arange(b), length] = torch.cat(rollout.terminal).float()
    adv, _ = authors.verl_grpo_outcome_advantage(
        token_rewards, mask, (torch.arange(b) // 4).tolist()
    )
    loss = authors.verl_compute_flowrl(
        logp, ref, logp.detach(), log_z * torch.ones(b, 1), adv, mask
    )
    params = [p for p in policy.model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, [*params, log_z]))


def test_flowrl_step_is_verls_loss(tmp_path: Path) -> None:
    trainer = make(tmp_path, "flowrl")
    assert isinstance(trainer.algorithm, FlowRLAlgorithm)
    with torch.no_grad():
        trainer.algorithm.log_z.fill_(0.7)
    rollout = fixed_rollout(trainer)
    expected = verl_gradient(trainer, rollout)
    assert abs(float(expected[-1])) > 1e-3  # log Z is trained
    assert_close(flowrl_step_gradient(trainer, rollout), expected)


def test_both_train_through_the_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["--steps", "2", "--seed", "1", "--batch-size", "8", "--grad-accum", "2"]
    for loss in ("ips_grpo", "flowrl"):
        run = tmp_path / loss
        done = runner.invoke(
            app, ["train", "--loss", loss, *args, "--out", str(run), "--no-progress"]
        )
        assert done.exit_code == 0, done.output
        logged = records(run)
        assert [r["step"] for r in logged] == [1, 2]
        assert all(math.isfinite(r["loss"]) for r in logged)
        saved = torch.load(run / "checkpoints" / "step-000002" / "trainer.pt", weights_only=True)
        assert ("log_z" in saved) == (loss == "flowrl")
    flowrl = records(tmp_path / "flowrl")
    assert flowrl[-1]["log_z"] != 0.0 and flowrl[-1]["importance_weight"] == 1.0
    bad = runner.invoke(app, ["train", "--loss", "ips_grpo", "--rl.ips_epsilon", "0"])
    assert bad.exit_code == 2 and "ips_epsilon" in bad.output
