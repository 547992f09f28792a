"""Pass@k training and UCPO (core.rl.passk, core.rl.ucpo) against their authors' lines
(tests/core/authors_reference.py: repository, file and commit there), on hand-made groups with
the edge cases (all correct, all wrong, one correct) and on random ones, and by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.rl.batch import RLBatch
from raptb.core.rl.grpo import GRPO
from raptb.core.rl.passk import PassK, passk_advantages
from raptb.core.rl.ucpo import UCPO, ucpo_advantages
from tests.core import authors_reference as authors

# one group per row of 8: all correct, all wrong, one correct, a mix, a certain pass@k (c > n - k)
GROUPS = [
    [1, 1, 1, 1, 1, 1, 1, 1],
    [0, 0, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 0, 0, 0, 0],
    [1, 0, 1, 1, 0, 0, 1, 0],
    [1, 1, 1, 1, 1, 1, 0, 1],
]


def _passk_by_authors(rewards: np.ndarray, n: int, k: int) -> np.ndarray:
    return np.concatenate([authors.passk_calc_adv(g, k) for g in rewards.reshape(-1, n)])


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_passk_matches_the_authors_on_the_edge_cases(k):
    rewards = np.array(GROUPS, dtype=np.float64).reshape(-1)
    adv, sigma = passk_advantages(rewards, 8, k)
    np.testing.assert_allclose(adv, _passk_by_authors(rewards, 8, k), rtol=1e-12, atol=1e-12)
    assert np.all(adv[:16] == 0.0)  # all correct, all wrong: no signal
    assert np.all(sigma[:16] == 0.0)
    torch_adv, _ = passk_advantages(torch.tensor(rewards), 8, k)
    np.testing.assert_allclose(torch_adv.numpy(), adv, rtol=1e-12, atol=1e-15)


def test_passk_by_hand():
    # n = 4, k = 2, one correct: rho = 1 - C(3,2)/C(4,2) = 1/2, sigma = 1/2;
    # A+ = (1/2) / (1/2 + 1e-6), A- = (1/2 - C(2,1)/C(3,1)) / (1/2 + 1e-6) = (-1/6) / (...)
    adv, sigma = passk_advantages(np.array([0.0, 2.5, 0.0, 0.0]), 4, 2)  # reward > 0: correct
    s = 0.5 + 1e-6
    np.testing.assert_allclose(adv, [-1 / 6 / s, 0.5 / s, -1 / 6 / s, -1 / 6 / s], rtol=1e-14)
    np.testing.assert_allclose(sigma, [0.5] * 4)
    # k = 1 is GRPO's mean-centred advantage over the Bernoulli std (no Bessel correction)
    adv, _ = passk_advantages(np.array([1.0, 0.0, 0.0, 1.0]), 4, 1)
    np.testing.assert_allclose(adv, np.array([0.5, -0.5, -0.5, 0.5]) / s, rtol=1e-14)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 10),
    groups=st.integers(1, 3),
    data=st.data(),
)
def test_passk_matches_the_authors_on_random_groups(n, groups, data):
    k = data.draw(st.integers(1, n))
    bits = data.draw(
        st.lists(st.sampled_from([0.0, 1.0]), min_size=n * groups, max_size=n * groups)
    )
    rewards = np.array(bits)
    adv, _ = passk_advantages(rewards, n, k)
    np.testing.assert_allclose(adv, _passk_by_authors(rewards, n, k), rtol=1e-12, atol=1e-12)


def _action_layout(lengths: list[int], log_probs: list[float], width: int) -> tuple:
    """[B, width] old log-probs whose row sums are ``log_probs``, spread over tau + 1 actions,
    garbage after tau, and the authors' response mask of the same rows."""
    rng = np.random.default_rng(1)
    b = len(lengths)
    old = rng.normal(size=(b, width))
    mask = np.zeros((b, width))
    for i, (tau, lp) in enumerate(zip(lengths, log_probs, strict=True)):
        parts = rng.dirichlet(np.ones(tau + 1)) * lp
        old[i, : tau + 1] = parts
        mask[i, : tau + 1] = 1.0
        old[i, tau + 1 :] = np.nan
    return old, mask


def _ucpo_by_authors(rewards, old, mask, n, tau, alpha) -> np.ndarray:
    b, width = old.shape
    token_rewards = np.zeros((b, width))
    token_rewards[:, 0] = rewards  # their scores are the row sums of the token rewards
    out = authors.ucpo_invq_advantages(
        torch.tensor(token_rewards),
        torch.tensor(mask),
        torch.tensor(np.nan_to_num(old) * mask),
        torch.arange(b) // n,
        tau=tau,
        alpha=alpha,
    )
    return out.numpy()


