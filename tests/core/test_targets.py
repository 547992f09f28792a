"""Absorbed suffix targets: reference equality and the invariants of objectives.md."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.gfn.targets import absorbed_targets
from tests.core.reference import targets_row


@st.composite
def rewards(draw):
    b = draw(st.integers(1, 5))
    t = draw(st.integers(0, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1.0, 50.0, 100.0]))
    u = np.where(rng.random((b, t + 1)) < 0.4, rng.uniform(-scale, scale, (b, t + 1)), 0.0)
    length = rng.integers(0, t + 1, size=b)
    return u, length


params = st.fixed_dictionaries(
    {
        "alpha": st.floats(0.0, 1.0),
        "beta": st.floats(0.05, 20.0),
        "rho": st.floats(0.0, 3.0),
        "horizon": st.none() | st.integers(1, 13),
    }
)


@settings(max_examples=100, deadline=None)
@given(rewards(), params, st.sampled_from(["max", "soft", "mix"]))
def test_matches_reference(ul, p, mode):
    u, length = ul
    got = absorbed_targets(u, length, mode=mode, **p)
    for b in range(len(length)):
        h = int(length[b]) if p["horizon"] is None else min(int(length[b]), p["horizon"])
        want = targets_row(list(u[b]), h, p["alpha"], p["beta"], p["rho"], mode)
        for k, w in enumerate(want):
            if math.isinf(w):
                assert got[b, k] == -math.inf
            else:
                assert got[b, k] == pytest.approx(w, rel=1e-9, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(rewards(), params)
def test_invariants(ul, p):
    u, length = ul
    u_max = absorbed_targets(u, length, mode="max", **p)
    u_soft = absorbed_targets(u, length, mode="soft", **p)
    u_tgt = absorbed_targets(u, length, mode="mix", **p)
    cols = np.arange(u.shape[1])
    h = length if p["horizon"] is None else np.minimum(length, p["horizon"])
    inside = cols[None, :] <= h[:, None]
    tol = 1e-9 * (1 + np.abs(u))
    assert np.all(u_max[inside] >= u[inside] - tol[inside])
    assert np.all(u_soft[inside] >= u[inside] - tol[inside])
    assert np.all(u_tgt[inside] >= u[inside] - tol[inside])
    window = (h[:, None] - cols[None, :] + 1).astype(float)
    bound = u_max + np.log(np.where(inside, window, 1.0)) / p["beta"]
    assert np.all(u_soft[inside] <= bound[inside] + tol[inside])
    assert np.all(np.isneginf(u_tgt[~inside]))


@settings(max_examples=50, deadline=None)
@given(st.floats(-50, 50), st.integers(0, 8), st.integers(0, 8), st.floats(0.0, 2.0))
def test_single_reward_with_large_beta_discounts_by_distance(big_u, k, d, rho):
    # One non-zero reward U at distance d from k: as beta grows u_soft_k tends to the best
    # distance-discounted reward, U - rho d when that beats every discounted zero.
    t = k + d + 2
    u = np.zeros((1, t + 1))
    u[0, k + d] = big_u
    got = absorbed_targets(u, np.array([t]), alpha=0.0, beta=1e4, rho=rho, mode="soft")[0, k]
    zeros = [-rho * (j - k) for j in range(k, t + 1) if j != k + d]
    assert got == pytest.approx(max([big_u - rho * d, *zeros]), abs=1e-3)


def test_hand_computed_example():
    u = np.array([[0.0, 0.0, 50.0, 0.0]])
    got = absorbed_targets(u, np.array([3]), alpha=0.8, beta=3.0, rho=0.5)
    # k = 0: max 50; soft = log(e^0 + e^-1.5 + e^(150-3) + e^-4.5)/3 ~= 49 + tiny.
    soft0 = math.log(1 + math.exp(-1.5) + math.exp(147) + math.exp(-4.5)) / 3
    assert got[0, 0] == pytest.approx(0.8 * 50 + 0.2 * soft0)
    assert got[0, 3] == pytest.approx(0.8 * 0 + 0.2 * 0.0)


def test_torch_matches_numpy_and_handles_float32_overflow_range():
    rng = np.random.default_rng(1)
    u = np.where(rng.random((64, 17)) < 0.3, 100.0, 0.0)
    length = rng.integers(0, 17, 64)
    want = absorbed_targets(u, length, 0.5, 5.0, 0.1)
    got = absorbed_targets(
        torch.tensor(u, dtype=torch.float32), torch.tensor(length), 0.5, 5.0, 0.1
    )
    assert np.allclose(got.numpy(), want.astype(np.float32), rtol=1e-5, equal_nan=False)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"alpha": 2.0}, "alpha"),
        ({"beta": 0.0}, "beta"),
        ({"rho": -1.0}, "rho"),
        ({"horizon": 0}, "horizon"),
        ({"mode": "avg"}, "target"),
    ],
)
def test_bad_arguments(kwargs, field):
    args = {"alpha": 0.5, "beta": 1.0, "rho": 0.0, **kwargs}
    with pytest.raises(ValueError, match=field):
        absorbed_targets(np.zeros((1, 3)), np.array([2]), **args)
