"""FlowRL (core.rl.flowrl) held to verl's lines (tests/core/authors_reference.py: volcengine/verl
``recipe/flowrl/flowrl_actor.py`` ``compute_flowrl`` on ``compute_grpo_outcome_advantage``'s
advantages, commit f11af2d): loss and gradients (policy log-probs and log Z) on hand-made groups
(all correct, all wrong, one correct) and on random batches (Hypothesis), off-policy rows
included so that the cap of 10 on the importance weight is reached; and verl's GRPO advantages
on the NumPy path."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.rl.batch import RLBatch
from raptb.core.rl.flowrl import FlowRL
from tests.core import authors_reference as authors


def _batch(log_probs, old, ref, rewards, length) -> RLBatch:
    return RLBatch(
        log_probs=log_probs,
        old_log_probs=old,
        rewards=rewards,
        length=length,
        ref_log_probs=ref,
    )


def _ours(log_probs, old, ref, rewards, length, log_z, n, beta=15.0):
    """raptb's loss and its gradients with respect to log pi and log Z."""
    lp = log_probs.clone().requires_grad_(True)
    z = log_z.clone().requires_grad_(True)
    objective = FlowRL(num_generations=n, flowrl_beta_coef=beta)
    loss, _ = objective(_batch(lp, old, ref, rewards, length), log_z=z)
    loss.backward()
    return loss.detach(), lp.grad, z.grad


