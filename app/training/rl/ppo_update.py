"""PPO's update on one rollout, on TRL's schedule (``PPOTrainer.train``, ``num_ppo_epochs`` and
``num_mini_batches``): what the loss compares against is fixed once from the rollout, then
``num_ppo_epochs`` passes go over its rows, each cut into ``num_mini_batches`` shuffled
mini-batches with one optimizer step per mini-batch (the caller's).

    fixed_rollout    per micro-batch, no gradient: old log-probs, old values, reference log-probs
    step_targets     GAE advantages, returns and KL of the step's whole rollout on this process,
                     advantages whitened once over all its actions (TRL's local batch)
    mini_batches     a permutation of the rows cut into equal mini-batches
    mini_batch_loss  forward with gradients on a mini-batch's rows, loss, backward

Rows are numbered across the step's micro-batches in rollout order (micro-batch 0's rows first).
A mini-batch's rows are scored one micro-batch (one prompt, one forward) at a time; each part's
loss (a masked mean over its actions, ``core.rl.ppo``) is weighted by its share of the mini-batch's
rows, as TRL weights its equal-sized micro-batches 1 / gradient_accumulation_steps. With one
mini-batch the parts are the rollout's micro-batches, each weighted 1 / grad_accum.

Dropout is off (``disable_dropout``, as TRL's PPO does in its policy and value model), so the old
log-probs and values, taken without gradient, are the very function the first pass evaluates:
the first optimizer step sees ratios of 1, every later one exp(log pi - log pi_old) of the policy
as updated so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional

from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.value_head import ValueHead
from raptb.app.training.rl.rl_step import all_finite, reference_log_probs, score_actions
from raptb.app.training.step import LossResult, Trajectories, agreed_finite
from raptb.core.rl.batch import RLBatch
from raptb.core.rl.ppo import PPO, Targets


def disable_dropout(module: torch.nn.Module) -> None:
    """Set every dropout layer of ``module`` to p = 0 (TRL's ``disable_dropout_in_model``)."""
    for layer in module.modules():
        if isinstance(layer, torch.nn.modules.dropout._DropoutNd):
            layer.p = 0.0


@dataclass(frozen=True)
class PPORollout:
    """One micro-batch's rollout and what the epochs keep fixed (b rows, A = T + 1 actions)."""

    batch: Trajectories
    terminal: torch.Tensor
    """[b] terminal rewards."""
    old_log_probs: torch.Tensor
    """[b, A] action log-probs at rollout time."""
    old_values: torch.Tensor
    """[b, A] values at rollout time."""
    ref_log_probs: torch.Tensor | None
    """[b, A] reference log-probs, or None (not needed)."""

    @property
    def rows(self) -> int:
        return int(self.old_log_probs.shape[0])


@torch.no_grad()
def fixed_rollout(
    policy: HFPolicy,
    value_head: ValueHead,
    batch: Trajectories,
    terminal: torch.Tensor,
    *,
    reference: bool,
) -> PPORollout | None:
    """Old log-probs (at the rollout's temperature, as TRL's) and values of ``batch`` from one
    teacher-forced pass without gradient, reference log-probs when ``reference``; None when one of
    them is not finite."""
    log_probs, values = score_actions(
        policy, batch.prompt, batch.tokens, batch.length, value_head, batch.temperature
    )
    ref = reference_log_probs(policy, batch) if reference else None
    if values is None or not all_finite(log_probs, values, ref):
        return None
    return PPORollout(batch, terminal.to(log_probs.dtype), log_probs, values, ref)


def _padded(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    """[sum b_j, width]: the [b_j, A_j] parts, zero-padded on the right, stacked in order."""
    return torch.cat([functional.pad(p, (0, width - int(p.shape[1]))) for p in parts])


def step_targets(objective: PPO, rollouts: list[PPORollout]) -> Targets:
    """(advantages, returns, kl) [N, A_max] of all the rollouts' rows (N = sum of their rows,
    A_max their widest action layout), from the rollout-time values and log-probs; advantages
    whitened over every action of the N rows (``objective.whiten_advantages``)."""
    width = max(int(r.old_log_probs.shape[1]) for r in rollouts)
    old = _padded([r.old_log_probs for r in rollouts], width)
    values = _padded([r.old_values for r in rollouts], width)
    refs = [r.ref_log_probs for r in rollouts if r.ref_log_probs is not None]
    ref = _padded(refs, width) if len(refs) == len(rollouts) else None
    batch = RLBatch(
        log_probs=old,
        old_log_probs=old,
        rewards=torch.cat([r.terminal for r in rollouts]),
        length=torch.cat([r.batch.length for r in rollouts]),
        ref_log_probs=ref,
        values=values,
        old_values=values,
    )
    return objective.advantages(batch)


def mini_batches(rng: np.random.Generator, rows: int, count: int) -> list[np.ndarray]:
    """A permutation of range(rows) drawn from ``rng`` cut into ``count`` equal mini-batches,
    each sorted (its rows in rollout order). ``count`` must divide ``rows``."""
    if count < 1 or rows % count:
        raise ValueError(f"{rows} rows do not split into {count} equal mini-batches")
    return [np.sort(part) for part in np.split(rng.permutation(rows), count)]


def mini_batch_loss(
    policy: HFPolicy,
    objective: PPO,
    value_head: ValueHead,
    rollouts: list[PPORollout],
    targets: Targets,
    rows: np.ndarray,
    agree: Callable[[bool], bool] | None = None,
) -> LossResult | None:
    """Backpropagate the PPO loss of the step's ``rows`` (indices into the rollouts' rows in
    order) with the current policy and value head; the loss and diagnostics weighted as the
    gradient is (each micro-batch's part by its share of the rows). None when a log-prob, value
    or loss is not finite (some parts may have been backpropagated: drop the gradients).

    agree: with several processes, called once per part with whether this process's part is
    finite; it returns whether every process's is, so that all stop before the same backward (a
    collective when the policy is sharded)."""
    advantages, returns, kl = targets
    loss = 0.0
    diagnostics: dict[str, float] = {}
    start = 0
    for rollout in rollouts:
        stop = start + rollout.rows
        own = rows[(rows >= start) & (rows < stop)]
        if len(own):
            part = _part_batch(policy, value_head, rollout, own - start)
            share = len(own) / len(rows)
            global_rows = torch.as_tensor(own, device=advantages.device)
            width = int(rollout.old_log_probs.shape[1])
            part_targets = (
                advantages[global_rows, :width],
                returns[global_rows, :width],
                None if kl is None else kl[global_rows, :width],
            )
            value: torch.Tensor | None = None
            if part is not None:
                value, part_diagnostics = objective(part, part_targets)
            if not agreed_finite(value, agree) or value is None:
                return None
            (value * share).backward()
            loss += share * float(value.detach())
            for key, item in part_diagnostics.items():
                diagnostics[key] = diagnostics.get(key, 0.0) + share * item
        start = stop
    return LossResult(loss, diagnostics)


def _part_batch(
    policy: HFPolicy, value_head: ValueHead, rollout: PPORollout, local: np.ndarray
) -> RLBatch | None:
    """The RLBatch of ``local`` rows of one rollout: current log-probs and values (with
    gradients) beside the fixed ones; None when one is not finite."""
    batch = rollout.batch
    index = torch.as_tensor(local, device=batch.tokens.device)
    length = batch.length[index]
    log_probs, values = score_actions(
        policy, batch.prompt, batch.tokens[index], length, value_head, batch.temperature
    )
    if values is None or not all_finite(log_probs, values):
        return None
    return RLBatch(
        log_probs=log_probs,
        old_log_probs=rollout.old_log_probs[index],
        rewards=rollout.terminal[index],
        length=length,
        ref_log_probs=None if rollout.ref_log_probs is None else rollout.ref_log_probs[index],
        values=values,
        old_values=rollout.old_values[index],
    )
