"""G²RPO (core.rl.g2rpo), raptb's reading of the abstract (the paper's formula is not public):
GRPO's advantages plus lambda min(1 / (n pi_old(y)), c) on the correct rows. Held to values
computed by hand, to a slow per-row reference on random groups (NumPy and torch), and to the
property the bonus is built for: without the cap, its expected policy-gradient term is the same
push on every correct text, lambda sum_{y in Y*} grad log pi(y), computed by enumeration on a
categorical policy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.rl.g2rpo import G2RPO, g2rpo_bonus
from raptb.core.rl.grpo import GRPO

STD_EPS = 1e-4  # TRL's, added to GRPO's group std


def _reference(rewards, log_probs, n, weight, cap):
    """One row at a time: GRPO's group-normalised reward (Bessel std + 1e-4) plus the bonus."""
    out = []
    for g in range(0, len(rewards), n):
        r = rewards[g : g + n]
        mean = sum(r) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (n - 1))
        for x, lp in zip(r, log_probs[g : g + n], strict=True):
            bonus = weight * min(1.0 / (n * math.exp(lp)), cap) if x > 0 else 0.0
            out.append((x - mean) / (std + STD_EPS) + bonus)
    return out


def test_g2rpo_by_hand():
    # one group of 4: two correct with pi_old 0.5 and 0.01, two wrong; lambda 0.1, cap 10
    rewards = np.array([1.0, 0.0, 1.0, 0.0])
    log_probs = np.log([0.5, 0.1, 0.01, 0.2])
    adv, std = G2RPO(num_generations=4, g2rpo_lambda=0.1, g2rpo_cap=10.0).advantages(
        rewards, log_probs
    )
    s = math.sqrt(1 / 3) + STD_EPS  # Bessel std of (1, 0, 1, 0)
    # 1 / (4 x 0.5) = 0.5 -> bonus 0.05; 1 / (4 x 0.01) = 25 -> capped at 10 -> bonus 1
    np.testing.assert_allclose(adv, [0.5 / s + 0.05, -0.5 / s, 0.5 / s + 1.0, -0.5 / s], rtol=1e-12)
    np.testing.assert_allclose(std, [math.sqrt(1 / 3)] * 4, rtol=1e-12)


def test_g2rpo_edge_cases():
    objective = G2RPO(num_generations=4, g2rpo_lambda=0.2, g2rpo_cap=3.0)
    # all wrong: GRPO's zero advantages, no bonus
    adv, _ = objective.advantages(np.zeros(4), np.log([0.1, 0.2, 0.3, 0.4]))
    np.testing.assert_array_equal(adv, np.zeros(4))
    # all correct: GRPO's advantages are 0; the bonus alone, the likeliest text the least
    adv, _ = objective.advantages(np.ones(4), np.log([0.9, 0.02, 0.05, 0.5]))
    np.testing.assert_allclose(adv, [0.2 / 3.6, 0.6, 0.6, 0.1], rtol=1e-12)
    # one correct: GRPO's 0.75 / (std + eps), the others -0.25 / (...)
    adv, _ = objective.advantages(np.array([0.0, 0.0, 2.0, 0.0]), np.log([0.3, 0.3, 0.25, 0.1]))
    s = math.sqrt(1.0) + STD_EPS  # Bessel std of (0, 0, 2, 0) is 1
    np.testing.assert_allclose(adv, [-0.5 / s, -0.5 / s, 1.5 / s + 0.2, -0.5 / s], rtol=1e-12)


def test_g2rpo_without_weight_is_grpo():
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    log_probs = np.log(np.linspace(0.01, 0.4, 8))
    adv, std = G2RPO(num_generations=4, g2rpo_lambda=0.0).advantages(rewards, log_probs)
    want, want_std = GRPO(num_generations=4).advantages(rewards)
    np.testing.assert_array_equal(adv, want)
    np.testing.assert_array_equal(std, want_std)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 8),
    groups=st.integers(1, 4),
    weight=st.floats(0.0, 2.0),
    cap=st.floats(0.5, 1e3),
    data=st.data(),
)
def test_g2rpo_matches_the_slow_reference(n, groups, weight, cap, data):
    b = n * groups
    rewards = data.draw(st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=b, max_size=b))
    log_probs = data.draw(st.lists(st.floats(-30.0, 0.0), min_size=b, max_size=b))
    want = _reference(rewards, log_probs, n, weight, cap)
    objective = G2RPO(num_generations=n, g2rpo_lambda=weight, g2rpo_cap=cap)
    adv, _ = objective.advantages(np.array(rewards), np.array(log_probs))
    np.testing.assert_allclose(adv, want, rtol=1e-10, atol=1e-10)
    torch_adv, _ = objective.advantages(
        torch.tensor(rewards, dtype=torch.float64), torch.tensor(log_probs, dtype=torch.float64)
    )
    np.testing.assert_allclose(torch_adv.numpy(), want, rtol=1e-10, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(
    logits=st.lists(st.floats(-4.0, 4.0), min_size=3, max_size=7),
    correct=st.lists(st.booleans(), min_size=7, max_size=7),
    n=st.integers(1, 8),
)
def test_expected_bonus_gradient_is_the_same_push_on_every_correct_text(logits, correct, n):
    # a categorical policy over K texts with logits theta: grad log pi(y) = e_y - pi. The n
    # samples of a group are independent, so E[sum_i b(y_i) grad log pi(y_i)] =
    # n sum_y pi(y) b(y) grad log pi(y); uncapped (cap above every 1 / (n pi(y))), that is
    # lambda sum_{y correct} (e_y - pi), whatever the probabilities
    theta = np.array(logits)
    k = len(theta)
    pi = np.exp(theta - theta.max())
    pi /= pi.sum()
    is_correct = np.array(correct[:k])
    rewards = is_correct.astype(np.float64)
    bonus = g2rpo_bonus(rewards, np.log(pi), n, 0.3, 1e12)
    scores = np.eye(k) - pi[None, :]  # row y: grad log pi(y)
    expected = n * (pi[:, None] * bonus[:, None] * scores).sum(axis=0)
    push = 0.3 * scores[is_correct].sum(axis=0)
    np.testing.assert_allclose(expected, push, rtol=1e-9, atol=1e-9)


def test_g2rpo_needs_log_probs_and_checks_its_fields():
    with pytest.raises(ValueError, match="sequence log-probs"):
        G2RPO(num_generations=2).advantages(np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="g2rpo_lambda"):
        G2RPO(g2rpo_lambda=-0.1)
    with pytest.raises(ValueError, match="g2rpo_cap"):
        G2RPO(g2rpo_cap=0.0)
