"""The stages of a training step on pieces of rows (one prompt, one kind each), typed values on.

    step_batch     -> Trajectories   the step's rows: one rollout, replay and oracle rows
    reward         -> Rewards        task scores per prefix, u, the reference prior kappa log P_ref
    loss_step      -> LossResult     teacher-forced rescoring, objective, backward (a micro-batch)
    new_items                        the on-policy rows as replay items, for the buffer update

(``step_batch`` and ``replay_items``, where ``new_items`` lives, are app.training's modules.)

The trainer calls them in this order (``Trainer._optimizer_step``) and
``benchmarks/train_step.py`` times the same functions. Tokens stay tensors on the policy's device
from the rollout to the loss; their host copy (``Trajectories.rows``) and the texts are the
rollout's own, so nothing is decoded or rebuilt; task rewards become a tensor once, in
``reward``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from raptb.adapters.lm.lanes import backward
from raptb.adapters.lm.policy import HFPolicy, to_prefix_batch
from raptb.adapters.lm.rollout import RolloutTimings
from raptb.adapters.tasks.registry import TaskSpec, task_spec
from raptb.app.reward.prefix import PrefixScorer
from raptb.app.reward.reference import reference_log_prob
from raptb.core.gfn.batch import PrefixBatch
from raptb.core.gfn.objectives import Objective
from raptb.core.ports import Score, Task


@dataclass(frozen=True)
class Trajectories:
    """B trajectories of one prompt (a piece of a step, or one micro-batch's rows of it).

    tokens: LongTensor [B, T] on the policy's device, ``pad_id`` after each row's stop.
    length: LongTensor [B] (tau, tokens before the stop), same device.
    rows: each row's ids x_1..x_tau on the host (replay storage, prefix texts).
    texts: each row's generated text, stop excluded.
    on_policy: the rows sampled by the policy here (not replayed, not oracle): the rows that count
        for Acc and enter the buffer.
    stored_u: float64 [B, T+1], the task-only rewards stored with replayed items (0 after tau);
        None when the batch was sampled.
    temperature: the mean behaviour temperature of its rows (1.0 for stored rows).
    timings: the rollout's timings when it is a rollout of its own; else None.
    """

    prompt: str
    tokens: torch.Tensor
    length: torch.Tensor
    rows: tuple[tuple[int, ...], ...]
    texts: tuple[str, ...]
    on_policy: tuple[int, ...]
    stored_u: np.ndarray | None
    temperature: float
    timings: RolloutTimings | None

    @property
    def replayed(self) -> bool:
        return self.stored_u is not None

    def take(self, rows: slice) -> Trajectories:
        """Its rows ``rows`` (on_policy renumbered)."""
        kept = range(len(self.rows))[rows]
        on_policy = set(self.on_policy)
        return Trajectories(
            prompt=self.prompt,
            tokens=self.tokens[rows],
            length=self.length[rows],
            rows=self.rows[rows],
            texts=self.texts[rows],
            on_policy=tuple(i for i, b in enumerate(kept) if b in on_policy),
            stored_u=None if self.stored_u is None else self.stored_u[rows],
            temperature=self.temperature,
            timings=None,
        )


@dataclass(frozen=True)
class Rewards:
    """Per-prefix rewards of a micro-batch's B rows, T = max length.

    u_host: float64 [B, T+1], task-only rewards u (0 after tau), as replay items store them.
    scores: the terminal Score of each row; None for a replayed batch whose stored u is reused.
    u: float32 [B, T+1], ``u_host`` on the policy's device.
    prior: float32 [B, T+1], kappa log P_ref of each prefix; None when kappa = 0.
    log_r: float32 [B, T+1], u + prior (u when kappa = 0).
    """

    u_host: np.ndarray
    scores: list[Score] | None
    u: torch.Tensor
    prior: torch.Tensor | None
    log_r: torch.Tensor
    s_host: np.ndarray | None = None
    """float64 [B, T+1], the task scores S per prefix (u = scale S); None with ``scores``."""

    def take(self, rows: slice) -> Rewards:
        """The rewards of rows ``rows``."""
        return Rewards(
            u_host=self.u_host[rows],
            scores=None if self.scores is None else self.scores[rows],
            u=self.u[rows],
            prior=None if self.prior is None else self.prior[rows],
            log_r=self.log_r[rows],
            s_host=None if self.s_host is None else self.s_host[rows],
        )


@dataclass(frozen=True)
class LossResult:
    """A micro-batch's loss (before its weight in the step) and the objective's diagnostics."""

    loss: float
    diagnostics: dict[str, float]


# --- rows ------------------------------------------------------------------------------------


def sample_trajectories(
    policy: HFPolicy,
    task: Task,
    prompt: str,
    n: int,
    temperature: float,
    generator: torch.Generator,
) -> Trajectories:
    """``n`` constrained rollouts of one prompt at ``temperature``; every row is on-policy."""
    rollout = policy.sample(
        prompt,
        n,
        min_length=task.min_length,
        max_length=task.max_length,
        temperature=temperature,
        generator=generator,
        record=False,  # rescored by the loss: the rollout's own log-probabilities go unread
    )
    return Trajectories(
        prompt=prompt,
        tokens=rollout.tokens,
        length=rollout.length,
        rows=tuple(rollout.rows),
        texts=tuple(rollout.texts),
        on_policy=tuple(range(n)),
        stored_u=None,
        temperature=temperature,
        timings=rollout.timings,
    )


# --- reward ------------------------------------------------------------------------------------


def reward(
    scorer: PrefixScorer,
    policy: HFPolicy,
    batch: Trajectories,
    kappa: float,
    scale: float | None = None,
    rescore: bool = False,
) -> Rewards:
    """Task rewards u = scale * S of every prefix and, when kappa > 0, the reference prior
    kappa log P_ref from the frozen reference model.

    scale: the task term's weight (lambda, divided by the reward temperature when there is one);
        None: the scorer's ``reward_scale``.
    rescore: score a replayed batch again (through the cache) instead of reusing the u stored
        with its items; the trainer asks for it when the reward is scheduled, where stored u
        would carry an older lambda. A sampled batch is always scored: every distinct uncached
        prefix text of the batch in one ``scorer`` call.
    """
    max_length = batch.tokens.shape[1]
    scores = s_host = None
    if batch.stored_u is not None and not rescore:
        u_host = batch.stored_u
    else:
        scored = scorer.score_rows(batch.prompt, batch.rows, max_length, batch.texts)
        scale = scorer.reward_scale if scale is None else scale
        u_host, scores, s_host = scale * scored.s, scored.scores, scored.s
    u = torch.as_tensor(u_host, dtype=torch.float32, device=batch.tokens.device)
    if kappa <= 0:
        return Rewards(u_host=u_host, scores=scores, u=u, prior=None, log_r=u, s_host=s_host)
    prior = kappa * reference_log_prob(policy, batch.prompt, batch.tokens, batch.length)
    return Rewards(u_host=u_host, scores=scores, u=u, prior=prior, log_r=u + prior, s_host=s_host)


def with_prior(
    policy: HFPolicy, scored: Sequence[tuple[Trajectories, Rewards]], kappa: float
) -> list[tuple[Trajectories, Rewards]]:
    """``scored`` (rewarded with kappa = 0) with the reference prior kappa log P_ref added to
    each row's log-rewards, from one reference forward over all their rows (each with its own
    prompt): a step's pieces take one forward however they are cut. Unchanged when kappa <= 0."""
    if kappa <= 0 or not scored:
        return list(scored)
    prior = kappa * reference_log_prob(
        policy,
        row_prompts(batch for batch, _ in scored),
        torch.cat([batch.tokens for batch, _ in scored]),
        torch.cat([batch.length for batch, _ in scored]),
    )
    out, start = [], 0
    for batch, rewards in scored:
        part = prior[start : start + len(batch.rows)]
        start += len(batch.rows)
        out.append((batch, replace(rewards, prior=part, log_r=rewards.u + part)))
    return out


