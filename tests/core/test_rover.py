"""ROVER (core.rl.rover) against its authors' lines (tests/core/authors_reference.py: repository,
file and commit there) on hand-made groups with the edge cases (all correct, all wrong, one
correct), and its adaptation to the prefix tree (the uniform policy's mean over a state's
children) on a tree small enough to compute by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raptb.core.rl.batch import RLBatch
from raptb.core.rl.rover import ROVER, mean_over_actions, next_state_values, rover_rewards
from tests.core import authors_reference as authors

N = 4  # rows per group
# groups: all correct, all wrong, one correct, a mix
REWARDS = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    b, a = len(REWARDS), 5
    length = rng.integers(0, a, size=b)
    logp = np.log(rng.uniform(0.05, 1.0, size=(b, a)))
    old = logp + rng.normal(scale=0.3, size=(b, a))
    cur_mean = -rng.uniform(1.0, 3.0, size=(b, a))  # mean log-prob over a state's actions
    old_mean = cur_mean + rng.normal(scale=0.2, size=(b, a))
    mask = (np.arange(a)[None, :] <= length[:, None]).astype(np.float64)
    return length, logp, old, cur_mean, old_mean, mask


@pytest.mark.parametrize("scale", [False, True])
def test_rover_matches_the_authors_on_the_edge_cases(scale):
    length, logp, old, cur_mean, old_mean, mask = _batch()
    rewards = np.array(REWARDS)
    lp = torch.tensor(logp, requires_grad=True)
    batch = RLBatch(
        log_probs=lp,
        old_log_probs=torch.tensor(old),
        rewards=torch.tensor(rewards),
        length=torch.tensor(length),
    )
    rover = ROVER(num_generations=N, norm_adv_by_std_in_grpo=scale)
    loss, diag = rover(batch, state_values=torch.tensor(cur_mean - old_mean))
    loss.backward()
    # the authors': the reward sits on the last response position, token_level_rewards [B, T]
    token_rewards = torch.zeros(len(rewards), mask.shape[1], dtype=torch.float64)
    token_rewards[torch.arange(len(rewards)), torch.tensor(length)] = torch.tensor(rewards)
    low_var = authors.rover_compute_rover_reward(
        token_rewards, torch.tensor(mask), [i // N for i in range(len(rewards))], scale
    )
    ref_lp = torch.tensor(logp, requires_grad=True)
    expected = authors.rover_loss(
        ref_lp,
        torch.tensor(old),
        torch.tensor(cur_mean),
        torch.tensor(old_mean),
        low_var,
        torch.tensor(mask),
    )
    expected.backward()
    # the authors cast the squared errors to float32 (``.float()``): equal to float32 precision
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    np.testing.assert_allclose(lp.grad.numpy(), ref_lp.grad.numpy(), rtol=1e-6, atol=1e-9)
    # all correct, all wrong: no reward signal; one correct: r~ = 3/4 and -1/4 (unscaled)
    centred = rover_rewards(rewards, N, scale)
    assert np.all(centred[:8] == 0.0)
    if not scale:
        np.testing.assert_allclose(centred[8:12], [-0.25, 0.75, -0.25, -0.25])
    assert diag["advantage_abs_mean"] == pytest.approx(np.mean(np.abs(centred)))


def test_first_update_is_a_centred_policy_gradient():
    # pi_old = pi: Q = 0 and V = 0 in value, so d loss / d log pi_t = -2 r~ / (number of actions)
    length, logp, _, _, _, mask = _batch(1)
    lp = torch.tensor(logp, requires_grad=True)
    batch = RLBatch(
        log_probs=lp,
        old_log_probs=lp.detach(),
        rewards=torch.tensor(REWARDS),
        length=torch.tensor(length),
    )
    loss, _ = ROVER(num_generations=N)(batch, state_values=torch.zeros_like(lp))
    loss.backward()
    centred = rover_rewards(np.array(REWARDS), N)
    np.testing.assert_allclose(lp.grad.numpy(), -2 * centred[:, None] * mask / mask.sum())


def test_the_uniform_policy_on_a_tree_by_hand():
    """The tree: "" -> {a, b} (no stop: too short); "a" -> {a, stop}; "ab"... Two rows, "a"
    then stop (tau = 1) and "aa" then stop (tau = 2), with per-state log-probs over the
    sub-vocabulary [a, b, stop] of the current and the old policy."""
    allowed = np.array(
        [
            [[1, 1, 0], [1, 0, 1], [0, 0, 0]],  # row 0: states "", "a", (after its stop)
            [[1, 1, 0], [1, 0, 1], [0, 0, 1]],  # row 1: states "", "a", "aa" (stop only)
        ],
        dtype=bool,
    )
    cur = np.log(
        np.array(
            [
                [[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.2, 0.2, 0.6]],
                [[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.1, 0.1, 0.8]],
            ]
        )
    )
    old = np.log(
        np.array(
            [
                [[0.4, 0.4, 0.2], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6]],
                [[0.4, 0.4, 0.2], [0.5, 0.2, 0.3], [0.1, 0.1, 0.7]],
            ]
        )
    )
    v = mean_over_actions(cur, allowed) - mean_over_actions(old, allowed)
    # V("") = ((log .5 - log .4) + (log .3 - log .4)) / 2, V("a") = ((log .6 - log .5) + 0) / 2,
    # V("aa") = log .8 - log .7; nothing after row 0's stop
    v_root = (math.log(0.5 / 0.4) + math.log(0.3 / 0.4)) / 2
    v_a = math.log(0.6 / 0.5) / 2
    np.testing.assert_allclose(v, [[v_root, v_a, 0.0], [v_root, v_a, math.log(0.8 / 0.7)]])
    length = np.array([1, 2])
    # targets: row 0, action "a" at "": r~ + V("a"); its stop at "a": r~ (terminal)
    np.testing.assert_allclose(
        next_state_values(v, length), [[v_a, 0.0, 0.0], [v_a, math.log(0.8 / 0.7), 0.0]]
    )
    # the loss of the two rows (one group, rewards 1 and 0: r~ = +1/2, -1/2) by hand
    log_probs = np.array(
        [[cur[0, 0, 0], cur[0, 1, 2], 0.0], [cur[1, 0, 0], cur[1, 1, 0], cur[1, 2, 2]]]
    )
    old_lp = np.array(
        [[old[0, 0, 0], old[0, 1, 2], 0.0], [old[1, 0, 0], old[1, 1, 0], old[1, 2, 2]]]
    )
    batch = RLBatch(
        log_probs=log_probs, old_log_probs=old_lp, rewards=np.array([1.0, 0.0]), length=length
    )
    loss, _ = ROVER(num_generations=2)(batch, state_values=v)
    q = log_probs - old_lp
    terms = [
        (q[0, 0] - (0.5 + v_a)) ** 2,
        (q[0, 1] - 0.5) ** 2,
        (q[1, 0] - (-0.5 + v_a)) ** 2,
        (q[1, 1] - (-0.5 + math.log(0.8 / 0.7))) ** 2,
        (q[1, 2] - (-0.5)) ** 2,
    ]
    assert float(loss) == pytest.approx(sum(terms) / 5, rel=1e-12)


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="rover_action_set"):
        ROVER(rover_action_set="leaves")
    with pytest.raises(ValueError, match="num_generations"):
        ROVER(num_generations=1)
