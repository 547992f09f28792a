"""GRPO's entropy bonus and TRL's adaptive entropy control (core.rl.grpo, core.rl.entropy) against
TRL's lines (tests/core/authors_reference.py: file and commit there)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.rl.batch import RLBatch
from raptb.core.rl.entropy import AdaptiveEntropy
from raptb.core.rl.grpo import GRPO, LOSS_TYPES
from tests.core import authors_reference as trl


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    loss_type=st.sampled_from(LOSS_TYPES),
    grad_accum=st.integers(1, 3),
    coef=st.sampled_from([0.01, 0.5]),
)
def test_entropy_term_over_a_step_is_trls(seed, loss_type, grad_accum, coef):
    """Over a window of grad_accum micro-batches, raptb's losses weighted 1 / grad_accum (the
    trainer's) minus their entropy-free losses are -coef times TRL's entropy terms summed."""
    rng = np.random.default_rng(seed)
    b, width = 4, 5
    mbs = []
    for _ in range(grad_accum):
        length = rng.integers(0, width, size=b)
        logp = np.log(rng.uniform(0.05, 1.0, size=(b, width)))
        entropy = rng.uniform(0.0, 3.0, size=(b, width))
        entropy[np.arange(width)[None, :] > length[:, None]] = np.nan  # never read
        mbs.append((length, logp, entropy))
    num_items = sum(int(length.sum()) + b for length, _, _ in mbs)
    raptb_total, trl_total = 0.0, 0.0
    for length, logp, entropy in mbs:
        batch = RLBatch(
            log_probs=logp,
            old_log_probs=logp.copy(),
            rewards=rng.normal(size=b),
            length=length,
            entropy=entropy,
        )
        kwargs = dict(num_items_in_batch=num_items, grad_accum=grad_accum)
        with_h, diag = GRPO(num_generations=2, loss_type=loss_type, entropy_coef=coef)(
            batch, **kwargs
        )
        without, _ = GRPO(num_generations=2, loss_type=loss_type)(batch, **kwargs)
        raptb_total += (float(with_h) - float(without)) / grad_accum
        mask = torch.tensor(np.arange(width)[None, :] <= length[:, None], dtype=torch.float64)
        h = torch.tensor(np.nan_to_num(entropy))
        trl_total += -coef * float(
            trl.trl_entropy_loss(h, mask, loss_type, num_items, 1, grad_accum)
        )
        assert diag["policy_loss"] == pytest.approx(float(without), rel=1e-12)
    assert raptb_total == pytest.approx(trl_total, rel=1e-10, abs=1e-12)
    # summed over the window, the term is -coef times the window's mean per-action entropy
    entropies = [
        h for length, _, e in mbs for row, n in zip(e, length, strict=True) for h in row[: n + 1]
    ]
    if loss_type in ("dapo", "cispo"):
        assert raptb_total == pytest.approx(-coef * float(np.mean(entropies)), rel=1e-10)


def test_entropy_gradient_by_hand():
    # bnpo on one micro-batch: d(-c H_mean)/d H_{b,t} = -c / (number of actions); padding: 0
    h = torch.tensor([[0.7, 0.3], [0.2, 9.0]], dtype=torch.float64, requires_grad=True)
    lp = np.array([[-0.5, -1.0], [-2.0, 0.0]])
    batch = RLBatch(
        log_probs=torch.tensor(lp),
        old_log_probs=torch.tensor(lp),
        rewards=torch.tensor([1.0, 3.0], dtype=torch.float64),
        length=torch.tensor([1, 0]),
        entropy=h,
    )
    loss, diag = GRPO(num_generations=2, loss_type="bnpo", entropy_coef=0.5)(batch)
    loss.backward()
    np.testing.assert_allclose(h.grad.numpy(), [[-0.5 / 3, -0.5 / 3], [-0.5 / 3, 0.0]])
    assert diag["entropy"] == pytest.approx(0.4)
    # the coefficient passed in by the adaptive controller replaces the field's; 0 drops the term
    off, _ = GRPO(num_generations=2, use_adaptive_entropy=True)(batch, entropy_coef=0.0)
    no_entropy = dataclasses.replace(batch, entropy=None)
    assert float(off) == pytest.approx(float(GRPO(num_generations=2)(no_entropy)[0]))
    with pytest.raises(ValueError, match="use_adaptive_entropy needs the per-state entropy"):
        GRPO(num_generations=2, use_adaptive_entropy=True)(no_entropy)


@settings(max_examples=40, deadline=None)
@given(
    entropies=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=30),
    coef=st.sampled_from([0.0, 0.01, 0.2]),
    target=st.sampled_from([0.1, 0.2, 0.3]),
)
def test_adaptive_entropy_is_trls_controller(entropies, coef, target):
    ours = AdaptiveEntropy(coef, target, 0.005, 0.0, 0.05)
    theirs = trl.TRLAdaptiveEntropy(coef, target, 0.005, 0.0, 0.05)
    assert ours.applied == theirs.apply_coef() == 0.0  # nothing applies before a measurement
    for h in entropies:
        ours.update(h)
        theirs.step(torch.tensor([h * 7.0, 7.0], dtype=torch.float64))
        assert ours.coef == pytest.approx(theirs.entropy_coef, abs=1e-15)
        assert ours.applied == pytest.approx(theirs.apply_coef(), abs=1e-15)
        assert math.isfinite(ours.last_entropy)


def test_adaptive_entropy_by_hand():
    # at the target counts as below it (TRL: <=); bounded by entropy_coef_min/max
    control = AdaptiveEntropy(0.01, 0.2, 0.005, 0.0, 0.012)
    control.update(0.2)
    assert (control.coef, control.applied) == (0.012, 0.012)
    control.update(0.5)
    assert control.coef == pytest.approx(0.007) and control.applied == 0.0
    control.update(0.9)
    control.update(0.9)
    assert control.coef == 0.0
