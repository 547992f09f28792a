"""The rows of one optimizer step: one rollout, replay and oracle rows, micro-batches for the loss.

A step holds R = batch_size x grad_accum rows (summed over processes). Its layout depends on R
and the seed only, never on how R is split into micro-batches (the split is a memory knob):

- prompts: consecutive runs of ``rows_per_prompt`` rows share a prompt, and a step takes
  ceil(R / rows_per_prompt) prompts in turn, continuing where the previous step stopped
  (``step_prompts``);
- behaviour, per row (replay.md's mix, per row instead of per micro-batch, so the same in
  expectation): with probability p_replay, when the buffer holds items for the row's prompt, the
  row is drawn from the buffer as it stands at the step's start; otherwise it is on-policy at
  temperature 1, or with probability low_temp_prob at a temperature drawn uniformly from
  [T_lo, T_hi]; with Oracle replay an on-policy row is replaced by an oracle solution with
  probability p_oracle x oracle_fraction, when the oracle holds the prompt (``plan_rows``, in
  app.training.gflownet.row_plan; the RL losses' rows are all on-policy, ``on_policy_plan``). The
  shared RNG draws three uniforms and one temperature per row, whatever is used, then the buffer
  and oracle draws prompt by prompt;
- all on-policy rows of the step are rolled out together, in one ``policy.sample`` call with
  per-row prompts and temperatures (``collect_step``).

Each process keeps its contiguous share of the rows, ordered prompt by prompt as on-policy,
oracle, replayed rows: one ``Trajectories`` piece each, which app.training.step scores as before.
The loss then runs over micro-batches of ``batch_size`` of this process's rows (``micro_batches``);
a micro-batch may span pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch

from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.rollout import RolloutTimings
from raptb.app.task_and_policy import pad_rows
from raptb.app.training.step import Trajectories
from raptb.core.ports import Task
from raptb.core.replay import ReplayItem

SAMPLED, ORACLE, REPLAYED = 0, 1, 2
"""A row's kind in ``RowPlan.kind``, in the order a prompt's pieces are laid out."""


def step_prompts(prompts: Sequence[str], step: int, rows: int, rows_per_prompt: int) -> list[str]:
    """The prompt of each of step ``step``'s ``rows`` rows (see the module docstring)."""
    per_step = -(-rows // rows_per_prompt)
    first = step * per_step
    return [prompts[(first + r // rows_per_prompt) % len(prompts)] for r in range(rows)]


@dataclass(frozen=True)
class RowPlan:
    """The behaviour of each of a step's R rows (all processes' rows, in order).

    prompt: each row's prompt. kind: int8 [R], SAMPLED, ORACLE or REPLAYED.
    temperature: float64 [R], the behaviour temperature of a sampled row (1.0 for the others).
    items: the stored item an oracle or replayed row is, by row index.
    """

    prompt: tuple[str, ...]
    kind: np.ndarray
    temperature: np.ndarray
    items: dict[int, ReplayItem]


def on_policy_plan(prompts: Sequence[str], temperature: float, rng: np.random.Generator) -> RowPlan:
    """Every row sampled by the policy at ``temperature`` (the RL baselines: no replay, no
    oracle). ``rng`` (shared by all processes) takes the four draws per row that ``plan_rows``
    takes, whatever is used, so that what reads the stream next (PPO's mini-batch shuffles) sees
    it where it would after any plan."""
    n = len(prompts)
    rng.random(4 * n)
    kind = np.full(n, SAMPLED, dtype=np.int8)
    return RowPlan(tuple(prompts), kind, np.full(n, float(temperature)), {})


@dataclass(frozen=True)
class StepBatch:
    """This process's rows of one step, as pieces of one prompt and one kind each.

    pieces: in row order (prompt by prompt: sampled, oracle, replayed rows).
    plan: the whole step's plan (all processes), for the record.
    timings: the step's rollout timings; None when no row was rolled out.
    """

    pieces: tuple[Trajectories, ...]
    plan: RowPlan
    timings: RolloutTimings | None

    @property
    def rows(self) -> int:
        return sum(len(piece.rows) for piece in self.pieces)


def collect_step(
    policy: HFPolicy,
    task: Task,
    plan: RowPlan,
    rows: range,
    *,
    generator: torch.Generator,
) -> StepBatch:
    """The plan's rows ``rows`` (this process's share): its sampled rows rolled out together in
    one call, its oracle and replayed rows from their stored items."""
    groups: list[tuple[str, int, list[int]]] = []
    for prompt in dict.fromkeys(plan.prompt[r] for r in rows):
        for which in (SAMPLED, ORACLE, REPLAYED):
            members = [r for r in rows if plan.prompt[r] == prompt and plan.kind[r] == which]
            if members:
                groups.append((prompt, which, members))
    sampled = [r for _, which, members in groups if which == SAMPLED for r in members]
    rollout = None
    if sampled or policy.step_together is not None:
        # a sharded model's forwards are collectives: a process without an on-policy row still
        # steps with the others, on one row it discards
        prompts = [plan.prompt[r] for r in sampled] or [plan.prompt[rows[0]]]
        temperature = torch.tensor([plan.temperature[r] for r in sampled] or [1.0])
        rollout = policy.sample(
            prompts,
            len(prompts),
            min_length=task.min_length,
            max_length=task.max_length,
            temperature=temperature,
            generator=generator,
            record=False,  # rescored by the loss: the rollout's own log-probabilities go unread
        )
    pieces = []
    start = 0
    for prompt, which, members in groups:
        if which == SAMPLED and rollout is not None:
            pick = slice(start, start + len(members))
            start += len(members)
            pieces.append(
                Trajectories(
                    prompt=prompt,
                    tokens=rollout.tokens[pick],
                    length=rollout.length[pick],
                    rows=tuple(rollout.rows[pick]),
                    texts=tuple(rollout.texts[pick]),
                    on_policy=tuple(range(len(members))),
                    stored_u=None,
                    temperature=float(np.mean(plan.temperature[members])),
                    timings=None,
                )
            )
        else:
            items = [plan.items[r] for r in members]
            pieces.append(stored_rows(policy, prompt, items, task.max_length, which == REPLAYED))
    timings = None if rollout is None or not sampled else rollout.timings
    return StepBatch(tuple(pieces), plan, timings)


def stored_rows(
    policy: HFPolicy, prompt: str, items: Sequence[ReplayItem], max_length: int, replayed: bool
) -> Trajectories:
    """Stored ``items`` of ``prompt`` as trajectories, padded once to [n, T]: replayed rows keep
    their stored task rewards u; oracle rows are scored like sampled ones, but are not on-policy
    (neither counted for Acc nor added to a buffer)."""
    stored_u = None
    if replayed:  # each row's u [tau + 1] in its row's first places, in one masked write
        stored_u = np.zeros((len(items), max_length + 1))
        places = np.fromiter((len(item.u) for item in items), np.int64, len(items))
        if items:
            filled = np.arange(max_length + 1) < places[:, None]
            stored_u[filled] = np.concatenate([item.u for item in items])
    device = policy.device
    rows = tuple(item.tokens for item in items)
    return Trajectories(
        prompt=prompt,
        tokens=pad_rows(rows, max_length, policy.pad_id).to(device),
        length=torch.tensor([len(r) for r in rows], dtype=torch.long, device=device),
        rows=rows,
        texts=tuple(item.text for item in items),
        on_policy=(),
        stored_u=stored_u,
        temperature=1.0,
        timings=None,
    )


Part = tuple[int, slice]
"""Rows ``slice`` of piece ``int``."""


def micro_batches(sizes: Sequence[int], size: int) -> list[list[Part]]:
    """Consecutive micro-batches of ``size`` rows (the last may be shorter) over pieces of
    ``sizes`` rows, each as the row slices of the pieces it spans."""
    bounds = np.cumsum([0, *sizes])
    out = []
    for lo in range(0, int(bounds[-1]), size):
        hi = min(lo + size, int(bounds[-1]))
        parts = []
        for i, (start, end) in enumerate(pairwise(bounds)):
            a, b = max(lo, int(start)), min(hi, int(end))
            if a < b:
                parts.append((i, slice(a - int(start), b - int(start))))
        out.append(parts)
    return out
