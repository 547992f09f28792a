"""Action layout and RL advantages: hand-computed values and the float64 loop references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.rl.advantages import (
    gae,
    group_advantages,
    kl_estimate,
    masked_whiten,
    token_rewards,
)
from raptb.core.rl.batch import RLBatch, action_log_probs
from tests.core import rl_reference as ref


def test_action_log_probs_puts_the_stop_at_tau():
    log_pf = np.array([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0], [-7.0, -8.0, -9.0]])
    log_pterm = np.array([[-0.1, -0.2, -0.3, -0.4], [-0.5, -0.6, -0.7, -0.8], [-1, -2, -3, -4.0]])
    length = np.array([0, 2, 3])
    out = action_log_probs(log_pf, log_pterm, length)
    np.testing.assert_array_equal(
        out, [[-0.1, 0, 0, 0], [-4.0, -5.0, -0.7, 0], [-7.0, -8.0, -9.0, -4.0]]
    )
    # log pi(sequence) = sum_{t<tau} log_pf + log_pterm[tau]
    np.testing.assert_allclose(out.sum(axis=1), [-0.1, -9.7, -28.0])


def test_group_advantages_by_hand():
    rewards = np.array([1.0, 3.0, 5.0, 5.0])
    adv, std = group_advantages(rewards, 2, "group")
    c = math.sqrt(2.0) + 1e-4  # Bessel std of [1, 3] is sqrt(2); TRL adds 1e-4
    np.testing.assert_allclose(adv, [-1 / c, 1 / c, 0.0, 0.0])
    np.testing.assert_allclose(std, [math.sqrt(2), math.sqrt(2), 0, 0])
    adv, _ = group_advantages(rewards, 2, "none")
    np.testing.assert_allclose(adv, [-1, 1, 0, 0])
    adv, std = group_advantages(rewards, 2, "batch")
    s = float(np.std(rewards, ddof=1))  # batch std, group mean
    np.testing.assert_allclose(adv, [-1 / (s + 1e-4), 1 / (s + 1e-4), 0, 0])
    np.testing.assert_allclose(std, [s] * 4)


def test_group_advantages_rejects_partial_groups_and_bad_scale():
    with pytest.raises(ValueError, match="whole groups"):
        group_advantages(np.zeros(3), 2)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(np.zeros(4), 2, "std")


def test_kl_estimators_by_hand():
    lp, rp = np.array([-1.0]), np.array([-1.5])
    np.testing.assert_allclose(kl_estimate(lp, rp, "k1"), [0.5])
    np.testing.assert_allclose(kl_estimate(lp, rp, "k3"), [math.exp(-0.5) + 0.5 - 1])
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_estimate(lp, rp, "k2")


def test_token_rewards_by_hand():
    kl = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    out = token_rewards(np.array([2.0, -1.0]), np.array([1, 2]), 3, kl, 0.5)
    np.testing.assert_allclose(out, [[-0.05, -0.1 + 2.0, 0.0], [-0.2, -0.25, -0.3 - 1.0]])
    np.testing.assert_allclose(token_rewards(np.array([2.0]), np.array([0]), 3), [[2.0, 0.0, 0.0]])


def test_gae_by_hand():
    # one row, tau = 1: token then stop; R = 1 at the stop; gamma 1, lam 0.95
    rewards = np.array([[0.0, 1.0, 7.0]])  # the 7 after tau is never read
    values = np.array([[0.5, 0.25, 9.0]])
    adv, ret = gae(rewards, values, np.array([1]), gamma=1.0, lam=0.95)
    # delta_1 = 1 - 0.25 = 0.75; delta_0 = 0 + 0.25 - 0.5 = -0.25; A_0 = -0.25 + 0.95 * 0.75
    np.testing.assert_allclose(adv, [[0.4625, 0.75, 0.0]])
    np.testing.assert_allclose(ret, [[0.9625, 1.0, 0.0]])


def test_masked_whiten_by_hand():
    x = np.array([[1.0, 3.0, 100.0]])
    mask = np.array([[True, True, False]])
    # mean 2, Bessel var 2
    np.testing.assert_allclose(
        masked_whiten(x, mask)[0, :2], [-1 / math.sqrt(2 + 1e-8), 1 / math.sqrt(2 + 1e-8)]
    )
    np.testing.assert_allclose(
        masked_whiten(x, mask, shift_mean=False)[0, :2],
        [2 - 1 / math.sqrt(2 + 1e-8), 2 + 1 / math.sqrt(2 + 1e-8)],
    )


def test_rl_batch_validation():
    lp = np.zeros((2, 3))
    ok = {"log_probs": lp, "old_log_probs": lp, "rewards": np.zeros(2), "length": np.array([0, 2])}
    RLBatch(**ok)
    with pytest.raises(ValueError, match="length"):
        RLBatch(**{**ok, "length": np.array([0, 3])})
    with pytest.raises(ValueError, match="old_log_probs"):
        RLBatch(**{**ok, "old_log_probs": np.zeros((2, 4))})
    with pytest.raises(ValueError, match="rewards"):
        RLBatch(**{**ok, "rewards": np.array([0.0, np.nan])})
    bad = lp.copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="log_probs"):
        RLBatch(**{**ok, "log_probs": bad})
    bad[0, 0], bad[0, 1] = 0.0, np.inf  # after tau = 0: never read, accepted
    RLBatch(**{**ok, "log_probs": bad})
    with pytest.raises(ValueError, match="namespace"):
        RLBatch(**{**ok, "rewards": torch.zeros(2)})


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    groups=st.integers(1, 4),
    g=st.integers(1, 5),
    scale=st.sampled_from(["group", "batch", "none"]),
)
def test_group_advantages_match_reference(seed, groups, g, scale):
    rng = np.random.default_rng(seed)
    rewards = rng.choice([0.0, 1.0, 2.5, -3.0], size=groups * g) * rng.uniform(0.5, 50)
    adv, std = group_advantages(rewards, g, scale)
    ref_adv, ref_std = ref.group_advantages(list(rewards), g, scale)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(std, ref_std, rtol=1e-10, atol=1e-12)
    t_adv, _ = group_advantages(torch.tensor(rewards), g, scale)
    np.testing.assert_allclose(t_adv.numpy(), adv, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    b=st.integers(1, 5),
    t=st.integers(0, 7),
    gamma=st.sampled_from([1.0, 0.99, 0.5, 0.0]),
    lam=st.sampled_from([1.0, 0.95, 0.0]),
)
def test_gae_matches_backward_recursion(seed, b, t, gamma, lam):
    rng = np.random.default_rng(seed)
    length = rng.integers(0, t + 1, size=b)
    length[0] = t
    rewards = rng.normal(size=(b, t + 1)) * 10
    values = rng.normal(size=(b, t + 1)) * 10
    cols = np.arange(t + 1)[None, :]
    dirty_r = np.where(cols <= length[:, None], rewards, np.inf)
    adv, ret = gae(dirty_r, values, length, gamma, lam)
    for i in range(b):
        n = int(length[i]) + 1
        ra, rr = ref.gae_row(list(rewards[i, :n]), list(values[i, :n]), gamma, lam)
        np.testing.assert_allclose(adv[i, :n], ra, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(ret[i, :n], rr, rtol=1e-9, atol=1e-9)
        assert np.all(adv[i, n:] == 0) and np.all(ret[i, n:] == 0)
    t_adv, _ = gae(torch.tensor(rewards), torch.tensor(values), torch.tensor(length), gamma, lam)
    np.testing.assert_allclose(t_adv.numpy(), gae(rewards, values, length, gamma, lam)[0])


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), b=st.integers(1, 4), t=st.integers(0, 5), shift=st.booleans()
)
def test_masked_whiten_matches_reference(seed, b, t, shift):
    rng = np.random.default_rng(seed)
    length = rng.integers(0, t + 1, size=b)
    x = rng.normal(size=(b, t + 1)) * 5 + 3
    mask = np.arange(t + 1)[None, :] <= length[:, None]
    out = masked_whiten(x, mask, shift_mean=shift)
    expected = ref.whiten(list(x[mask]), shift_mean=shift)
    np.testing.assert_allclose(out[mask], expected, rtol=1e-9, atol=1e-9)
