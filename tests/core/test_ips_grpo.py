"""IPS-GRPO (core.rl.ips_grpo) held to the paper's equations (Sinha, Elango and Liu 2026, arXiv
2601.21669), transcribed below row by row in plain Python, on hand-made groups (all correct, all
wrong, one correct, duplicated outcomes), on random groups (Hypothesis, NumPy and torch), and to
the flow the correction is built for (Sec. 4, Eq. (5)): at the reward-proportional policy the
expected IPS update of every logit is the same, so the softmax does not move.

The paper's lines as transcribed (the section and equation numbers as a published review of the
paper quotes them; docs/rl-baselines.md):

- Sec. 3, Eq. (2): the expected-return flow dz_x/dt = p_x a_x (a_x = r_x - sum_k p_k r_k);
- Sec. 4, Eq. (5): the IPS flow dz_x/dt = r_x - p_x sum_k r_k, fixed point p_x = r_x / sum_k r_k;
- Sec. 4, Eq. (9): the group estimate p^(x) = max(n(x) / G, epsilon), n(x) the outcome's count;
- Algorithm 1: r~_g = r_g / p^(x_g) (lines 4-5), then "a standard GRPO update using r~_g (all
  other terms and steps remain unchanged)" (line 6): raptb's GRPO, TRL's group normalisation
  A_g = (r~_g - mean r~) / (Bessel std r~ + 1e-4).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.rl.ips_grpo import IPSGRPO

GRPO_STD_EPS = 1e-4  # TRL's, added to GRPO's group std


def paper_advantages(rewards, outcomes, G, epsilon):
    """Algorithm 1 with Eq. (9), one group of G rows at a time."""
    out = []
    for start in range(0, len(rewards), G):
        r, x = rewards[start : start + G], outcomes[start : start + G]
        p_hat = [max(sum(1 for y in x if y == xi) / G, epsilon) for xi in x]  # Eq. (9)
        r_tilde = [ri / pi for ri, pi in zip(r, p_hat, strict=True)]  # Algorithm 1
        mean = sum(r_tilde) / G  # line 6: GRPO on r~
        std = math.sqrt(sum((v - mean) ** 2 for v in r_tilde) / (G - 1))
        out += [(v - mean) / (std + GRPO_STD_EPS) for v in r_tilde]
    return out


def ips(rewards, outcomes, G=4, epsilon=0.01):
    adv, _ = IPSGRPO(num_generations=G, ips_epsilon=epsilon).advantages(
        np.asarray(rewards, dtype=np.float64), outcomes=outcomes
    )
    return adv


def test_all_correct_distinct_outcomes_get_nothing():
    # four different solutions: r~ = 4 r each, all equal, advantages 0 (as GRPO's)
    np.testing.assert_array_equal(ips([50.0] * 4, ["a", "b", "c", "d"]), np.zeros(4))


def test_all_correct_with_a_repeated_outcome_pushes_the_repeat_down():
    # "a" twice: r~ = (100, 100, 200, 200): the repeated solution below the mean, the rare above
    adv = ips([50.0] * 4, ["a", "a", "b", "c"])
    s = math.sqrt(4 * 50.0**2 / 3) + GRPO_STD_EPS  # Bessel std of (100, 100, 200, 200)
    np.testing.assert_allclose(adv, [-50 / s, -50 / s, 50 / s, 50 / s], rtol=1e-12)


def test_all_wrong_gets_nothing():
    np.testing.assert_array_equal(ips([0.0] * 4, ["a", "a", "b", "c"]), np.zeros(4))


def test_one_correct_is_grpos_group():
    # r~ = (0, 0, 4 x 50, 0): the same advantages as GRPO's on (0, 0, 50, 0), scale-free
    # r~ = (0, 0, 200, 0): mean 50, Bessel std sqrt((3 x 50^2 + 150^2) / 3) = 100
    adv = ips([0.0, 0.0, 50.0, 0.0], ["a", "b", "c", "d"])
    s = 100.0 + GRPO_STD_EPS
    np.testing.assert_allclose(adv, [-50 / s, -50 / s, 150 / s, -50 / s], rtol=1e-12)


def test_the_clip_binds_above_one_over_g():
    # epsilon 0.5 > 1 / 4: the singletons' p^ = 0.5, the pair's 0.5 too: r~ all 2 r, advantages 0
    np.testing.assert_array_equal(ips([1.0] * 4, ["a", "a", "b", "c"], epsilon=0.5), np.zeros(4))
    adv = ips([1.0] * 4, ["a", "a", "b", "c"], epsilon=0.3)  # 0.3: singletons 1/0.3, pair 2
    np.testing.assert_allclose(
        adv, paper_advantages([1.0] * 4, ["a", "a", "b", "c"], 4, 0.3), rtol=1e-12
    )


@settings(max_examples=60, deadline=None)
@given(
    groups=st.integers(1, 3),
    G=st.integers(2, 8),
    data=st.data(),
    epsilon=st.sampled_from([1e-3, 0.01, 0.2, 0.5, 1.0]),
    torch_path=st.booleans(),
)
def test_random_groups_are_the_papers(groups, G, data, epsilon, torch_path):
    b = groups * G
    rewards = data.draw(st.lists(st.sampled_from([0.0, 1.0, 50.0, 7.5]), min_size=b, max_size=b))
    outcomes = data.draw(st.lists(st.integers(0, 3), min_size=b, max_size=b))
    texts = [tuple(range(k + 1)) for k in outcomes]  # token sequences, as the algorithm passes
    objective = IPSGRPO(num_generations=G, ips_epsilon=epsilon)
    array = torch.tensor(rewards, dtype=torch.float64) if torch_path else np.array(rewards)
    adv, _ = objective.advantages(array, outcomes=texts)
    expected = paper_advantages(rewards, texts, G, epsilon)
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-12, atol=1e-12)


def test_the_reward_proportional_policy_is_the_fixed_point_of_the_ips_update():
    # Sec. 4, Eq. (5): the expected update of logit z_x under r~ = r / p is
    # sum_y p_y r~_y (1[x = y] - p_x) = r_x - p_x sum_k r_k, zero for all x at p = r / sum r,
    # while GRPO's own reward (Eq. (2)) keeps moving it toward the best outcome
    r = np.array([4.0, 2.0, 1.0, 1.0])
    p = r / r.sum()
    jac = np.diag(p) - np.outer(p, p)  # d p_y / d z_x (softmax)
    ips_drift = jac @ (r / p)
    plain_drift = jac @ r
    np.testing.assert_allclose(ips_drift, r - p * r.sum(), atol=1e-12)
    np.testing.assert_allclose(ips_drift, np.zeros(4), atol=1e-12)
    assert plain_drift[0] > 0 and plain_drift[-1] < 0


def test_needs_outcomes_and_checks_epsilon():
    with pytest.raises(ValueError, match="outcome"):
        IPSGRPO(num_generations=2).advantages(np.ones(2))
    with pytest.raises(ValueError, match="2 outcomes for 4 rows"):
        IPSGRPO(num_generations=2).advantages(np.ones(4), outcomes=["a", "b"])
    for bad in (0.0, 1.5, math.nan):
        with pytest.raises(ValueError, match="ips_epsilon"):
            IPSGRPO(ips_epsilon=bad)
    assert IPSGRPO.reads_outcomes and not IPSGRPO.reads_sequence_log_probs
