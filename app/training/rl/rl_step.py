"""The stages of the RL baselines (PPO, GRPO) on the GFlowNet trainer's rollout and reward.

    step_batch          -> Trajectories   the step's on-policy rows, one rollout, pieces by prompt
    reward (step)       -> Rewards        per-prefix task rewards u (and kappa log P_ref for log R)
    sequence_rewards    -> [B]            the terminal reward each sequence is judged by
    rl_loss_step        -> LossResult     rescoring in the action layout, reference, loss, backward

(``step_batch`` and ``step`` are app.training's modules.)

For GRPO a prompt's rows are consecutive groups of num_generations (``core.rl.grpo``).
GRPO takes one optimisation pass per rollout (TRL's ``num_iterations = 1``): the old log-probs
are the current ones detached, so every ratio is 1 in value while its gradient is that of log pi,
exactly as TRL computes it without a second pass. PPO's several passes per rollout are
``app.training.rl.ppo_update``'s, built on ``score_actions`` and ``reference_log_probs`` here. The
policy's log pi, old and current, and the reference's are the model's full softmax of logits / T at
the rollout's temperature T (``rl.temperature``), as TRL scores GRPO's and PPO's log-probs; the
GFlowNet objectives score T = 1 whatever they sampled at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

import torch

from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.value_head import ValueHead, prefix_values
from raptb.app.training.step import LossResult, Rewards, Trajectories, agreed_finite
from raptb.core.rl.base import RLObjective
from raptb.core.rl.batch import RLBatch, action_log_probs


def sequence_rewards(rewards: Rewards, length: torch.Tensor, source: str) -> torch.Tensor:
    """Terminal rewards [B] at each row's stop, tau: ``"task"`` u_tau = lambda S(text), or
    ``"log_r"`` log R_tau = u_tau + kappa log P_ref(text + stop)."""
    table = rewards.u if source == "task" else rewards.log_r
    return table.gather(1, length.to(table.device)[:, None]).squeeze(1)


def score_actions(
    policy: HFPolicy,
    prompt: str,
    tokens: torch.Tensor,
    length: torch.Tensor,
    value_head: ValueHead | None,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Action log-probs [B, T+1] of ``tokens`` [B, T] (``length`` [B]) under the softmax of
    logits / ``temperature`` from one teacher-forced pass (with gradients unless under
    ``torch.no_grad``), and the values [B, T+1] from its last hidden states when ``value_head`` is
    given (else None)."""
    if value_head is None:
        log_pf, log_pterm = policy.score(prompt, tokens, length, temperature)
        return action_log_probs(log_pf, log_pterm, length), None
    log_pf, log_pterm, hidden = policy.score_with_hidden(prompt, tokens, length, temperature)
    values = prefix_values(value_head, hidden, len(policy.prompt_ids(prompt)), length)
    return action_log_probs(log_pf, log_pterm, length), values


def reference_log_probs(policy: HFPolicy, batch: Trajectories) -> torch.Tensor:
    """The reference model's action log-probs [B, T+1] of ``batch`` at its rollout's temperature
    (no gradient)."""
    ref_pf, ref_pterm = policy.reference_score(
        batch.prompt, batch.tokens, batch.length, batch.temperature
    )
    return action_log_probs(ref_pf, ref_pterm, batch.length)


def all_finite(*arrays: torch.Tensor | None) -> bool:
    """Whether every entry of the given tensors (None skipped) is finite."""
    return all(bool(torch.isfinite(a).all()) for a in arrays if a is not None)


def rl_batch(
    policy: HFPolicy,
    batch: Trajectories,
    terminal: torch.Tensor,
    *,
    value_head: ValueHead | None,
    reference: bool,
    entropy: bool = False,
) -> RLBatch | None:
    """The micro-batch in the action layout: log-probs (with gradients) at the rollout's
    temperature from one teacher-forced pass, values from its last hidden states when
    ``value_head`` is given, reference log-probs when ``reference``, the policy's per-state
    entropy (with gradients, same pass; not with a value head) when ``entropy``. None when a
    log-probability, value or entropy is not finite."""
    entropies = None
    if entropy:
        log_pf, log_pterm, entropies = policy.score_with_entropy(
            batch.prompt, batch.tokens, batch.length, batch.temperature
        )
        log_probs, values = action_log_probs(log_pf, log_pterm, batch.length), None
    else:
        log_probs, values = score_actions(
            policy, batch.prompt, batch.tokens, batch.length, value_head, batch.temperature
        )
    ref = reference_log_probs(policy, batch) if reference else None
    if not all_finite(log_probs, ref, values, entropies):
        return None
    return RLBatch(
        log_probs=log_probs,
        old_log_probs=log_probs.detach(),
        rewards=terminal.to(log_probs.dtype),
        length=batch.length,
        ref_log_probs=ref,
        values=values,
        old_values=None if values is None else values.detach(),
        entropy=entropies,
    )


def joined(batches: Sequence[RLBatch]) -> RLBatch:
    """One RLBatch of the rows of ``batches`` (same action width), in order."""
    if len(batches) == 1:
        return batches[0]

    def cat(name: str) -> torch.Tensor | None:
        values = [getattr(b, name) for b in batches]
        return None if values[0] is None else torch.cat(values)

    return RLBatch(
        **{f.name: cat(f.name) for f in fields(RLBatch)}  # type: ignore[arg-type]
    )


def rl_loss_step(
    policy: HFPolicy,
    objective: RLObjective,
    parts: Sequence[tuple[Trajectories, torch.Tensor]],
    weight: float,
    *,
    value_head: ValueHead | None = None,
    agree: Callable[[bool], bool] | None = None,
    **objective_kwargs: Any,
) -> LossResult | None:
    """Evaluate ``objective`` on a micro-batch, the rows of ``parts`` (each a piece of one prompt
    with its terminal rewards [b]) in order, and backpropagate weight x loss (weight: the
    micro-batch's share of the step). None, with no backward, when the loss is not finite.

    agree: with several processes, called once with whether this process's loss is finite; it
    returns whether every process's is, so that all skip the backward (and the step) together.
    objective_kwargs: passed to the objective (GRPO: the step's advantages and token count)."""
    reference, entropy = objective.uses_reference, objective.uses_entropy
    batches = [
        rl_batch(
            policy, batch, terminal, value_head=value_head, reference=reference, entropy=entropy
        )
        for batch, terminal in parts
    ]
    loss: torch.Tensor | None = None
    if all(b is not None for b in batches):
        loss, diagnostics = objective(joined(batches), **objective_kwargs)  # type: ignore[arg-type]
    if not agreed_finite(loss, agree) or loss is None:
        return None
    (loss * weight).backward()
    return LossResult(float(loss.detach()), diagnostics)
