"""G²RPO's mode bonus inside a GFlowNet objective (core.gfn.mode_bonus): the sequence
log-probability, the bonus weights and the loss term held to values computed by hand and to a slow
per-row reference on random batches (NumPy and torch); the weights carry no gradient; and the
property the bonus is built for, computed by enumeration on a categorical policy: without the
cap, its expected gradient over the draw is the same push on every correct text,
sum_{y in Y*} grad log pi(y)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.gfn.batch import PrefixBatch
from raptb.core.gfn.mode_bonus import mode_bonus_term, mode_bonus_weights, sequence_log_probs


def _batch(log_pf, log_pterm, length):
    zeros = np.zeros_like(log_pterm)
    return PrefixBatch(log_pf, log_pterm, zeros, zeros, np.asarray(length, dtype=np.int64))


def test_by_hand():
    # two rows of at most 2 tokens: row 0 stops after 2 tokens, row 1 after 1 (its later
    # entries are garbage the sum must not read)
    log_pf = np.array([[-1.0, -2.0], [-0.5, 99.0]])
    log_pterm = np.array([[-7.0, -8.0, -0.25], [-3.0, -0.75, 42.0]])
    batch = _batch(log_pf, log_pterm, [2, 1])
    np.testing.assert_allclose(sequence_log_probs(batch), [-3.25, -1.25], rtol=0, atol=1e-15)
    # pi = 0.01 and 0.5, n = 4: 1 / (4 pi) = 25 (capped at 10) and 0.5
    log_pi = np.log([0.01, 0.5, 0.2])
    b = mode_bonus_weights(log_pi, np.array([True, True, False]), np.array([4.0, 4.0, 4.0]), 10.0)
    np.testing.assert_allclose(b, [10.0, 0.5, 0.0], rtol=1e-12)
    # the term: -lambda mean(b log pi) over the rows
    term = mode_bonus_term(batch, np.array([True, False]), np.array([2.0, 2.0]), 0.3, 1000.0)
    b0 = 1.0 / (2.0 * math.exp(-3.25))
    assert term == pytest.approx(-0.3 * (b0 * -3.25 + 0.0) / 2, rel=1e-12)


def _slow(log_pf, log_pterm, length, eligible, n, weight, cap):
    total = 0.0
    for b in range(len(length)):
        lp = sum(log_pf[b][t] for t in range(length[b])) + log_pterm[b][length[b]]
        w = min(1.0 / (n[b] * math.exp(lp)), cap) if eligible[b] else 0.0
        total += w * lp
    return -weight * total / len(length)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 9),
    t=st.integers(1, 7),
    weight=st.floats(0.0, 2.0),
    cap=st.floats(0.5, 5000.0),
)
def test_random_batches_match_a_slow_reference(seed, rows, t, weight, cap):
    rng = np.random.default_rng(seed)
    log_pf = -rng.exponential(1.0, size=(rows, t))
    log_pterm = -rng.exponential(1.0, size=(rows, t + 1))
    length = rng.integers(0, t + 1, size=rows)
    eligible = rng.random(rows) < 0.6
    n = rng.integers(1, 40, size=rows).astype(np.float64)
    expected = _slow(log_pf, log_pterm, length, eligible, n, weight, cap)
    got = mode_bonus_term(_batch(log_pf, log_pterm, length), eligible, n, weight, cap)
    assert float(got) == pytest.approx(expected, rel=1e-10, abs=1e-12)
    as_torch = PrefixBatch(
        *(torch.as_tensor(a) for a in (log_pf, log_pterm, 0 * log_pterm, 0 * log_pterm)),
        torch.as_tensor(length),
    )
    got_t = mode_bonus_term(as_torch, torch.as_tensor(eligible), torch.as_tensor(n), weight, cap)
    assert float(got_t) == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_the_weights_carry_no_gradient():
    # d term / d log_pf[b, t] = -lambda b_b / B for t < tau_b: b held fixed, as a policy-gradient
    # weight (a gradient through 1 / pi would add -lambda b_b / B a second time, with a minus)
    log_pf = torch.tensor([[-1.0, -0.5], [-2.0, -1.5]], dtype=torch.float64, requires_grad=True)
    log_pterm = torch.tensor([[-1.0, -1.0, -0.1], [-1.0, -0.2, -9.0]], dtype=torch.float64)
    batch = PrefixBatch(log_pf, log_pterm, 0 * log_pterm, 0 * log_pterm, torch.tensor([2, 1]))
    term = mode_bonus_term(
        batch, torch.tensor([True, True]), torch.tensor([3.0, 3.0], dtype=torch.float64), 0.5, 1e6
    )
    term.backward()
    b = [1 / (3 * math.exp(-1.6)), 1 / (3 * math.exp(-2.2))]
    expected = [[-0.5 * b[0] / 2] * 2, [-0.5 * b[1] / 2, 0.0]]
    np.testing.assert_allclose(log_pf.grad.numpy(), expected, rtol=1e-12)


def test_expected_gradient_is_the_same_push_on_every_correct_text():
    # a categorical policy over 6 texts (one token each, then a sure stop), texts 0, 2, 5 correct;
    # n draws: E[sum_i b_i grad log pi(y_i)] = n sum_y pi(y) b(y) grad log pi(y), which without
    # the cap is sum_{y in Y*} grad log pi(y), whatever pi
    logits = torch.tensor([0.3, -1.2, 2.0, 0.1, -0.4, -3.0], dtype=torch.float64)
    correct = torch.tensor([True, False, True, False, False, True])
    n = 8
    log_pi = torch.log_softmax(logits, 0)
    pi = log_pi.exp()
    grads = torch.stack(
        [
            torch.autograd.functional.jacobian(lambda z, y=y: torch.log_softmax(z, 0)[y], logits)
            for y in range(6)
        ]
    )  # [6, 6]: grad log pi(y)
    b = mode_bonus_weights(log_pi, correct, torch.full((6,), float(n), dtype=torch.float64), 1e9)
    expected_push = n * (pi * b) @ grads
    np.testing.assert_allclose(expected_push.numpy(), grads[correct].sum(0).numpy(), atol=1e-12)
    # with a binding cap the push on the rare correct text (pi(5) ~ 0.005) is cut
    b_cap = mode_bonus_weights(log_pi, correct, torch.full((6,), float(n), dtype=torch.float64), 2)
    assert float(n * pi[5] * b_cap[5]) < 0.1


def test_bad_knobs_are_refused():
    batch = _batch(np.zeros((1, 1)), np.zeros((1, 2)), [1])
    with pytest.raises(ValueError, match="mode_bonus_cap"):
        mode_bonus_term(batch, np.array([True]), np.array([1.0]), 0.1, 0.0)
    with pytest.raises(ValueError, match="mode_bonus"):
        mode_bonus_term(batch, np.array([True]), np.array([1.0]), -0.1, 10.0)
