"""G²RPO's mode bonus inside a GFlowNet objective (``objective.mode_bonus``): the insight of raptb's
reading of G²RPO (core.rl.g2rpo) and of IPS-GRPO (core.rl.ips_grpo), that a correct sample should
be pushed up in inverse proportion to its probability, added to the loss of a GFlowNet objective.

Per step, for each prompt with n on-policy rows y_i drawn from the policy pi (replayed and oracle
rows take no bonus: their draw is not pi's), with log pi(y) the sequence log-probability (every
token and the stop) and c = ``mode_bonus_cap``:

    b_i  = min(1 / (n pi(y_i)), c)   for a correct on-policy row, else 0   (pi(y_i) held fixed)
    L    = L_objective - lambda (1 / B) sum_i b_i log pi(y_i)

over the step's B rows (each micro-batch adds its rows' share), lambda = ``mode_bonus``. Without
the cap the bonus's expected gradient over the draw is

    E[sum_i b_i grad log pi(y_i)] = n sum_{y in Y*} pi(y) / (n pi(y)) grad log pi(y)
                                  = sum_{y in Y*} grad log pi(y),

the same push on every correct text whatever its probability: the gradient of |Y*| times minus
the cross-entropy from the uniform distribution over the correct texts Y* to pi. On a task whose
correct texts share one reward (Expr24) that uniform distribution is the GFlowNet's own target
restricted to Y*, so the bonus pulls toward the objective's fixed point rather than away from it;
what it adds is a push on the rarely drawn correct texts that the squared residuals give only in
proportion to how often they are drawn. The cap bounds the variance 1 / pi brings (G²RPO's, 1000
by default, as ``rl.g2rpo_cap``). lambda = 0 is the objective alone (the default).

This is raptb's own combination (no paper proposes it); issue 58's screen measures it
(studies/mode_bonus_screen.toml, docs/rl-baselines.md).
"""

from __future__ import annotations

import math
from typing import Any

from array_api_compat import array_namespace

from raptb.core.autograd import stop_gradient
from raptb.core.gfn.batch import PrefixBatch
from raptb.core.gfn.objectives import _at_length, _masked_inputs

Array = Any


def sequence_log_probs(batch: PrefixBatch) -> Array:
    """log pi(y) [B]: each row's token log-probabilities up to its length plus its stop's,
    sum_{t < tau} log_pf[t] + log_pterm[tau] (masked entries never read)."""
    masked = _masked_inputs(batch)
    return _at_length(masked.cum + masked.log_pterm, batch)


def mode_bonus_weights(log_pi: Array, eligible: Array, group_size: Array, cap: float) -> Array:
    """b [B] = min(1 / (n pi), cap) on the ``eligible`` rows (correct and on-policy), else 0;
    ``log_pi`` [B] the rows' sequence log-probabilities (held fixed: no gradient flows through b),
    ``group_size`` [B] each row's n (its prompt's on-policy rows in the step, >= 1 where eligible).
    G²RPO's bonus (core.rl.g2rpo) is this with the correct rows eligible and n its group size.
    Computed in log space: exp(min(-log n - log pi, log cap))."""
    xp = array_namespace(log_pi)
    if not cap > 0:
        raise ValueError(f"mode_bonus_cap: must be > 0, got {cap}")
    held = stop_gradient(log_pi)
    n = xp.where(eligible, group_size, xp.ones_like(group_size))
    log_inverse = -xp.log(xp.astype(n, held.dtype)) - held
    bonus = xp.exp(xp.minimum(log_inverse, xp.full_like(log_inverse, math.log(cap))))
    return xp.where(eligible, bonus, xp.zeros_like(bonus))


def mode_bonus_term(
    batch: PrefixBatch, eligible: Array, group_size: Array, weight: float, cap: float
) -> Array:
    """The term added to a micro-batch's objective loss, -weight mean_i b_i log pi(y_i) (its
    mean over the micro-batch's rows: the trainer weighs each micro-batch by its share of the
    step, so the step's sum is the module docstring's (1 / B) sum over its rows)."""
    if not weight >= 0:
        raise ValueError(f"mode_bonus: must be >= 0, got {weight}")
    xp = batch.xp
    log_pi = sequence_log_probs(batch)
    bonus = mode_bonus_weights(log_pi, eligible, group_size, cap)
    return -weight * xp.mean(bonus * log_pi)
