"""GRPO loss (Shao et al. 2024) with TRL's names, defaults and loss types, in the action layout.

Follows ``GRPOConfig`` and ``GRPOTrainer._compute_loss`` of TRL 1.16 (``trl/trainer/``). Per
action t <= tau of row b (``core.rl.batch``: the stop is an action), with A_b the group-normalised
advantage (``core.rl.advantages.group_advantages``) and the importance weight

    w = exp(log pi - log pi_old)                        importance_sampling_level = "token"
    w = exp(mean_{t<=tau} (log pi - log pi_old))        "sequence" (GSPO), one weight per row

the per-action loss is

    clip types (grpo, bnpo, dr_grpo, dapo, luspo):
        l_t = -min(w' A, clip(w, 1 - epsilon, 1 + epsilon_high) A),  w' = min(w, delta) if delta
    cispo:  l_t = -stopgrad(min(w, epsilon_high)) A log pi_t
    sapo:   l_t = -sigmoid(s (w - 1)) 4 / s A,   s = sapo_temperature_pos if A > 0 else _neg

plus, when beta != 0, beta * k3_t with k3_t = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1,
multiplied by w when ``use_bias_correction_kl`` (TRL's default). The loss aggregates l over the
masked actions m (TRL's normalisations):

    grpo, sapo : mean_b ( sum_t l m / sum_t m )                (per-sequence mean, then batch)
    bnpo       : sum l m / sum m                                (token mean of the micro-batch)
    dr_grpo    : sum l m / (B * max_completion_length)          (a constant)
    dapo, cispo: sum l m / (num_items_in_batch / grad_accum)    (token mean of the whole window)
    luspo      : mean_b sum_t l m                               (sequence sums)

and subtracts entropy_coef * H, H the mean per-action entropy of the policy (TRL's: for
dapo/cispo the sum of the entropies over their token normaliser, so that it adds up to the
window's mean; for the others the micro-batch's mean); with ``use_adaptive_entropy`` the
coefficient is the controller's of ``core.rl.entropy`` (passed in by the trainer). Every loss is the
micro-batch loss *before* the trainer divides by its ``grad_accum``: summed over the window and
divided by grad_accum it equals TRL's loss (dapo's normaliser carries the grad_accum for that),
when ``num_items_in_batch`` is the generation batch's action count divided by the number of
processes (TRL's normaliser) and the advantages are those of the whole generation batch
(``advantages``, from ``group_advantages`` over every process's rows: ``scale_rewards = "batch"``
takes the std of all of them). The trainer (app.rl_train) passes both. As in TRL, grpo, sapo,
dr_grpo and dapo/cispo then give the same step loss however the batch is split into
micro-batches of equal size; bnpo (a token mean per micro-batch) does not.

With one optimisation pass per rollout (TRL's ``num_iterations = 1``) pi_old is pi detached, so
w = 1 in value while its gradient is grad log pi; the general form is kept for several passes.
Not implemented from TRL: ``vespo``, ``top_entropy_quantile``, ``off_policy_mask_threshold``,
vLLM importance-sampling corrections, ``mask_truncated_completions`` (our stop is never
truncated: the rollout forces the stop at the maximum length).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from raptb.core.autograd import stop_gradient
from raptb.core.checks import check_range
from raptb.core.rl.advantages import (
    SCALE_REWARDS,
    ScaleRewards,
    group_advantages,
    kl_estimate,
    masked_mean,
)
from raptb.core.rl.base import RLObjective
from raptb.core.rl.batch import RLBatch

Array = Any
Diagnostics = dict[str, float]

LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo")
CLIP_LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
IMPORTANCE_SAMPLING_LEVELS: tuple[str, ...] = ("token", "sequence")


def _weighted_mean(x: Array, batch: RLBatch) -> Array:
    """TRL's logging mean: over masked actions for [B, A], over rows for a per-row [B, 1]."""
    xp = batch.xp
    if int(x.shape[1]) == 1:
        return xp.mean(x)
    return masked_mean(x, batch.action_mask)


def _optional_positive(name: str, value: float | None) -> None:
    if value is not None:
        check_range(name, value, 0.0, math.inf, lo_open=True)