def row_prompts(batches: Iterable[Trajectories]) -> list[str]:
    """The prompt of every row of ``batches``, in order."""
    return [batch.prompt for batch in batches for _ in batch.rows]


def correct_texts(
    task: Task, batch: Trajectories, rewards: Rewards, spec: TaskSpec | None = None
) -> list[str]:
    """Texts of the on-policy rows that are a success for the task (one per row: Acc counts
    repeats), by its spec's ``is_correct`` (``spec``: the trainer's, else looked up by name)."""
    if rewards.scores is None:
        return []
    is_correct = (spec or task_spec(task.name)).is_correct
    return [batch.texts[b] for b in batch.on_policy if is_correct(rewards.scores[b])]


# --- loss --------------------------------------------------------------------------------------


def loss_step(
    policy: HFPolicy,
    objective: Objective,
    log_z: torch.Tensor,
    parts: Sequence[tuple[Trajectories, Rewards]],
    step: int,
    weight: float,
    agree: Callable[[bool], bool] | None = None,
    extra_term: Callable[[PrefixBatch], torch.Tensor] | None = None,
    **objective_kwargs: Any,
) -> LossResult | None:
    """Rescore a micro-batch, the rows of ``parts`` in order, under the current policy (one
    teacher-forced forward with gradients, each row with its part's prompt), evaluate the
    objective on them together and backpropagate weight x loss (the micro-batch's share of the
    step's rows). None, with no backward, when the log-probabilities or the loss are not finite.

    agree: for a model sharded across processes (whose backward is a collective), called once
    with whether this process's loss is finite; it returns whether every process's is, and all
    skip the backward together otherwise (one forward per call, whatever the prompts, so every
    process runs as many as the others).
    extra_term: a term added to the objective's loss, from the same rescored rows (the GFlowNet
    algorithm's mode bonus, core.gfn.mode_bonus).
    objective_kwargs: passed to the objective (VarGrad's ``log_z_hat`` held for the step)."""
    length = torch.cat([batch.length for batch, _ in parts])
    log_pf, log_pterm = policy.score(
        row_prompts(batch for batch, _ in parts),
        torch.cat([batch.tokens for batch, _ in parts]),
        length,
    )
    loss: torch.Tensor | None = None
    if torch.isfinite(log_pf).all() and torch.isfinite(log_pterm).all():
        prefixes = to_prefix_batch(
            log_pf,
            log_pterm,
            torch.cat([rewards.log_r for _, rewards in parts]),
            torch.cat([rewards.u for _, rewards in parts]),
            length,
        )
        loss, diagnostics = objective(prefixes, log_z, step, **objective_kwargs)
        if extra_term is not None:
            loss = loss + extra_term(prefixes)
    if not agreed_finite(loss, agree) or loss is None:
        return None
    backward(loss * weight)  # in a lane, into the lane's own sums (adapters.lm.lanes)
    return LossResult(float(loss.detach()), diagnostics)


def agreed_finite(loss: torch.Tensor | None, agree: Callable[[bool], bool] | None) -> bool:
    """Whether ``loss`` exists and is finite, on every process when ``agree`` (called exactly
    once, e.g. ``DistContext.all_true``) is given: asked before a backward that is a collective,
    so that every process skips it or none does."""
    finite = loss is not None and bool(torch.isfinite(loss))
    return finite if agree is None else agree(finite)
