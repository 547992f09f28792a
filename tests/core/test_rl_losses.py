"""GRPO and PPO losses: hand-computed tiny batches, float64 loop references, torch gradients."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.rl.batch import RLBatch
from raptb.core.rl.grpo import GRPO, LOSS_TYPES
from raptb.core.rl.ppo import PPO
from tests.core import rl_reference as ref

C = math.sqrt(2.0) + 1e-4  # group std of rewards [1, 3] plus TRL's 1e-4


def tiny_grpo_batch(**overrides) -> RLBatch:
    """One group of two: row 0 = one token then stop (2 actions), row 1 = stop only (1 action).

    rewards [1, 3] give advantages [-1/C, +1/C]; on-policy (old = current) unless overridden.
    """
    lp = np.array([[-0.5, -1.0], [-2.0, 0.0]])
    fields = {
        "log_probs": lp,
        "old_log_probs": lp.copy(),
        "rewards": np.array([1.0, 3.0]),
        "length": np.array([1, 0]),
    }
    return RLBatch(**{**fields, **overrides})


def _torch(batch: RLBatch, grad: tuple[str, ...] = ()) -> RLBatch:
    """The same batch as float64 torch tensors, ``grad`` fields requiring gradients."""
    out = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if v is not None:
            out[f.name] = torch.tensor(v, requires_grad=f.name in grad)
    return RLBatch(**out)


@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [
        ("grpo", 0.0),  # per-row means -A_b, then mean over rows: (1/C - 1/C) / 2
        ("bnpo", 1 / (3 * C)),  # (2 * (1/C) - 1/C) / 3 actions
        ("dr_grpo", 1 / (4 * C)),  # same sum / (B = 2 * width 2)
        ("dapo", 1 / (3 * C)),  # without the window count: this micro-batch's 3 actions
        ("luspo", 1 / (2 * C)),  # (2/C - 1/C) / 2 rows
    ],
)
def test_grpo_on_policy_by_hand(loss_type, expected):
    loss, diag = GRPO(num_generations=2, loss_type=loss_type)(tiny_grpo_batch())
    assert float(loss) == pytest.approx(expected, abs=1e-12)
    assert diag["ratio_mean"] == pytest.approx(1.0)
    assert diag["clip_frac"] == 0.0
    assert diag["advantage_abs_mean"] == pytest.approx(1 / C)


def test_grpo_dapo_window_normaliser_by_hand():
    # 10 actions over a window of 2 micro-batches: sum / (10 / 2); the trainer's /2 gives sum / 10
    loss, _ = GRPO(num_generations=2)(tiny_grpo_batch(), num_items_in_batch=10, grad_accum=2)
    assert float(loss) == pytest.approx((1 / C) / 5.0)


def test_grpo_clipping_and_kl_by_hand():
    # row 0's token: ratio e^0.5 > 1.2 with A < 0 -> the unclipped (pessimistic) branch is kept;
    # row 1's stop: ratio e^-0.5 < 0.8 with A > 0 -> also unclipped. Row 0's stop: ratio 1.
    old = np.array([[-1.0, -1.0], [-1.5, 0.0]])
    refp = np.array([[-0.7, -1.0], [-2.0, 0.0]])
    batch = tiny_grpo_batch(old_log_probs=old, ref_log_probs=refp)
    grpo = GRPO(num_generations=2, loss_type="bnpo", beta=0.1, use_bias_correction_kl=False)
    loss, diag = grpo(batch)
    w0, w2 = math.exp(0.5), math.exp(-0.5)
    k3_0 = math.exp(-0.2) + 0.2 - 1  # gap = ref - log pi = -0.2; the other two actions: gap 0
    expected = (w0 / C + 1 / C - w2 / C + 0.1 * k3_0) / 3
    assert float(loss) == pytest.approx(expected, abs=1e-12)
    assert diag["clip_frac"] == 0.0  # neither ratio is in a clipped region
    assert diag["kl"] == pytest.approx(k3_0 / 3)
    # swapping the rewards puts both ratios in their clipped regions
    swapped = tiny_grpo_batch(old_log_probs=old, rewards=np.array([3.0, 1.0]))
    loss, diag = GRPO(num_generations=2, loss_type="bnpo")(swapped)
    assert float(loss) == pytest.approx((-1.2 / C - 1 / C + 0.8 / C) / 3, abs=1e-12)
    assert diag["clip_frac_high"] == pytest.approx(1 / 3)
    assert diag["clip_frac_low"] == pytest.approx(1 / 3)


def tiny_ppo_batch(**overrides) -> RLBatch:
    """One row, tau = 1 (token then stop), R = 1; values hand-picked (see test_ppo_by_hand)."""
    fields = {
        "log_probs": np.array([[-1.0 + 0.1, -2.0 - 0.3]]),
        "old_log_probs": np.array([[-1.0, -2.0]]),
        "rewards": np.array([1.0]),
        "length": np.array([1]),
        "values": np.array([[0.9, 0.5]]),
        "old_values": np.array([[0.5, 0.25]]),
    }
    return RLBatch(**{**fields, **overrides})


def test_ppo_by_hand():
    ppo = PPO(kl_coef=0.0, whiten_advantages=False)  # TRL's other defaults
    loss, diag = ppo(tiny_ppo_batch())
    # GAE (gamma 1, lam 0.95): A = [0.4625, 0.75], returns [0.9625, 1.0] (test_gae_by_hand)
    # values [0.9, 0.5] clipped to old +- 0.2 -> [0.7, 0.45]; both clipped errors are larger
    vf = 0.5 * ((0.7 - 0.9625) ** 2 + (0.45 - 1.0) ** 2) / 2
    r0, r1 = math.exp(0.1), math.exp(-0.3)
    # r0 in [0.8, 1.2]; r1 < 0.8 with A > 0: max(-A r1, -A 0.8) = -A r1 (unclipped)
    pg = (-0.4625 * r0 - 0.75 * r1) / 2
    assert diag["value_loss"] == pytest.approx(vf)
    assert diag["policy_loss"] == pytest.approx(pg)
    assert float(loss) == pytest.approx(pg + 0.1 * vf)
    assert diag["value_clip_frac"] == 1.0
    assert diag["clip_frac"] == 0.0
    assert diag["approx_kl"] == pytest.approx(0.5 * (0.01 + 0.09) / 2)


def test_ppo_kl_penalty_by_hand():
    refp = np.array([[-1.5, -2.0]])  # k1 = old - ref = [0.5, 0]
    batch = tiny_ppo_batch(ref_log_probs=refp)
    adv, returns, kl = PPO(kl_coef=0.1, whiten_advantages=False).advantages(batch)
    np.testing.assert_allclose(kl, [[0.5, 0.0]])
    # rewards [-0.05, 1]: delta_1 = 0.75, delta_0 = -0.05 + 0.25 - 0.5 = -0.3
    np.testing.assert_allclose(adv, [[-0.3 + 0.95 * 0.75, 0.75]])
    np.testing.assert_allclose(returns, [[-0.3 + 0.95 * 0.75 + 0.5, 1.0]])


GRPO_CONFIGS = st.fixed_dictionaries(
    {
        "num_generations": st.integers(2, 4),
        "scale_rewards": st.sampled_from(["group", "batch", "none"]),
        "loss_type": st.sampled_from(LOSS_TYPES),
        "epsilon": st.sampled_from([0.2, 0.1]),
        "epsilon_high": st.sampled_from([None, 0.28, 5.0]),
        "delta": st.sampled_from([None, 1.5]),
        "beta": st.sampled_from([0.0, 0.04]),
        "use_bias_correction_kl": st.booleans(),
        "importance_sampling_level": st.sampled_from(["token", "sequence"]),
        "max_completion_length": st.sampled_from([None, 9]),
        "sapo_temperature_pos": st.just(1.0),
        "sapo_temperature_neg": st.just(1.05),
    }
)


def random_arrays(seed: int, b: int, t: int) -> dict:
    """Random action-layout arrays; garbage (inf, nan) after tau checks the masking."""
    rng = np.random.default_rng(seed)
    length = rng.integers(0, t + 1, size=b)
    length[0] = t
    logp = np.log(rng.uniform(0.01, 1.0, (b, t + 1)))
    old = logp + rng.normal(scale=0.4, size=(b, t + 1))
    refp = logp + rng.normal(scale=0.5, size=(b, t + 1))
    values = rng.normal(size=(b, t + 1)) * 2
    old_values = values + rng.normal(scale=0.3, size=(b, t + 1))
    rewards = rng.choice([0.0, 1.0, 3.0], size=b) * rng.uniform(0.5, 10.0)
    used = np.arange(t + 1)[None, :] <= length[:, None]
    out = {"length": length, "rewards": rewards}
    for name, arr, fill in (
        ("log_probs", logp, np.nan),
        ("old_log_probs", old, np.inf),
        ("ref_log_probs", refp, -np.inf),
        ("values", values, np.nan),
        ("old_values", old_values, np.inf),
    ):
        out[name] = np.where(used, arr, fill)
    return out


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), groups=st.integers(1, 3), t=st.integers(0, 6), cfg=GRPO_CONFIGS
)
def test_grpo_matches_reference(seed, groups, t, cfg):
    d = random_arrays(seed, groups * cfg["num_generations"], t)
    batch = RLBatch(**{k: v for k, v in d.items() if k not in ("values", "old_values")})
    grpo = GRPO(**cfg)
    args = (d["log_probs"], d["old_log_probs"], d["ref_log_probs"], d["rewards"], d["length"])
    loss, _ = grpo(batch)
    assert float(loss) == pytest.approx(ref.grpo_loss(*args, cfg), rel=1e-9, abs=1e-10)
    loss, _ = grpo(batch, num_items_in_batch=37, grad_accum=3)
    expected = ref.grpo_loss(*args, cfg, num_items_in_batch=37, grad_accum=3)
    assert float(loss) == pytest.approx(expected, rel=1e-9, abs=1e-10)
    assert float(grpo(_torch(batch))[0]) == pytest.approx(
        float(grpo(batch)[0]), rel=1e-9, abs=1e-10
    )


PPO_CONFIGS = st.fixed_dictionaries(
    {
        "cliprange": st.sampled_from([0.2, 0.1]),
        "cliprange_value": st.sampled_from([0.2, 1.0]),
        "vf_coef": st.sampled_from([0.1, 1.0]),
        "kl_coef": st.sampled_from([0.0, 0.05]),
        "kl_estimator": st.sampled_from(["k1", "k3"]),
        "gamma": st.sampled_from([1.0, 0.9]),
        "lam": st.sampled_from([0.95, 1.0, 0.0]),
        "whiten_rewards": st.booleans(),
        "whiten_advantages": st.booleans(),
    }
)


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), b=st.integers(1, 5), t=st.integers(0, 6), cfg=PPO_CONFIGS)
def test_ppo_matches_reference(seed, b, t, cfg):
    d = random_arrays(seed, b, t)
    batch = RLBatch(**d)
    loss, _ = PPO(**cfg)(batch)
    expected = ref.ppo_loss(
        d["log_probs"],
        d["old_log_probs"],
        d["ref_log_probs"],
        d["rewards"],
        d["length"],
        d["values"],
        d["old_values"],
        cfg,
    )
    assert float(loss) == pytest.approx(expected, rel=1e-9, abs=1e-10)
    assert float(PPO(**cfg)(_torch(batch))[0]) == pytest.approx(float(loss), rel=1e-9, abs=1e-10)


def test_grpo_gradient_zero_exactly_in_the_clipped_branch():
    # A = [+1/C, -1/C] after swapping rewards; row 0's token ratio e^0.5 > 1.2 with A > 0:
    # clipped, zero gradient. Row 0's stop: ratio 1, gradient -A / 3. Row 1's stop: ratio
    # e^-0.5 < 0.8 with A < 0: clipped, zero gradient.
    batch = _torch(
        tiny_grpo_batch(
            old_log_probs=np.array([[-1.0, -1.0], [-1.5, 0.0]]), rewards=np.array([3.0, 1.0])
        ),
        ("log_probs",),
    )
    loss, _ = GRPO(num_generations=2, loss_type="bnpo")(batch)
    loss.backward()
    grad = batch.log_probs.grad.numpy()
    np.testing.assert_allclose(grad, [[0.0, -1 / (3 * C)], [0.0, 0.0]], atol=1e-15)


def test_grpo_on_policy_gradient_is_the_policy_gradient():
    # ratio 1 everywhere: d loss / d log pi_{b,t} = -A_b / (number of actions) for bnpo; the
    # padding column after row 1's stop gets none
    batch = _torch(tiny_grpo_batch(), ("log_probs",))
    GRPO(num_generations=2, loss_type="bnpo")(batch)[0].backward()
    a = 1 / C
    np.testing.assert_allclose(batch.log_probs.grad.numpy(), [[a / 3, a / 3], [-a / 3, 0.0]])


def test_grpo_kl_gradient_pulls_toward_the_reference():
    # equal rewards: A = 0, only beta * k3 acts; d k3 / d log pi = 1 - exp(ref - log pi), plus
    # with the bias correction the ratio's derivative times k3 (which is 0 where ref = log pi)
    refp = np.array([[-0.7, -1.0], [-2.0, 0.0]])
    batch = _torch(
        tiny_grpo_batch(ref_log_probs=refp, rewards=np.array([1.0, 1.0])), ("log_probs",)
    )
    loss, _ = GRPO(num_generations=2, loss_type="bnpo", beta=0.1)(batch)
    loss.backward()
    k3 = math.exp(-0.2) + 0.2 - 1
    expected = 0.1 * ((1 - math.exp(-0.2)) + k3) / 3
    np.testing.assert_allclose(
        batch.log_probs.grad.numpy(), [[expected, 0.0], [0.0, 0.0]], atol=1e-15
    )


def test_ppo_gradients_zero_in_the_clipped_branches():
    # token: ratio e^0.3 > 1.2 with A > 0 (no whitening) -> clipped, zero policy gradient;
    # stop: ratio e^-0.3 < 0.8 with A > 0 -> unclipped, gradient -A ratio / 2.
    # values [0.9, 0.5] leave old +- 0.2 and the clipped error is larger: zero value gradient
    batch = _torch(tiny_ppo_batch(log_probs=np.array([[-0.7, -2.3]])), ("log_probs", "values"))
    loss, diag = PPO(kl_coef=0.0, whiten_advantages=False)(batch)
    loss.backward()
    np.testing.assert_allclose(
        batch.log_probs.grad.numpy(), [[0.0, 0.75 * math.exp(-0.3) / 2 * -1]], atol=1e-15
    )
    np.testing.assert_allclose(batch.values.grad.numpy(), [[0.0, 0.0]], atol=1e-15)
    assert diag["clip_frac"] == 0.5
    # values inside the clip range: gradient vf_coef * 0.5 * 2 (V - G) / 2
    inside = _torch(tiny_ppo_batch(values=np.array([[0.6, 0.3]])), ("values",))
    PPO(kl_coef=0.0, whiten_advantages=False)(inside)[0].backward()
    np.testing.assert_allclose(
        inside.values.grad.numpy(), [[0.1 * (0.6 - 0.9625) / 2, 0.1 * (0.3 - 1.0) / 2]]
    )


def test_inputs_needed_and_registry():
    batch = tiny_grpo_batch()
    with pytest.raises(ValueError, match="ref_log_probs"):
        GRPO(num_generations=2, beta=0.1)(batch)
    with pytest.raises(ValueError, match="entropy"):
        GRPO(num_generations=2, entropy_coef=0.1)(batch)
    with pytest.raises(ValueError, match="value head"):
        PPO()(batch)
    with pytest.raises(ValueError, match="ref_log_probs"):
        PPO()(tiny_ppo_batch())
    with pytest.raises(ValueError, match="num_generations"):
        GRPO(num_generations=1)
    with pytest.raises(ValueError, match="loss_type"):
        GRPO(loss_type="vespo")
    with pytest.raises(TypeError, match="kl_coef"):
        GRPO(kl_coef=0.1)  # PPO's knob
    # TRL's defaults
    g = GRPO()
    assert (g.num_generations, g.loss_type, g.scale_rewards, g.beta, g.epsilon) == (
        8,
        "dapo",
        "group",
        0.0,
        0.2,
    )
    p = PPO()
    assert (p.cliprange, p.cliprange_value, p.vf_coef, p.kl_coef, p.gamma, p.lam) == (
        0.2,
        0.2,
        0.1,
        0.05,
        1.0,
        0.95,
    )


def test_entropy_bonus_and_diagnostic():
    h = np.array([[0.7, 0.3], [0.2, 9.0]])  # the 9 after row 1's stop is never read
    batch = tiny_grpo_batch(entropy=h)
    base, _ = GRPO(num_generations=2, loss_type="bnpo")(batch)
    loss, diag = GRPO(num_generations=2, loss_type="bnpo", entropy_coef=0.5)(batch)
    assert diag["entropy"] == pytest.approx(0.4)
    assert float(loss) == pytest.approx(float(base) - 0.5 * 0.4)
    assert diag["policy_loss"] == pytest.approx(float(base))
