"""Objectives against the slow float64 references of ``reference.py``, numpy and torch paths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.core.gfn.batch import PrefixBatch
from raptb.core.gfn.objectives import OBJECTIVES, objective_by_name, objective_hyperparameters
from raptb.core.schedules import LinearSchedule
from tests.core import reference as ref

FIELDS = ("log_pf", "log_pterm", "log_r", "u", "length")


def make_batch(seed: int, b: int, t: int, *, scale: float = 100.0, dirty: bool = False) -> dict:
    """Random batch in the prefix layout: lengths include 0 and T, |log_r| up to ``scale``,
    task rewards u sparse (exact zeros, so the absorb gate is exercised)."""
    rng = np.random.default_rng(seed)
    length = rng.integers(0, t + 1, size=b)
    if b >= 2:
        length[0], length[1] = 0, t
    cols = np.arange(t + 1)
    prefix = cols[None, :] <= length[:, None]
    u = np.where(rng.random((b, t + 1)) < 0.3, rng.uniform(-scale, scale, (b, t + 1)), 0.0)
    log_r = rng.uniform(-scale, scale, (b, t + 1)) * rng.random() + u
    log_pf = np.log(rng.uniform(0.01, 1.0, (b, t)))
    log_pterm = np.log(rng.uniform(0.001, 1.0, (b, t + 1)))
    fill = np.inf if dirty else 0.0
    return {
        "log_pf": np.where(cols[None, :t] < length[:, None], log_pf, fill),
        "log_pterm": np.where(prefix, log_pterm, -fill),
        "log_r": np.where(prefix, log_r, fill),
        "u": np.where(prefix, u, fill),
        "length": length,
    }


def np_batch(d: dict) -> PrefixBatch:
    return PrefixBatch(**{k: np.asarray(d[k]) for k in FIELDS})


def torch_batch(d: dict, requires_grad: bool = False, dtype=torch.float64) -> PrefixBatch:
    out = {}
    for k in FIELDS:
        if k == "length":
            out[k] = torch.as_tensor(d[k], dtype=torch.int64)
        else:
            out[k] = torch.tensor(d[k], dtype=dtype, requires_grad=requires_grad and k != "u")
    return PrefixBatch(**out)


batches = st.builds(
    make_batch,
    seed=st.integers(0, 2**32 - 1),
    b=st.integers(1, 6),
    t=st.integers(0, 9),
    scale=st.sampled_from([1.0, 10.0, 100.0]),
)
log_zs = st.floats(-50.0, 50.0)
raptb_hp = st.fixed_dictionaries(
    {
        "eta": st.floats(0.0, 2.0),
        "gamma": st.floats(0.5, 1.0),
        "alpha": st.floats(0.0, 1.0),
        "beta": st.floats(0.1, 10.0),
        "rho": st.floats(0.0, 2.0),
        "k_min": st.integers(1, 10),
        "horizon": st.none() | st.integers(1, 10),
        "target": st.sampled_from(["max", "soft", "mix"]),
        "subtb_lambda": st.floats(0.5, 1.5),
        "absorb": st.booleans(),
    }
)


def close(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-7)


@settings(max_examples=60, deadline=None)
@given(batches, log_zs)
def test_tb_matches_reference(d, log_z):
    loss, diag = objective_by_name("tb")(np_batch(d), log_z)
    assert close(loss, ref.tb(d, log_z))
    assert close(diag["loss"], loss)


@settings(max_examples=60, deadline=None)
@given(batches, st.floats(0.3, 1.5), st.sampled_from(["trajectory", "batch"]))
def test_subtb_matches_reference(d, lam, norm):
    loss, _ = objective_by_name("subtb", subtb_lambda=lam, normalization=norm)(np_batch(d), 0.0)
    assert close(loss, ref.subtb(d, lam, norm))


@settings(max_examples=80, deadline=None)
@given(batches, log_zs, raptb_hp)
def test_raptb_matches_reference(d, log_z, hp):
    loss, diag = objective_by_name("raptb", **hp)(np_batch(d), log_z)
    want, auxes = ref.raptb(d, log_z, **hp)
    assert close(loss, want)
    assert close(diag["aux_loss"], sum(auxes) / len(auxes))


@settings(max_examples=40, deadline=None)
@given(batches, log_zs)
def test_avg_prefix_tb_matches_reference(d, log_z):
    loss, _ = objective_by_name("avg_prefix_tb")(np_batch(d), log_z)
    assert close(loss, ref.prefix_mean(d, log_z))


@settings(max_examples=40, deadline=None)
@given(batches, log_zs, st.floats(0.3, 1.5))
def test_root_subtb_logz_matches_reference(d, log_z, lam):
    loss, _ = objective_by_name("root_subtb_logz", subtb_lambda=lam)(np_batch(d), log_z)
    assert close(loss, ref.prefix_mean(d, log_z, lam))


@settings(max_examples=40, deadline=None)
@given(batches)
def test_vargrad_matches_reference(d):
    loss, diag = objective_by_name("vargrad")(np_batch(d), 123.0)
    assert close(loss, ref.vargrad(d))
    r = [ref._delta(d, b, int(d["length"][b]), 0.0) for b in range(len(d["length"]))]
    assert close(diag["log_z"], -sum(r) / len(r))


@settings(max_examples=30, deadline=None)
@given(batches, log_zs, st.sampled_from(sorted(OBJECTIVES)))
def test_numpy_and_torch_agree(d, log_z, name):
    obj = objective_by_name(name)
    a, da = obj(np_batch(d), log_z)
    b, db = obj(torch_batch(d), torch.tensor(log_z, dtype=torch.float64))
    assert isinstance(b, torch.Tensor) and b.ndim == 0
    assert close(a, b.item())
    for key in da:
        assert close(da[key], db[key]), key


@settings(max_examples=30, deadline=None)
@given(batches, log_zs, st.sampled_from(sorted(OBJECTIVES)))
def test_garbage_after_stop_is_ignored(d, log_z, name):
    seed = int(abs(d["log_r"]).sum() * 1000) % 2**32
    clean = make_batch(seed, 4, 6)
    dirty = make_batch(seed, 4, 6, dirty=True)
    obj = objective_by_name(name)
    assert close(obj(np_batch(clean), log_z)[0], obj(np_batch(dirty), log_z)[0])


def test_per_prompt_log_z_matches_reference():
    d = make_batch(7, 5, 6)
    log_z = np.linspace(-3.0, 3.0, 5)
    assert close(objective_by_name("tb")(np_batch(d), log_z)[0], ref.tb(d, log_z))
    assert close(objective_by_name("raptb")(np_batch(d), log_z)[0], ref.raptb(d, log_z)[0])
    assert close(
        objective_by_name("avg_prefix_tb")(np_batch(d), log_z)[0], ref.prefix_mean(d, log_z)
    )


# --- invariants -------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(batches, log_zs, st.floats(-100.0, 100.0), raptb_hp)
def test_rooted_residuals_do_not_see_log_z(d, log_z, shift, hp):
    obj = objective_by_name("raptb", **hp)
    a = obj(np_batch(d), log_z)[1]["aux_loss"]
    b = obj(np_batch(d), log_z + shift)[1]["aux_loss"]
    assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    sub = objective_by_name("subtb")
    assert close(sub(np_batch(d), log_z)[0], sub(np_batch(d), log_z + shift)[0])


@settings(max_examples=30, deadline=None)
@given(batches, log_zs, raptb_hp)
def test_the_rooted_auxiliary_loss_sends_no_gradient_to_log_z(d, log_z, hp):
    """Torch autograd: d/d logZ of RapTB's loss is TB's, so the auxiliary part's is 0 (logZ
    cancels in every rooted residual)."""
    hp = {**hp, "eta": 1.0}
    grads = {}
    for name, kwargs in (("raptb", hp), ("tb", {})):
        batch = torch_batch(d, requires_grad=True)
        lz = torch.tensor(log_z, dtype=torch.float64, requires_grad=True)
        loss, _ = objective_by_name(name, **kwargs)(batch, lz)
        (grads[name],) = torch.autograd.grad(loss, [lz])
    g_rap, g_tb = grads["raptb"], grads["tb"]
    assert abs(float(g_rap - g_tb)) <= 1e-9 * (1.0 + abs(float(g_tb)))
    assert g_tb != 0


@settings(max_examples=40, deadline=None)
@given(batches, log_zs, raptb_hp)
def test_raptb_with_eta_zero_is_tb(d, log_z, hp):
    hp = {**hp, "eta": 0.0}
    assert objective_by_name("raptb", **hp)(np_batch(d), log_z)[0] == pytest.approx(
        objective_by_name("tb")(np_batch(d), log_z)[0], rel=1e-12, abs=1e-12
    )


@settings(max_examples=30, deadline=None)
@given(batches, log_zs)
def test_no_eligible_prefix_contributes_tb_only(d, log_z):
    t = d["log_pf"].shape[1]
    loss, diag = objective_by_name("raptb", k_min=t + 1, eta=1.0)(np_batch(d), log_z)
    assert close(loss, ref.tb(d, log_z))
    assert diag["aux_active_frac"] == 0.0


def at_tb_optimum(d: dict, log_z: float, *, with_u: bool) -> dict:
    """``d`` with log_r set so that every prefix TB residual vanishes; task rewards u kept (within
    tau) or zeroed."""
    t = d["log_pf"].shape[1]
    cols = np.arange(t + 1)
    pf = np.where(cols[None, :t] < d["length"][:, None], d["log_pf"], 0.0)
    cum = np.concatenate([np.zeros((len(pf), 1)), np.cumsum(pf, axis=1)], axis=1)
    prefix = cols[None, :] <= d["length"][:, None]
    pterm = np.where(prefix, d["log_pterm"], 0.0)
    u = np.where(prefix, d["u"], 0.0) if with_u else 0 * pterm
    return {**d, "log_pf": pf, "log_pterm": pterm, "log_r": log_z + cum + pterm, "u": u}


@settings(max_examples=30, deadline=None)
@given(batches, log_zs, st.sampled_from(sorted(OBJECTIVES)))
def test_zero_residual_gives_zero_loss(d, log_z, name):
    # log_r chosen so that every prefix TB residual vanishes, with no task reward.
    zero = at_tb_optimum(d, log_z, with_u=False)
    # The soft backup of an all-zero reward row is > 0 (it sums several exp(0 - rho d) terms), so
    # RapTB's absorbed residual vanishes at the TB optimum only with the max target.
    hp = {"target": "max"} if name == "raptb" else {}
    assert objective_by_name(name, **hp)(np_batch(zero), log_z)[0] == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(batches, log_zs, st.sampled_from(["max", "soft", "mix"]))
def test_without_absorption_the_tb_optimum_is_a_zero_of_raptb(d, log_z, target):
    # Paper, "Fixed-point property": without absorption (u_tgt = u) the rooted residual vanishes
    # whenever every prefix TB residual is zero, whatever the target mode; with task rewards.
    at_optimum = at_tb_optimum(d, log_z, with_u=True)
    raptb = objective_by_name("raptb", absorb=False, target=target, eta=1.0)
    assert raptb(np_batch(at_optimum), log_z)[0] == pytest.approx(0.0, abs=1e-9)


def test_absorb_switch_changes_the_loss_as_the_reference_does():
    d = make_batch(11, 6, 9)
    losses = {}
    for absorb in (True, False):
        loss, _ = objective_by_name("raptb", absorb=absorb)(np_batch(d), 0.5)
        want, _ = ref.raptb(d, 0.5, absorb=absorb)
        assert close(loss, want)
        losses[absorb] = float(loss)
    assert losses[True] != pytest.approx(losses[False], rel=1e-6)


def test_k_min_schedule_is_resolved_at_step():
    d = make_batch(3, 6, 9)
    sched = LinearSchedule(7, 3, 100, integer=True)
    obj = objective_by_name("raptb", k_min=sched)
    for step, k in ((0, 7), (50, 5), (100, 3), (1000, 3)):
        assert close(obj(np_batch(d), 0.5, step=step)[0], ref.raptb(d, 0.5, k_min=k)[0])


# --- torch gradients ---------------------------------------------------------------------------


def _grads(loss, batch: PrefixBatch, log_z=None):
    inputs = [batch.log_pf, batch.log_pterm, batch.log_r] + ([log_z] if log_z is not None else [])
    return torch.autograd.grad(loss, inputs, allow_unused=True)


@pytest.mark.parametrize("detach", [True, False])
def test_aux_gradient_to_log_pterm_only_when_not_detached(detach):
    d = make_batch(11, 8, 9)
    d["u"][:, 3:] = 0.0
    d["u"][:, -1] = 50.0  # rewards only at the end: absorbed targets are non-trivial
    batch = torch_batch(d, requires_grad=True)
    rap, _ = objective_by_name("raptb", eta=1.0, detach_pterm=detach)(batch, 0.3)
    tb, _ = objective_by_name("tb")(batch, 0.3)
    g_pterm, g_pf = torch.autograd.grad(rap - tb, [batch.log_pterm, batch.log_pf])
    if detach:
        assert torch.count_nonzero(g_pterm) == 0
    else:
        assert torch.count_nonzero(g_pterm) > 0
    assert torch.count_nonzero(g_pf) > 0


def test_tb_gradients_reach_log_z_log_pf_log_pterm_and_not_masked_positions():
    d = make_batch(5, 6, 7)
    batch = torch_batch(d, requires_grad=True)
    log_z = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    loss, _ = objective_by_name("tb")(batch, log_z)
    g_pf, g_pterm, _, g_z = _grads(loss, batch, log_z)
    assert g_z.abs() > 0
    tok = batch.token_mask.numpy()
    assert np.all(g_pf.numpy()[~tok] == 0) and np.count_nonzero(g_pf.numpy()[tok]) == tok.sum()
    at_stop = np.arange(8)[None, :] == d["length"][:, None]
    assert np.all(g_pterm.numpy()[~at_stop] == 0) and np.all(g_pterm.numpy()[at_stop] != 0)


def test_float32_torch_objectives_are_finite_with_large_rewards():
    d = make_batch(9, 16, 12, scale=100.0)
    batch = torch_batch(d, requires_grad=True, dtype=torch.float32)
    for name in OBJECTIVES:
        loss, diag = objective_by_name(name)(batch, torch.tensor(0.0))
        (g,) = torch.autograd.grad(loss, [batch.log_pf])
        assert torch.isfinite(loss) and torch.isfinite(g).all(), name
        assert all(math.isfinite(v) for v in diag.values()), name


# --- construction errors -----------------------------------------------------------------------


def test_unknown_objective_lists_choices():
    with pytest.raises(ValueError, match="valid choices: tb, subtb, raptb"):
        objective_by_name("nope")


def test_unknown_hyperparameter_lists_valid_ones():
    with pytest.raises(ValueError, match="does not take eta; valid hyperparameters: none"):
        objective_by_name("tb", eta=0.5)
    with pytest.raises(ValueError, match="valid hyperparameters: subtb_lambda, normalization"):
        objective_by_name("subtb", k_min=3)


@pytest.mark.parametrize(
    ("hp", "field"),
    [
        ({"eta": -1.0}, "eta"),
        ({"gamma": 0.0}, "gamma"),
        ({"gamma": 1.5}, "gamma"),
        ({"alpha": 1.2}, "alpha"),
        ({"beta": 0.0}, "beta"),
        ({"rho": -0.1}, "rho"),
        ({"k_min": 0}, "k_min"),
        ({"k_min": LinearSchedule(7, 0, 10)}, "k_min"),
        ({"horizon": 0}, "horizon"),
        ({"target": "median"}, "target"),
        ({"absorb_eps": float("nan")}, "absorb_eps"),
        ({"detach_pterm": "yes"}, "detach_pterm"),
        ({"absorb": 1}, "absorb"),
        ({"subtb_lambda": 0.0}, "subtb_lambda"),
    ],
)
def test_out_of_range_hyperparameters_name_the_field(hp, field):
    with pytest.raises(ValueError, match=field):
        objective_by_name("raptb", **hp)


def test_every_objective_lists_its_hyperparameters():
    assert objective_hyperparameters("raptb") == (
        "eta",
        "gamma",
        "alpha",
        "beta",
        "rho",
        "k_min",
        "horizon",
        "target",
        "detach_pterm",
        "absorb_eps",
        "subtb_lambda",
        "absorb",
    )
    assert objective_hyperparameters("tb") == ()


def test_defaults_of_the_subtb_family_and_their_difference_from_avg_prefix_tb():
    d = make_batch(21, 6, 8)
    assert close(objective_by_name("subtb")(np_batch(d), 0.0)[0], ref.subtb(d, 0.9))
    root = objective_by_name("root_subtb_logz")(np_batch(d), 0.4)[0]
    assert close(root, ref.prefix_mean(d, 0.4, 0.9))
    assert not close(root, objective_by_name("avg_prefix_tb")(np_batch(d), 0.4)[0])
    assert close(
        objective_by_name("root_subtb_logz", subtb_lambda=1.0)(np_batch(d), 0.4)[0],
        objective_by_name("avg_prefix_tb")(np_batch(d), 0.4)[0],
    )
