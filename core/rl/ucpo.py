"""UCPO, Uniform-Correct Policy Optimization (Lochab, Li and Zhang 2026, "Uniform-Correct Policy
Optimization: Breaking RLVR's Indifference to Diversity", https://arxiv.org/abs/2605.00365):
GRPO plus a conditional uniformity penalty on the policy's distribution over the correct
samples of a group, applied at the advantage level, ``--loss ucpo``.

Per group of n samples of one prompt with rewards r, sequence log-probs log pi_old(y_i) (the sum
over its tau_i + 1 actions, the stop included) and lengths L_i = tau_i + 1:

    A_i   = (r_i - mean(r)) / (std(r) + 1e-8)                  GRPO, Bessel std; n = 1: r - mean
    q_i   = softmax_{j in C} (log pi_old(y_j) / L_j)            over the correct set C = {r > 0}
    w_i   = (1 - tau) / |C| + tau (1 / q_i) / sum_{j in C} 1 / q_j,   q clamped at >= 1e-6
    A_i  <- A_C |C| w_i                    for i in C, when |C| > 1 (A_C: the correct rows' A)

so the correct rows keep their total advantage |C| A_C, shared in inverse proportion to the
policy's (length-normalised) preference among them: tau = 0 is GRPO, tau = 1 the full inverse-q
correction toward the uniform-correct policy. With ``ucpo_alpha`` > 0 the incorrect set I
(|I| > 1) is sharpened the same way: q over I, H = -sum q log q, and
A_i <- A_i - max(0, alpha (-log q_i - H)). Transcribed from the authors'
``compute_dgrpo_advantage_outcome_invq_l`` (AnamikaLochab/UCPO,
``verl/verl/trainer/ppo/core_algos.py``, commit 93ce506), the advantage estimator ``iq`` that their
``scripts_c/run_ucpo_1.5b.sh`` trains with (tau = 0.2, alpha = 0, the defaults here); their
policy loss (``verl/verl/workers/actor/dp_actor.py``: verl's clipped ratio, token mean) is GRPO's
here (``core.rl.grpo``, TRL's loss types: the default ``dapo`` is a token mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from array_api_compat import array_namespace, device

from raptb.core.checks import check_range
from raptb.core.rl.grpo import GRPO

Array = Any
# the authors' constants: added to the group std, and the floor of q before 1 / q
UCPO_STD_EPS = 1e-8
UCPO_Q_FLOOR = 1e-6


def _bessel_std(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _softmax_log(values: Sequence[float]) -> list[float]:
    """log softmax of ``values``."""
    top = max(values)
    log_total = top + math.log(sum(math.exp(v - top) for v in values))
    return [v - log_total for v in values]


def ucpo_group_advantages(
    rewards: Sequence[float],
    sequence_log_probs: Sequence[float],
    lengths: Sequence[int],
    tau: float,
    alpha: float = 0.0,
) -> tuple[list[float], float]:
    """UCPO advantages of one group (the module docstring) and its reward std."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = _bessel_std(rewards) if n > 1 else 0.0
    adv = [(r - mean) / (std + UCPO_STD_EPS) if n > 1 else r - mean for r in rewards]
    scaled = [lp / length for lp, length in zip(sequence_log_probs, lengths, strict=True)]
    correct = [i for i in range(n) if rewards[i] > 0]
    incorrect = [i for i in range(n) if rewards[i] <= 0]
    if len(correct) > 1:
        q = [math.exp(v) for v in _softmax_log([scaled[i] for i in correct])]
        inverse = [1.0 / max(qi, UCPO_Q_FLOOR) for qi in q]
        total = sum(inverse)
        base = adv[correct[0]]  # every correct row has this advantage under a 0/1 reward
        m = len(correct)
        for i, inv in zip(correct, inverse, strict=True):
            adv[i] = base * ((1.0 - tau) / m + tau * inv / total) * m
    if len(incorrect) > 1 and alpha > 0:
        log_q = _softmax_log([scaled[i] for i in incorrect])
        entropy = -sum(math.exp(lq) * lq for lq in log_q)
        for i, lq in zip(incorrect, log_q, strict=True):
            adv[i] -= max(0.0, alpha * (-lq - entropy))
    return adv, std


def ucpo_advantages(
    rewards: Array,
    sequence_log_probs: Array,
    lengths: Array,
    num_generations: int,
    tau: float,
    alpha: float = 0.0,
) -> tuple[Array, Array]:
    """UCPO advantages [B] and each row's group std [B] of ``rewards`` [B] (consecutive groups
    of ``num_generations``), ``sequence_log_probs`` [B] and ``lengths`` [B] (actions per row)."""
    xp = array_namespace(rewards)
    b, n = int(rewards.shape[0]), num_generations
    if b % n:
        raise ValueError(
            f"num_generations: the batch of {b} rows must hold whole groups of "
            f"num_generations = {n} samples"
        )
    r, lp, lens = rewards.tolist(), sequence_log_probs.tolist(), lengths.tolist()
    adv: list[float] = []
    std: list[float] = []
    for g in range(0, b, n):
        group_adv, group_std = ucpo_group_advantages(
            r[g : g + n], lp[g : g + n], lens[g : g + n], tau, alpha
        )
        adv += group_adv
        std += [group_std] * n
    as_array = dict(dtype=rewards.dtype, device=device(rewards))
    return xp.asarray(adv, **as_array), xp.asarray(std, **as_array)


@dataclass(frozen=True)
class UCPO(GRPO):
    """GRPO with UCPO's inverse-q advantages over each group's correct set (``ucpo_tau`` in
    [0, 1], the authors' ``tau``; ``ucpo_alpha`` >= 0, their ``alpha``). GRPO's other fields are
    its loss's (TRL's); ``scale_rewards`` is not read (the authors' group std)."""

    name: ClassVar[str] = "ucpo"
    reads_sequence_log_probs: ClassVar[bool] = True
    ucpo_tau: float = 0.2
    ucpo_alpha: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("ucpo_tau", self.ucpo_tau, 0.0, 1.0)
        check_range("ucpo_alpha", self.ucpo_alpha, 0.0, math.inf)

    def advantages(
        self, rewards: Array, sequence_log_probs: Array | None = None, lengths: Array | None = None
    ) -> tuple[Array, Array]:
        """UCPO advantages; needs ``sequence_log_probs`` and ``lengths``."""
        if sequence_log_probs is None or lengths is None:
            raise ValueError("UCPO needs the rows' sequence log-probs and lengths")
        return ucpo_advantages(
            rewards,
            sequence_log_probs,
            lengths,
            self.num_generations,
            self.ucpo_tau,
            self.ucpo_alpha,
        )
