"""GFlowNet objectives on a terminable prefix tree, written once for numpy and torch.

Notation (``core.gfn.batch``): C_k = sum_{t<k} log_pf[t], and the prefix TB residual

    Delta_k = logZ + C_k + log_pterm[k] - log_r[k]          (paper eq. 21)

so Delta_tau is the TB residual of the trajectory. Every objective returns the batch mean of a
per-trajectory loss and a dict of detached float diagnostics.

- ``tb``: Delta_tau^2 (Malkin et al. 2022).
- ``subtb``: LLM-form SubTB (Hu et al. 2024), windows 0 <= i < j <= tau with residual
  eps_ij = Delta_j - Delta_i (logZ cancels) and weight lambda^(j-i-1) (default lambda 0.9, the
  geometric window weight of Madan et al. 2023; the paper does not state its value).
  ``normalization="trajectory"`` (default, the paper's eq. 3) averages within each
  trajectory and then over the batch; ``"batch"`` divides by the total weight of the whole batch
  as the paper's reference code does (long trajectories then dominate).
  A trajectory with tau = 0 has no window and contributes 0.
- ``raptb``: Delta_tau^2 + eta L_aux (paper eq. 29). L_aux is the w-weighted mean over
  eligible prefixes (max(k_min, 1) <= k <= h, h = min(tau, K)) of rhat_k^2 with the rooted residual
  rbar_k = Delta_k - Delta_0 (logZ cancels), log_pterm replaced by stopgrad(log_pterm) when
  ``detach_pterm``, and rhat_k = rbar_k + a_k (u_k - u_tgt_k), a_k = gamma^(h-k) 1[|u_k| <= eps_ab]
  (absorb gate: only prefixes without task reward of their own are pulled toward the future
  target). ``absorb=False`` is the paper's "w/o reward absorb" ablation: u_tgt = u, so a_k = 0
  and L_aux is the mean of rbar_k^2. w_k = lambda^(k - k_min). A trajectory with no eligible
  prefix contributes TB only.
- ``avg_prefix_tb``: mean over k = 1..tau of Delta_k^2 (paper eq. 13; logZ and raw stop
  rewards kept). The paper leaves tau = 0 undefined; there the only prefix, k = 0, is used.
- ``root_subtb_logz``: weighted mean over k = 1..tau of Delta_k^2 with w_k = lambda^(k-1) (rooted
  SubTB windows with a learned logZ, no absorption, no detach; lambda 0.9 as for SubTB, so it
  differs from AvgPrefixTB, which it equals at lambda = 1); tau = 0 uses k = 0 as above.
- ``vargrad``: logZ-free log-partition variance; logZ is estimated as minus the batch mean of the
  TB residual without logZ, and the loss is the batch variance of that residual. The ``log_z``
  argument is ignored (its estimate is reported in the diagnostics).

``log_z`` is a scalar (python float or 0-d array) or a [B] array (prompt-conditioned logZ).

Equation numbers are the paper's (numbered through the appendix: eq. 3 Sec. 3.3's SubTB loss,
eq. 13 appendix B's AvgPrefixTB, eqs. 21 and 29 appendix F's prefix residual and RapTB loss).
References: the paper, Wang, Lu and Wang, ICML 2026 (no arXiv version); TB, Malkin et al. 2022,
https://arxiv.org/abs/2201.13259; SubTB, Madan et al. 2023, https://arxiv.org/abs/2209.12782, in
its LLM form Hu et al. 2024, https://arxiv.org/abs/2310.04363; VarGrad, Richter et al. 2020,
https://arxiv.org/abs/2010.10436, as a GFlowNet loss Zhang et al., ICLR 2023 (Robust Scheduling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from array_api_compat import array_namespace, device

from raptb.core.autograd import stop_gradient
from raptb.core.by_name import build_by_name, hyperparameter_names
from raptb.core.checks import check_range
from raptb.core.gfn.batch import PrefixBatch
from raptb.core.gfn.targets import TARGET_MODES, absorbed_targets, backup_window_end
from raptb.core.registry import Registry
from raptb.core.schedules import LinearSchedule, schedule_value

Array = Any
Diagnostics = dict[str, float]


def _as_log_z(log_z: Array | float, batch: PrefixBatch) -> Array:
    xp = batch.xp
    if isinstance(log_z, int | float):
        return xp.asarray(float(log_z), dtype=batch.log_pf.dtype, device=device(batch.log_pf))
    shape = tuple(int(s) for s in log_z.shape)
    if shape not in ((), (1,), (batch.batch_size,)):
        raise ValueError(f"log_z: expected a scalar or shape [B]={batch.batch_size}, got {shape}")
    return log_z


@dataclass(frozen=True)
class _Masked:
    """C [B, T+1] (cumulative token log-probs), log_pterm, log_r and u with masked entries zeroed
    (:func:`_masked_inputs`)."""

    cum: Array
    log_pterm: Array
    log_r: Array
    u: Array

    def residuals(self, log_pterm: Array | None = None) -> Array:
        """D_k = C_k + log_pterm[k] - log_r[k], [B, T+1]: the logZ-free residual of stopping
        after prefix k (the paper's Delta_k less logZ), the one quantity every objective here
        reduces; ``log_pterm`` replaces the stop term (RapTB's detached auxiliary)."""
        return self.cum + (self.log_pterm if log_pterm is None else log_pterm) - self.log_r


def _masked_inputs(batch: PrefixBatch) -> _Masked:
    """The batch's inputs with masked entries zeroed, and C = cumsum(log_pf) with C_0 = 0.

    Zeroing first keeps any garbage the caller left after tau (even inf) out of the arithmetic,
    so masked positions can never turn a product into NaN in values or gradients.
    """
    xp = batch.xp
    tok, pre = batch.token_mask, batch.prefix_mask
    log_pf = xp.where(tok, batch.log_pf, xp.zeros_like(batch.log_pf))
    first = xp.zeros((batch.batch_size, 1), dtype=log_pf.dtype, device=device(log_pf))
    cum = xp.concat([first, xp.cumulative_sum(log_pf, axis=1)], axis=1)
    zeros = xp.zeros_like(batch.log_pterm)
    return _Masked(
        cum=cum,
        log_pterm=xp.where(pre, batch.log_pterm, zeros),
        log_r=xp.where(pre, batch.log_r, zeros),
        u=xp.where(pre, batch.u, zeros),
    )


def _at_length(values: Array, batch: PrefixBatch) -> Array:
    """values[b, tau_b] for a [B, T+1] array."""
    xp = batch.xp
    cols = xp.arange(batch.max_length + 1, device=device(batch.length))
    hit = cols[None, :] == batch.length[:, None]
    return xp.sum(xp.where(hit, values, xp.zeros_like(values)), axis=1)


def _safe_ratio(num: Array, den: Array) -> Array:
    """num / den with 0 where den == 0 (a trajectory without terms contributes 0)."""
    xp = array_namespace(num, den)
    positive = den > 0
    return xp.where(positive, num / xp.where(positive, den, xp.ones_like(den)), xp.zeros_like(num))


def _diagnostics(
    loss: Array, log_z: Array, tb_residual: Array, aux: Array | None, active: Array | None
) -> Diagnostics:
    xp = array_namespace(loss)
    zero = xp.zeros_like(loss)
    stats = xp.stack(
        [
            loss,
            xp.mean(xp.astype(log_z, loss.dtype) * xp.ones_like(loss)),
            xp.mean(tb_residual),
            xp.std(tb_residual, correction=0),
            zero if aux is None else xp.mean(aux),
            zero if active is None else xp.mean(xp.astype(active, loss.dtype)),
        ]
    )
    values = stop_gradient(stats).tolist()
    keys = ("loss", "log_z", "tb_residual_mean", "tb_residual_std", "aux_loss", "aux_active_frac")
    return dict(zip(keys, (float(v) for v in values), strict=True))


@dataclass(frozen=True)
class Objective:
    """Base class: a callable ``loss_fn(batch, log_z, step=0) -> (loss, diagnostics)``.

    ``holds_log_z``: the loss is not a mean over rows but couples them through a logZ estimate
    over the batch (VarGrad). A step split into micro-batches then holds the estimate over all
    its rows fixed in each, passed as ``log_z_hat``, from the rows' ``partial_residuals``."""

    name: ClassVar[str] = ""
    learns_log_z: ClassVar[bool] = True
    """Whether the loss depends on the learned logZ (SubTB's cancels, VarGrad estimates it)."""
    holds_log_z: ClassVar[bool] = False

    def partial_residuals(self, batch: PrefixBatch) -> Array:
        """The logZ-free TB residual of each row, C_tau + log_pterm[tau] - log_r[tau], [B]."""
        return partial_residuals(batch)

    def __call__(
        self, batch: PrefixBatch, log_z: Array | float, step: int = 0
    ) -> tuple[Array, Diagnostics]:
        raise NotImplementedError


@dataclass(frozen=True)
class TB(Objective):
    """Trajectory balance: mean_b Delta_tau^2."""

    name: ClassVar[str] = "tb"

    def __call__(self, batch, log_z, step=0):
        lz = _as_log_z(log_z, batch)
        delta = _at_length(_masked_inputs(batch).residuals(), batch) + lz
        loss = batch.xp.mean(delta**2)
        return loss, _diagnostics(loss, lz, delta, None, None)


@dataclass(frozen=True)
class SubTB(Objective):
    """LLM-form subtrajectory balance over all windows, weights lambda^(j-i-1)."""

    name: ClassVar[str] = "subtb"
    learns_log_z: ClassVar[bool] = False
    subtb_lambda: float = 0.9
    normalization: Literal["trajectory", "batch"] = "trajectory"

    def __post_init__(self) -> None:
        check_range("subtb_lambda", self.subtb_lambda, 0.0, math.inf, lo_open=True)
        if self.normalization not in ("trajectory", "batch"):
            raise ValueError(
                f"normalization: must be 'trajectory' or 'batch', got {self.normalization!r}"
            )

    def __call__(self, batch, log_z, step=0):
        xp = batch.xp
        lz = _as_log_z(log_z, batch)
        d = _masked_inputs(batch).residuals()
        n = batch.max_length + 1
        idx = xp.arange(n, device=device(d))
        span = xp.astype(idx[None, :] - idx[:, None], d.dtype)  # [i, j] = j - i
        window = (idx[None, None, :] > idx[None, :, None]) & (
            idx[None, None, :] <= batch.length[:, None, None]
        )
        weight = xp.where(
            window, float(self.subtb_lambda) ** (span[None, :, :] - 1.0), xp.zeros_like(span)
        )
        eps = d[:, None, :] - d[:, :, None]
        num = xp.sum(weight * eps**2, axis=(1, 2))
        den = xp.sum(weight, axis=(1, 2))
        if self.normalization == "trajectory":
            loss = xp.mean(_safe_ratio(num, den))
        else:
            total = xp.sum(den)
            loss = xp.sum(num) / xp.where(total > 0, total, xp.ones_like(total))
        return loss, _diagnostics(loss, lz, _at_length(d, batch) + lz, None, None)


@dataclass(frozen=True)
class RapTB(Objective):
    """Rooted absorbed prefix trajectory balance (defaults: the paper's Expr24 column)."""

    name: ClassVar[str] = "raptb"
    eta: float = 0.25
    gamma: float = 0.99
    alpha: float = 0.8
    beta: float = 3.0
    rho: float = 0.5
    k_min: int | LinearSchedule = 1
    horizon: int | None = None
    target: Literal["max", "soft", "mix"] = "mix"
    detach_pterm: bool = True
    absorb_eps: float = 1e-6
    subtb_lambda: float = 1.0
    absorb: bool = True

    def __post_init__(self) -> None:
        check_range("eta", self.eta, 0.0, math.inf)
        check_range("gamma", self.gamma, 0.0, 1.0, lo_open=True)
        check_range("alpha", self.alpha, 0.0, 1.0)
        check_range("beta", self.beta, 0.0, math.inf, lo_open=True)
        check_range("rho", self.rho, 0.0, math.inf)
        check_range("absorb_eps", self.absorb_eps, 0.0, math.inf)
        check_range("subtb_lambda", self.subtb_lambda, 0.0, math.inf, lo_open=True)
        if self.target not in TARGET_MODES:
            raise ValueError(f"target: must be one of {TARGET_MODES}, got {self.target!r}")
        if self.horizon is not None and (not isinstance(self.horizon, int) or self.horizon < 1):
            raise ValueError(f"horizon: must be None or an integer >= 1, got {self.horizon!r}")
        if isinstance(self.k_min, LinearSchedule):
            if min(self.k_min.start, self.k_min.end) < 1:
                raise ValueError(f"k_min: schedule values must be >= 1, got {self.k_min}")
        elif isinstance(self.k_min, bool) or not isinstance(self.k_min, int) or self.k_min < 1:
            raise ValueError(
                f"k_min: must be an integer >= 1 or a LinearSchedule, got {self.k_min!r}"
            )
        for name in ("detach_pterm", "absorb"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be a bool, got {getattr(self, name)!r}")

    def __call__(self, batch, log_z, step=0):
        xp = batch.xp
        lz = _as_log_z(log_z, batch)
        masked = _masked_inputs(batch)
        tb = _at_length(masked.residuals(), batch) + lz

        pterm, u = masked.log_pterm, masked.u
        d_aux = masked.residuals(stop_gradient(pterm) if self.detach_pterm else pterm)
        rooted = d_aux - d_aux[:, :1]

        k_min = max(1, int(schedule_value(self.k_min, step)))
        cols = xp.arange(batch.max_length + 1, device=device(u))
        h = backup_window_end(batch.length, self.horizon)
        eligible = (cols[None, :] >= k_min) & (cols[None, :] <= h[:, None])
        zero = xp.zeros_like(u)
        rhat = rooted
        if self.absorb:  # without absorption u_tgt = u: no correction term
            u_tgt = absorbed_targets(
                u, batch.length, self.alpha, self.beta, self.rho, self.horizon, self.target
            )
            absorbed = eligible & (xp.abs(u) <= self.absorb_eps)
            distance = xp.astype(h[:, None] - cols[None, :], u.dtype)
            # Outside the absorbed set the product may be inf * 0; ``where`` selects 0 there, and
            # no gradient flows through it (u and u_tgt are data).
            rhat = rooted + xp.where(absorbed, self.gamma**distance * (u - u_tgt), zero)

        offset = xp.astype(cols - k_min, u.dtype)
        weight = xp.where(eligible, float(self.subtb_lambda) ** offset[None, :], zero)
        aux = _safe_ratio(xp.sum(weight * rhat**2, axis=1), xp.sum(weight, axis=1))
        loss = xp.mean(tb**2 + self.eta * aux)
        active = xp.any(eligible, axis=1)
        return loss, _diagnostics(loss, lz, tb, aux, active)


@dataclass(frozen=True)
class _PrefixTBMean(Objective):
    """Shared body of AvgPrefixTB and RootSubTBLogZ: weighted mean of Delta_k^2 over k = 1..tau."""

    def _weight_base(self) -> float:
        return 1.0

    def __call__(self, batch, log_z, step=0):
        xp = batch.xp
        lz = _as_log_z(log_z, batch)
        delta = _masked_inputs(batch).residuals() + (lz[:, None] if lz.ndim == 1 else lz)
        cols = xp.arange(batch.max_length + 1, device=device(delta))
        length = batch.length[:, None]
        used = ((cols[None, :] >= 1) & (cols[None, :] <= length)) | (
            (cols[None, :] == 0) & (length == 0)
        )
        offset = xp.astype(xp.maximum(cols - 1, xp.zeros_like(cols)), delta.dtype)
        weight = xp.where(used, self._weight_base() ** offset[None, :], xp.zeros_like(delta))
        per_traj = xp.sum(weight * delta**2, axis=1) / xp.sum(weight, axis=1)
        loss = xp.mean(per_traj)
        return loss, _diagnostics(loss, lz, _at_length(delta, batch), None, None)


@dataclass(frozen=True)
class AvgPrefixTB(_PrefixTBMean):
    """Uniform mean of prefix TB residuals (the paper's AvgPrefixTB baseline)."""

    name: ClassVar[str] = "avg_prefix_tb"


@dataclass(frozen=True)
class RootSubTBLogZ(_PrefixTBMean):
    """Rooted windows with a learned logZ (the paper's RootSubTBLogZ diagnostic baseline)."""

    name: ClassVar[str] = "root_subtb_logz"
    subtb_lambda: float = 0.9

    def __post_init__(self) -> None:
        check_range("subtb_lambda", self.subtb_lambda, 0.0, math.inf, lo_open=True)

    def _weight_base(self) -> float:
        return float(self.subtb_lambda)


def partial_residuals(batch: PrefixBatch) -> Array:
    """The logZ-free TB residual of each row, log P_F(x) - log R(x) = C_tau + log_pterm[tau] -
    log_r[tau], [B]. Minus its mean over on-policy rows is VarGrad's batch estimate of logZ (a
    lower bound in expectation: E[log R/P_F] <= log E[R/P_F] = log Z, by Jensen)."""
    return _at_length(_masked_inputs(batch).residuals(), batch)


@dataclass(frozen=True)
class VarGrad(Objective):
    """logZ-free variance objective: Var_b(C_tau + log_pterm[tau] - log_r[tau])."""

    name: ClassVar[str] = "vargrad"
    learns_log_z: ClassVar[bool] = False
    holds_log_z: ClassVar[bool] = True

    def __call__(self, batch, log_z, step=0, *, log_z_hat=None):
        """``log_z_hat``: the estimate held fixed (no gradient), e.g. minus the mean partial
        residual over all rows of an optimizer step: the row-weighted mean of its micro-batches'
        losses is then the step's variance, with that variance's exact gradient (the held mean's
        own gradient term is sum_b (p_b - mean) grad mean = 0). None: this batch's own mean."""
        xp = batch.xp
        partial = self.partial_residuals(batch)
        if log_z_hat is None:
            log_z_hat = -xp.mean(partial)
        else:
            log_z_hat = stop_gradient(_as_log_z(log_z_hat, batch))
        residual = partial + log_z_hat
        loss = xp.mean(residual**2)
        return loss, _diagnostics(loss, log_z_hat, residual, None, None)


OBJECTIVES: Registry[type[Objective]] = Registry(
    "objective",
    lambda cls: getattr(cls, "name", None),
    (TB, SubTB, RapTB, AvgPrefixTB, RootSubTBLogZ, VarGrad),
)


def register_objective(cls: type[Objective]) -> type[Objective]:
    """Add objective ``cls`` (an :class:`Objective` dataclass with a class-level ``name``) to
    :data:`OBJECTIVES`, so that ``objective_by_name`` and ``loss = "<name>"`` reach it; usable as
    a class decorator. Its hyperparameters are its dataclass fields: a run passes it the
    ``[objective]`` values of the fields it shares with that section, the rest keep their
    defaults. A name may be registered once (ValueError otherwise)."""
    return OBJECTIVES.register(cls)


def objective_hyperparameters(name: str) -> tuple[str, ...]:
    """Names of the hyperparameters objective ``name`` accepts."""
    return hyperparameter_names(OBJECTIVES, name)


def objective_by_name(name: str, **hyperparameters: Any) -> Objective:
    """Build objective ``name`` (tb, subtb, raptb, avg_prefix_tb, root_subtb_logz, vargrad).

    Hyperparameters not taken by that objective raise a ValueError listing the valid ones; values
    out of range raise a ValueError naming the hyperparameter.
    """
    return build_by_name(OBJECTIVES, name, hyperparameters)