def _verl(log_probs, old, ref, rewards, length, log_z, n, beta=15.0):
    """verl's loss and gradients on the same rows: its mask the tau + 1 actions, its reward the
    GRPO advantages of the terminal rewards, its log Z one value per row (here all equal)."""
    b, a = log_probs.shape
    mask = (torch.arange(a)[None, :] <= length[:, None]).to(log_probs.dtype)
    token_rewards = torch.zeros_like(log_probs)
    token_rewards[torch.arange(b), length] = rewards
    adv, _ = authors.verl_grpo_outcome_advantage(
        token_rewards, mask, (torch.arange(b) // n).tolist()
    )
    lp = log_probs.clone().requires_grad_(True)
    z = log_z.clone().requires_grad_(True)
    loss = authors.verl_compute_flowrl(
        lp, ref, old, z * torch.ones(b, 1, dtype=lp.dtype), adv, mask, flowrl_beta_coef=beta
    )
    loss.backward()
    return loss.detach(), lp.grad * mask, z.grad


def _assert_same(ours, verl) -> None:
    for x, y in zip(ours, verl, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def _group(rewards, seed=0, off_policy=0.0):
    """One group of len(rewards) rows of random lengths 1-5 and log-probs, float64."""
    g = torch.Generator().manual_seed(seed)
    b = len(rewards)
    length = torch.randint(0, 5, (b,), generator=g)
    log_probs = -torch.rand(b, 6, generator=g, dtype=torch.float64) * 3
    ref = -torch.rand(b, 6, generator=g, dtype=torch.float64) * 3
    old = log_probs - off_policy * torch.rand(b, 6, generator=g, dtype=torch.float64)
    return log_probs, old, ref, torch.tensor(rewards, dtype=torch.float64), length


@pytest.mark.parametrize(
    "rewards",
    [[50.0, 50.0, 50.0, 50.0], [0.0, 0.0, 0.0, 0.0], [0.0, 50.0, 0.0, 0.0]],
    ids=["all_correct", "all_wrong", "one_correct"],
)
def test_hand_made_groups_are_verls(rewards):
    rows = _group(rewards)
    log_z = torch.tensor(0.3, dtype=torch.float64)
    _assert_same(_ours(*rows, log_z, 4), _verl(*rows, log_z, 4))


def test_one_correct_by_hand():
    # one correct of 4: A = (1 - 1/4) / (std + 1e-6) for it, std = 1/2 (Bessel, rewards 0/1), so
    # its residual is log Z + mean log pi - 15 x 1.5 / (1 + 2e-6) (L / (L + 1e-8)) - mean log pi_ref
    log_probs = torch.tensor(
        [[-1.0, -2.0], [-0.5, 0.0], [-1.0, 0.0], [-3.0, -1.0]], dtype=torch.float64
    )
    ref = torch.full((4, 2), -1.0, dtype=torch.float64)
    length = torch.tensor([1, 0, 0, 1])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    loss, _, _ = _ours(log_probs, log_probs, ref, rewards, length, torch.tensor(0.0), 4)
    a_pos, a_neg = 0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)
    mean = [
        (-3.0 / (2 + 1e-8), 2),
        (-0.5 / (1 + 1e-8), 1),
        (-1.0 / (1 + 1e-8), 1),
        (-4.0 / (2 + 1e-8), 2),
    ]
    deltas = []
    for (avg, count), a in zip(mean, [a_pos, a_neg, a_neg, a_neg], strict=True):
        scale = count / (count + 1e-8)
        deltas.append(avg - 15.0 * a * scale + scale)  # - mean log pi_ref = + 1 x scale
    assert float(loss) == pytest.approx(sum(d * d for d in deltas) / 4, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    groups=st.integers(1, 3),
    n=st.integers(2, 5),
    seed=st.integers(0, 2**31 - 1),
    correct=st.lists(st.booleans(), min_size=15, max_size=15),
    log_z=st.floats(-3.0, 3.0),
    beta=st.sampled_from([15.0, 1.0, 0.3]),
    off_policy=st.sampled_from([0.0, 1.0, 4.0]),
)
def test_random_batches_are_verls(groups, n, seed, correct, log_z, beta, off_policy):
    b = groups * n
    scale = torch.rand(b, generator=torch.Generator().manual_seed(seed)).tolist()
    rewards = [50.0 * c * (0.5 + s) for c, s in zip(correct[:b], scale, strict=False)]
    rows = _group(rewards, seed, off_policy)
    z = torch.tensor(log_z, dtype=torch.float64)
    _assert_same(_ours(*rows, z, n, beta), _verl(*rows, z, n, beta))


def test_the_importance_weight_is_capped_at_ten():
    rows = list(_group([1.0, 0.0], seed=3))
    rows[1] = rows[0] - 5.0  # old log-probs far below: exp(sum) > 10 on every row
    z = torch.tensor(0.0, dtype=torch.float64)
    loss, _, _ = _ours(*rows, z, 2)
    _, diagnostics = FlowRL(num_generations=2)(_batch(*rows), log_z=z)
    assert diagnostics["importance_weight"] == 10.0
    _assert_same(_ours(*rows, z, 2), _verl(*rows, z, 2))
    assert math.isfinite(float(loss))


def test_advantages_on_numpy_are_verls():
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 3.0, 3.0, 3.0, 1.0])
    adv, std = FlowRL(num_generations=4).advantages(rewards)
    expected, _ = authors.verl_grpo_outcome_advantage(
        torch.tensor(rewards)[:, None], torch.ones(8, 1, dtype=torch.float64), [0] * 4 + [1] * 4
    )
    np.testing.assert_allclose(adv, expected[:, 0].numpy(), rtol=1e-12)
    np.testing.assert_allclose(std, [0.5] * 4 + [1.0] * 4, rtol=1e-12)


def test_needs_the_reference_and_checks_its_knobs():
    log_probs, old, _, rewards, length = _group([1.0, 0.0])
    with pytest.raises(ValueError, match="ref_log_probs"):
        FlowRL(num_generations=2)(
            RLBatch(log_probs=log_probs, old_log_probs=old, rewards=rewards, length=length),
            log_z=torch.tensor(0.0),
        )
    with pytest.raises(ValueError, match="flowrl_beta_coef"):
        FlowRL(flowrl_beta_coef=0.0)
    with pytest.raises(ValueError, match="num_generations"):
        FlowRL(num_generations=1)
    assert FlowRL().uses_reference