# CISPO's upper clip of the importance weight when a run's [rl] section leaves epsilon_high unset:
# ScaleRL's value (TRL recommends it; its own default, epsilon, would cap every weight at 0.2)
CISPO_EPSILON_HIGH = 5.0


@dataclass(frozen=True)
class GRPO(RLObjective):
    """Group relative policy optimisation; defaults are TRL 1.16's ``GRPOConfig`` defaults."""

    name: ClassVar[str] = "grpo"
    grouped: ClassVar[bool] = True
    # whether ``advantages`` reads the rows' sequence log-probs under the behaviour policy (UCPO);
    # the algorithm then scores them (without gradients) before the step's advantages
    reads_sequence_log_probs: ClassVar[bool] = False
    # whether ``advantages`` reads each row's outcome (its token sequence, IPS-GRPO's counts)
    reads_outcomes: ClassVar[bool] = False
    num_generations: int = 8
    scale_rewards: ScaleRewards = "group"
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"] = "dapo"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    importance_sampling_level: Literal["token", "sequence"] = "token"
    max_completion_length: int | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    entropy_coef: float = 0.0
    use_adaptive_entropy: bool = False
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2

    def __post_init__(self) -> None:
        n = self.num_generations
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            # TRL: "GRPO requires at least 2 generations per prompt to calculate the advantages"
            raise ValueError(f"num_generations: must be an integer >= 2, got {n!r}")
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(
                f"scale_rewards: must be one of {SCALE_REWARDS}, got {self.scale_rewards!r}"
            )
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type: must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"importance_sampling_level: must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
                f"got {self.importance_sampling_level!r}"
            )
        check_range("epsilon", self.epsilon, 0.0, math.inf)
        if self.epsilon_high is not None:
            check_range("epsilon_high", self.epsilon_high, 0.0, math.inf)
        _optional_positive("delta", self.delta)
        check_range("beta", self.beta, 0.0, math.inf)
        check_range("sapo_temperature_pos", self.sapo_temperature_pos, 0.0, math.inf, True)
        check_range("sapo_temperature_neg", self.sapo_temperature_neg, 0.0, math.inf, True)
        check_range("entropy_coef", self.entropy_coef, 0.0, math.inf)
        check_range("entropy_coef_min", self.entropy_coef_min, 0.0, math.inf)
        check_range("entropy_coef_max", self.entropy_coef_max, self.entropy_coef_min, math.inf)
        check_range("entropy_coef_delta", self.entropy_coef_delta, 0.0, math.inf)
        check_range("entropy_target", self.entropy_target, 0.0, math.inf)
        if not isinstance(self.use_adaptive_entropy, bool):
            raise ValueError(
                f"use_adaptive_entropy: must be a bool, got {self.use_adaptive_entropy!r}"
            )
        m = self.max_completion_length
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"max_completion_length: must be None or an integer >= 1, got {m!r}")
        if not isinstance(self.use_bias_correction_kl, bool):
            raise ValueError(
                f"use_bias_correction_kl: must be a bool, got {self.use_bias_correction_kl!r}"
            )

    @classmethod
    def config_kwargs(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The base's, with epsilon_high ``CISPO_EPSILON_HIGH`` for cispo when it is unset."""
        kwargs = super().config_kwargs(options)
        if kwargs.get("loss_type") == "cispo" and kwargs.get("epsilon_high") is None:
            kwargs["epsilon_high"] = CISPO_EPSILON_HIGH
        return kwargs

    @property
    def uses_reference(self) -> bool:
        """The k3 KL penalty reads the reference when beta != 0."""
        return self.beta != 0.0

    def _token_normaliser(
        self, mask: Array, num_items_in_batch: float | None, grad_accum: int
    ) -> Array | float:
        """dapo/cispo's divisor: the window's action count over grad_accum (TRL's
        ``num_items_in_batch`` per process), or this micro-batch's count without it."""
        if num_items_in_batch is None:
            return mask.sum()  # >= 1: every row has its stop action
        return max(float(num_items_in_batch), 1.0) / grad_accum

    def _entropy_bonus(
        self,
        batch: RLBatch,
        entropy_mean: Array,
        num_items_in_batch: float | None,
        grad_accum: int,
    ) -> Array:
        """TRL's entropy term: the mean per-action entropy whatever the loss type, so that over
        the step it adds up to the window's mean. dapo/cispo: sum H m over their token
        normaliser; the others: this micro-batch's mean (the trainer divides by grad_accum)."""
        if self.loss_type not in ("dapo", "cispo"):
            return entropy_mean
        mask = batch.xp.astype(batch.action_mask, batch.log_probs.dtype)
        total = batch.xp.sum(batch.masked(batch.entropy) * mask)
        return total / self._token_normaliser(mask, num_items_in_batch, grad_accum)

    def advantages(
        self, rewards: Array, sequence_log_probs: Array | None = None, lengths: Array | None = None
    ) -> tuple[Array, Array]:
        """Advantages [B] of ``rewards`` [B] (whole groups of num_generations rows) and the std
        [B] each was divided by; a subclass may read each row's ``sequence_log_probs`` [B] (sum
        of the behaviour log-probs of its actions) and ``lengths`` [B] (its action count, tau + 1),
        given when it sets ``reads_sequence_log_probs``."""
        return group_advantages(rewards, self.num_generations, self.scale_rewards)

    @property
    def uses_entropy(self) -> bool:
        """The entropy bonus reads the per-state entropy: a static entropy_coef != 0, or the
        adaptive control (whose coefficient may come back from 0), as TRL's."""
        return self.entropy_coef != 0.0 or self.use_adaptive_entropy

    @property
    def epsilon_low(self) -> float:
        return self.epsilon

    @property
    def upper_epsilon(self) -> float:
        """epsilon_high, defaulting to epsilon (TRL)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def __call__(
        self,
        batch: RLBatch,
        *,
        num_items_in_batch: float | None = None,
        grad_accum: int = 1,
        advantages: tuple[Array, Array] | None = None,
        entropy_coef: float | None = None,
    ) -> tuple[Array, Diagnostics]:
        """Loss and detached diagnostics of one micro-batch.

        ``num_items_in_batch``: active actions (sum of tau + 1) over the ``grad_accum``
        micro-batches of one optimizer step (per process, TRL's normaliser); only dapo and cispo
        read it, and without it they use this micro-batch's count (then equal to bnpo).
        ``advantages``: (advantages [B], the std [B] each was divided by) of these rows, computed
        over the whole generation batch; None: from this batch's rewards, which must then hold
        whole groups. ``entropy_coef``: the coefficient of the entropy bonus in this call (the
        adaptive controller's, ``core.rl.entropy``); None: the field's. ``batch.ref_log_probs`` is
        required when beta != 0, ``batch.entropy`` when ``uses_entropy``.
        """
        xp = batch.xp
        if self.beta != 0.0 and batch.ref_log_probs is None:
            raise ValueError("GRPO with beta != 0 needs ref_log_probs (the reference model)")
        if self.uses_entropy and batch.entropy is None:
            raise ValueError(
                "GRPO with entropy_coef != 0 or use_adaptive_entropy needs the per-state entropy"
            )
        mask = xp.astype(batch.action_mask, batch.log_probs.dtype)
        rewards = stop_gradient(batch.rewards)
        if advantages is None:
            old = batch.masked(stop_gradient(batch.old_log_probs))
            adv_flat, std = self.advantages(
                rewards, xp.sum(old * mask, axis=1), xp.sum(mask, axis=1)
            )
        else:
            adv_flat, std = (stop_gradient(a) for a in advantages)
        adv = adv_flat[:, None]
        log_probs = batch.masked(batch.log_probs)
        log_ratio = log_probs - batch.masked(stop_gradient(batch.old_log_probs))
        if self.importance_sampling_level == "sequence":
            log_w = xp.sum(log_ratio * mask, axis=1, keepdims=True) / xp.sum(
                mask, axis=1, keepdims=True
            )
        else:
            log_w = log_ratio
        coef_1 = xp.exp(log_w)
        eps_high = self.upper_epsilon

        if self.loss_type == "cispo":
            per_token = -stop_gradient(xp.minimum(coef_1, xp.full_like(coef_1, eps_high)))
            per_token = per_token * adv * log_probs
        elif self.loss_type == "sapo":
            temp = xp.where(
                adv > 0,
                xp.full_like(adv, self.sapo_temperature_pos),
                xp.full_like(adv, self.sapo_temperature_neg),
            )
            gate = 1.0 / (1.0 + xp.exp(-temp * (coef_1 - 1.0)))
            per_token = -gate * 4.0 / temp * adv
        else:
            coef_2 = xp.clip(coef_1, 1.0 - self.epsilon_low, 1.0 + eps_high)
            unclipped = (
                coef_1
                if self.delta is None
                else xp.minimum(coef_1, xp.full_like(coef_1, self.delta))
            )
            per_token = -xp.minimum(unclipped * adv, coef_2 * adv)

        kl = None
        if batch.ref_log_probs is not None:
            kl = kl_estimate(log_probs, batch.masked(stop_gradient(batch.ref_log_probs)), "k3")
        if self.beta != 0.0 and kl is not None:  # kl is present: checked on entry
            penalty = kl * coef_1 if self.use_bias_correction_kl else kl
            per_token = per_token + self.beta * penalty

        # masked sums after broadcasting: a per-row [B, 1] loss (sequence level) spreads over
        # every action of the row, as in TRL
        masked_loss = per_token * mask
        b = batch.batch_size
        if self.loss_type in ("grpo", "sapo"):
            loss = xp.mean(xp.sum(masked_loss, axis=1) / xp.sum(mask, axis=1))
        elif self.loss_type == "bnpo":
            loss = xp.sum(masked_loss) / xp.sum(mask)
        elif self.loss_type == "dr_grpo":
            width = self.max_completion_length or batch.num_actions
            loss = xp.sum(masked_loss) / float(b * width)
        elif self.loss_type in ("dapo", "cispo"):
            loss = xp.sum(masked_loss) / self._token_normaliser(
                mask, num_items_in_batch, grad_accum
            )
        else:  # luspo
            loss = xp.mean(xp.sum(masked_loss, axis=1))
        policy_loss = loss

        entropy_mean = None
        if batch.entropy is not None:
            entropy_mean = masked_mean(batch.entropy, batch.action_mask)
            coef = self.entropy_coef if entropy_coef is None else entropy_coef
            if self.uses_entropy and coef != 0.0:
                loss = loss - coef * self._entropy_bonus(
                    batch, entropy_mean, num_items_in_batch, grad_accum
                )

        nan = float("nan")
        if self.loss_type in CLIP_LOSS_TYPES:
            low = xp.astype((coef_1 < 1.0 - self.epsilon_low) & (adv < 0), mask.dtype)
            high = xp.astype((coef_1 > 1.0 + eps_high) & (adv > 0), mask.dtype)
            clip = (_weighted_mean(low, batch), _weighted_mean(high, batch))
            clip_stats = [float(stop_gradient(c)) for c in clip]
            clip_stats.append(float(stop_gradient(_weighted_mean(low + high, batch))))
        elif self.loss_type == "cispo":
            high = xp.astype((coef_1 > eps_high) & (adv > 0), mask.dtype)
            frac = float(stop_gradient(_weighted_mean(high, batch)))
            clip_stats = [0.0, frac, frac]
        else:
            clip_stats = [nan, nan, nan]
        return loss, {
            "loss": float(stop_gradient(loss)),
            "policy_loss": float(stop_gradient(policy_loss)),
            "reward_mean": float(xp.mean(rewards)),
            "reward_std": float(xp.mean(std)),
            "frac_reward_zero_std": float(xp.mean(xp.astype(xp.abs(std) <= 1e-8, std.dtype))),
            "advantage_mean": float(xp.mean(adv_flat)),
            "advantage_abs_mean": float(xp.mean(xp.abs(adv_flat))),
            "ratio_mean": float(stop_gradient(_weighted_mean(coef_1, batch))),
            "clip_frac_low": clip_stats[0],
            "clip_frac_high": clip_stats[1],
            "clip_frac": clip_stats[2],
            "kl": nan if kl is None else float(stop_gradient(masked_mean(kl, batch.action_mask))),
            "entropy": nan if entropy_mean is None else float(stop_gradient(entropy_mean)),
            "sampled_neg_log_prob": float(
                stop_gradient(masked_mean(-log_probs, batch.action_mask))
            ),
        }