@pytest.mark.parametrize(("tau", "alpha"), [(0.2, 0.0), (1.0, 0.0), (0.0, 0.0), (0.5, 0.3)])
def test_ucpo_matches_the_authors_on_the_edge_cases(tau, alpha):
    rng = np.random.default_rng(0)
    rewards = np.array(GROUPS, dtype=np.float64).reshape(-1)
    lengths = rng.integers(0, 6, size=rewards.size).tolist()
    seq = (-rng.uniform(0.5, 12.0, size=rewards.size)).tolist()
    old, mask = _action_layout(lengths, seq, 7)
    adv, std = ucpo_advantages(
        rewards, np.sum(np.nan_to_num(old) * mask, axis=1), np.array(lengths) + 1, 8, tau, alpha
    )
    expected = _ucpo_by_authors(rewards, old, mask, 8, tau, alpha)
    np.testing.assert_allclose(adv, expected, rtol=1e-12, atol=1e-12)
    if alpha == 0.0:
        assert np.all(adv[:16] == 0.0)  # all correct, all wrong: no signal
    # one correct sample: no redistribution, GRPO's advantages (the authors' std + 1e-8)
    grpo_adv = (rewards[16:24] - 1 / 8) / (np.std(rewards[16:24], ddof=1) + 1e-8)
    if alpha == 0.0:
        np.testing.assert_allclose(adv[16:24], grpo_adv, rtol=1e-12)
    # the correct set keeps its total advantage
    group = slice(24, 32)
    correct = rewards[group] > 0
    base = (1 - rewards[group].mean()) / (np.std(rewards[group], ddof=1) + 1e-8)
    assert adv[group][correct].sum() == pytest.approx(base * correct.sum(), rel=1e-12)
    np.testing.assert_allclose(std[group], np.std(rewards[group], ddof=1))


def test_ucpo_by_hand():
    # one group of 3, two correct with length-normalised log-probs -1 and -2 (q = softmax):
    # q = (e^-1, e^-2) / (e^-1 + e^-2); with tau = 1 each correct advantage is A |C| (1/q_i) /
    # sum 1/q, so the less likely one gets the larger share
    rewards = np.array([1.0, 1.0, 0.0])
    a = (1 - 2 / 3) / (np.std(rewards, ddof=1) + 1e-8)
    q = np.array([math.exp(-1), math.exp(-2)])
    q /= q.sum()
    share = (1 / q) / (1 / q).sum()
    adv, _ = ucpo_advantages(rewards, np.array([-2.0, -6.0, -1.0]), np.array([2, 3, 1]), 3, 1.0)
    np.testing.assert_allclose(adv[:2], a * 2 * share, rtol=1e-12)
    assert adv[1] > adv[0]
    np.testing.assert_allclose(adv[2], -2 / 3 / (np.std(rewards, ddof=1) + 1e-8), rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 6),
    groups=st.integers(1, 3),
    tau=st.sampled_from([0.0, 0.2, 0.7, 1.0]),
    alpha=st.sampled_from([0.0, 0.1, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_ucpo_matches_the_authors_on_random_groups(n, groups, tau, alpha, seed):
    rng = np.random.default_rng(seed)
    b = n * groups
    rewards = rng.choice([0.0, 1.0], size=b)
    lengths = rng.integers(0, 5, size=b).tolist()
    seq = (-rng.exponential(4.0, size=b)).tolist()
    old, mask = _action_layout(lengths, seq, 6)
    adv, _ = ucpo_advantages(
        rewards, np.sum(np.nan_to_num(old) * mask, axis=1), np.array(lengths) + 1, n, tau, alpha
    )
    expected = _ucpo_by_authors(rewards, old, mask, n, tau, alpha)
    np.testing.assert_allclose(adv, expected, rtol=1e-10, atol=1e-10)


def test_the_losses_are_grpo_on_their_advantages():
    rng = np.random.default_rng(3)
    rewards = np.array(GROUPS[3] + GROUPS[2], dtype=np.float64)
    lengths = rng.integers(0, 4, size=16)
    logp = np.log(rng.uniform(0.05, 1.0, size=(16, 5)))
    batch = RLBatch(log_probs=logp, old_log_probs=logp.copy(), rewards=rewards, length=lengths)
    for objective in (
        PassK(pass_k=3, loss_type="grpo"),
        UCPO(ucpo_tau=0.6, loss_type="bnpo", ucpo_alpha=0.2),
    ):
        loss, diag = objective(batch)
        seq = np.sum(batch.masked(logp), axis=1)
        adv = objective.advantages(rewards, seq, lengths + 1)
        expected, _ = GRPO(loss_type=objective.loss_type)(batch, advantages=adv)
        assert float(loss) == pytest.approx(float(expected), rel=1e-12)
        assert diag["advantage_abs_mean"] == pytest.approx(np.mean(np.abs(adv[0])))


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="pass_k"):
        PassK(num_generations=4, pass_k=5)
    with pytest.raises(ValueError, match="pass_k"):
        PassK(pass_k=0)
    with pytest.raises(ValueError, match="ucpo_tau"):
        UCPO(ucpo_tau=1.5)
    with pytest.raises(ValueError, match="sequence log-probs"):
        UCPO().advantages(np.zeros(8))
