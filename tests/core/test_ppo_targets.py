"""PPO's loss on rows of a larger rollout: advantages, returns and KL fixed once over every row
(TRL's whole-batch whitening before the PPO epochs), checked against the float64 loop reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.rl.batch import RLBatch
from raptb.core.rl.ppo import PPO
from tests.core import rl_reference as ref
from tests.core.test_rl_losses import PPO_CONFIGS, random_arrays, tiny_ppo_batch


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    b=st.integers(2, 6),
    t=st.integers(0, 5),
    cfg=PPO_CONFIGS,
    data=st.data(),
)
def test_loss_on_rows_with_targets_of_the_whole_batch(seed, b, t, cfg, data):
    d = random_arrays(seed, b, t)
    rows = sorted(data.draw(st.sets(st.integers(0, b - 1), min_size=1)))
    ppo = PPO(**cfg)
    targets = ppo.advantages(RLBatch(**d))
    part = RLBatch(**{k: v[rows] for k, v in d.items()})
    picked = tuple(None if x is None else x[rows] for x in targets)
    loss, _ = ppo(part, picked)
    fields = ("log_probs", "old_log_probs", "ref_log_probs", "rewards", "length", "values")
    expected = ref.ppo_loss(*(d[k] for k in fields), d["old_values"], cfg, rows=rows)
    assert float(loss) == pytest.approx(expected, rel=1e-9, abs=1e-10)


def test_given_targets_replace_the_batchs_own():
    batch = tiny_ppo_batch()
    ppo = PPO(kl_coef=0.0, whiten_advantages=False)
    own, _ = ppo(batch)
    assert float(ppo(batch, ppo.advantages(batch))[0]) == float(own)
    # A = [1, -1], G = [0.5, 1]: rho = [e^0.1, e^-0.3]; -A rho = [-1.105, 0.741] vs clipped
    # [-1.105, 0.8] -> pg = (-e^0.1 + 0.8) / 2; values [0.9, 0.5] clipped to [0.7, 0.45]
    adv, ret = np.array([[1.0, -1.0]]), np.array([[0.5, 1.0]])
    loss, diag = ppo(batch, (adv, ret, None))
    vf = 0.5 * (max(0.4**2, 0.2**2) + max(0.5**2, 0.55**2)) / 2
    assert diag["policy_loss"] == pytest.approx((-np.exp(0.1) + 0.8) / 2)
    assert diag["value_loss"] == pytest.approx(vf)
    assert float(loss) == pytest.approx((-np.exp(0.1) + 0.8) / 2 + 0.1 * vf)
    with pytest.raises(ValueError, match="targets: advantages has shape"):
        ppo(batch, (adv[:, :1], ret, None))
