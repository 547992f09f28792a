"""ROVER's training (app.training.rl.rover) on the embedded Expr24 model: the prefix
tree's children of each state by hand (adapters.lm.tree_actions), and a mini-batch update after
the policy has moved, against the authors' lines (tests/core/authors_reference.py) fed with the
old and current quantities computed here independently."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from raptb.adapters.lm.tree_actions import tree_action_mask
from raptb.app.training.train import Trainer
from raptb.core.rl.batch import action_log_probs
from raptb.core.rl.rover import rover_rewards
from tests.app.test_train import small_config
from tests.core import authors_reference as authors


def make(tmp_path: Path, **rl: object) -> Trainer:
    options = {f"rl.{k}": v for k, v in rl.items()}
    config = small_config(loss="rover", steps=2, **{"rl.num_generations": 4, **options})
    return Trainer(config, tmp_path, progress=False)


def test_tree_children_on_expr24_by_hand(tmp_path: Path) -> None:
    trainer = make(tmp_path)
    policy, task = trainer.policy, trainer.task
    ids = {policy.row_text([i]): i for i in policy.legal_ids}
    texts = ["3+4", "1+2+3+4+5"]
    tokens = torch.full((2, task.max_length), policy.pad_id)
    for b, text in enumerate(texts):
        tokens[b, : len(text)] = torch.tensor([ids[c] for c in text])
    mask = tree_action_mask(policy, tokens, torch.tensor([3, 9]), task.min_length, task.max_length)
    names = [policy.row_text([i]) for i in policy.legal_ids] + ["<stop>"]

    def children(b: int, k: int) -> set[str]:
        return {names[j] for j in range(len(names)) if mask[b, k, j]}

    digits, ops = set("123456789"), set("+-*/")
    assert [children(0, k) for k in range(4)] == [digits, ops, digits, ops | {"<stop>"}]
    assert all(children(0, k) == set() for k in range(4, 10))  # after the stop
    assert children(1, 7) == ops | {"<stop>"} and children(1, 8) == digits
    assert children(1, 9) == {"<stop>"}  # max_length: the stop only


def _state_means(trainer: Trainer, piece, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Action log-probs [b, A] and the mean over each state's children of the full softmax's
    log-probs [b, A], from the full log-softmax gathered here."""
    policy = trainer.policy
    sub = torch.tensor([*policy.legal_ids, policy.stop_id])
    log_pf, log_pterm, full = policy.score_with_states(
        piece.prompt,
        piece.tokens,
        piece.length,
        lambda logits: torch.log_softmax(logits.float() / piece.temperature, dim=-1),
        piece.temperature,
    )
    chosen = full[..., sub]
    means = (chosen * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return action_log_probs(log_pf, log_pterm, piece.length), means


def test_an_update_after_the_policy_moved_is_the_authors_loss(tmp_path: Path) -> None:
    trainer = make(tmp_path)
    algorithm, policy, task = trainer.algorithm, trainer.policy, trainer.task
    torch.manual_seed(0)
    rollout = algorithm._on_policy_rows()
    centred = rover_rewards(torch.cat(rollout.terminal), 4, True)
    parts, old, first = [], [], 0
    for piece, terminal in zip(rollout.pieces, rollout.terminal, strict=True):
        rows = slice(first, first + len(piece.rows))
        first = rows.stop
        parts.append(algorithm.fixed_part(piece, terminal, centred[rows]))
        mask = tree_action_mask(
            policy, piece.tokens, piece.length, task.min_length, task.max_length
        )
        with torch.no_grad():
            old.append((*_state_means(trainer, piece, mask.float()), mask.float()))
    params = [p for p in policy.model.parameters() if p.requires_grad]
    with torch.no_grad():  # an optimizer step's worth of change: Q and V leave 0
        for p in params:
            p.add_(0.05 * torch.randn_like(p))
    total = sum(len(piece.rows) for piece in rollout.pieces)
    rows = np.arange(total)
    for p in params:
        p.grad = None
    result = algorithm.mini_batch_loss(parts, rows)
    got = [p.grad.clone() for p in params]
    expected_loss = 0.0
    for p in params:
        p.grad = None
    first = 0
    for piece, (old_lp, old_means, mask) in zip(rollout.pieces, old, strict=True):
        b = len(piece.rows)
        log_prob, means = _state_means(trainer, piece, mask)
        response = (torch.arange(log_prob.shape[1])[None, :] <= piece.length[:, None]).float()
        low_var = centred[first : first + b, None] * response
        first += b
        loss = authors.rover_loss(log_prob, old_lp, means.detach(), old_means, low_var, response)
        (loss * b / total).backward()
        expected_loss += float(loss.detach()) * b / total
    assert abs(result.loss - expected_loss) < 1e-5 * max(1.0, abs(expected_loss))
    assert result.diagnostics["next_q_mean"] != 0.0  # the targets read the moved policy
    for x, y in zip(got, [p.grad for p in params], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-7)


def test_a_run_takes_the_mini_batch_updates(tmp_path: Path) -> None:
    trainer = make(tmp_path, rover_action_set="vocabulary")
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rover_updates" in r]
    assert [r["rover_updates"] for r in steps] == [4, 4]  # the preset: 1 pass of 4 mini-batches
    assert all(np.isfinite(r["loss"]) for r in steps)
