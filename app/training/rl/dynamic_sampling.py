"""DAPO's dynamic sampling for GRPO's algorithm (Yu et al. 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale", https://arxiv.org/abs/2503.14476, section 3.2), the
option ``rl.filter_groups`` (the authors' ``algorithm.filter_groups.enable``).

A group whose num_generations rewards are all equal (all correct or all wrong under a 0/1 reward)
has zero advantages and gives no gradient. DAPO over-samples and keeps only groups with a non-zero
reward std, generating more batches until the step is full, at most ``max_num_gen_batches``
generation batches (the first included). Here each such group is refilled in place by a fresh
group of the same prompt, rolled out on-policy at ``rl.temperature``, round after round, until
no group of this process's rows has zero variance or the step has taken ``max_num_gen_batches``
generation rounds; the groups still without variance then stay (zero advantages, as plain GRPO),
where DAPO's trainer stops with an error. The rows left out are counted for Acc and their
successful texts as seen (they were sampled); the step logs the rounds taken
(``num_gen_batches``), the extra rows rolled out and the zero-variance groups before and after.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raptb.app.training.algorithm import Loop
from raptb.app.training.rl.rollout import OnPolicyRows, scored_rows
from raptb.app.training.step import Trajectories
from raptb.app.training.step_batch import SAMPLED, RowPlan, collect_step


@dataclass(frozen=True)
class Refill:
    """What a step's dynamic sampling did: ``rounds`` generation rounds (the first included),
    ``extra_rows`` rows rolled out after the first, and the zero-variance groups of the step's
    rows before and after (this process's)."""

    rounds: int
    extra_rows: int
    zero_std_before: int
    zero_std_after: int

    def record(self, groups: int) -> dict[str, float]:
        """The metrics it adds to a step's record, out of this process's ``groups`` groups."""
        return {
            "num_gen_batches": self.rounds,
            "dynamic_sampling_extra_rows": self.extra_rows,
            "frac_groups_zero_std_sampled": self.zero_std_before / groups,
            "frac_groups_zero_std_kept": self.zero_std_after / groups,
        }


def zero_variance_groups(terminal: torch.Tensor, group: int) -> list[int]:
    """Indices of the groups of ``group`` consecutive rows of ``terminal`` [B] whose rewards are
    all equal."""
    grouped = terminal.view(-1, group)
    return [g for g, row in enumerate(grouped) if bool(torch.all(row == row[0]))]


def _replace_group(piece: Trajectories, g: int, group: int, fresh: Trajectories) -> Trajectories:
    """``piece`` with its rows of group ``g`` replaced by the ``group`` rows of ``fresh``."""
    keep_before, keep_after = slice(0, g * group), slice((g + 1) * group, len(piece.rows))
    parts = (piece.take(keep_before), fresh, piece.take(keep_after))
    rows = sum((p.rows for p in parts), ())
    return Trajectories(
        prompt=piece.prompt,
        tokens=torch.cat([p.tokens for p in parts]),
        length=torch.cat([p.length for p in parts]),
        rows=rows,
        texts=sum((p.texts for p in parts), ()),
        on_policy=tuple(range(len(rows))),
        stored_u=None,
        temperature=piece.temperature,
        timings=piece.timings,
    )


def refill_zero_variance_groups(
    loop: Loop, rollout: OnPolicyRows, group: int, max_num_gen_batches: int
) -> tuple[OnPolicyRows, Refill]:
    """``rollout`` with its zero-variance groups refilled (see the module docstring)."""
    pieces, terminal = list(rollout.pieces), list(rollout.terminal)
    correct, discarded, extra = list(rollout.correct), 0, 0
    todo = [(i, g) for i, t in enumerate(terminal) for g in zero_variance_groups(t, group)]
    before, rounds = len(todo), 1
    temperature = loop.cfg.rl.temperature
    while todo and rounds < max_num_gen_batches:
        rounds += 1
        prompts = [pieces[i].prompt for i, _ in todo for _ in range(group)]
        plan = RowPlan(
            tuple(prompts),
            np.full(len(prompts), SAMPLED, dtype=np.int8),
            np.full(len(prompts), float(temperature)),
            {},
        )
        fresh = collect_step(
            loop.policy, loop.task, plan, range(len(prompts)), generator=loop.generator
        )
        scored = scored_rows(loop, fresh.pieces)
        # collect_step lays the rows out prompt by prompt: take each prompt's groups in turn
        by_prompt: dict[str, list[tuple[Trajectories, torch.Tensor]]] = {}
        for piece, rewards in zip(scored.pieces, scored.terminal, strict=True):
            for start in range(0, len(piece.rows), group):
                rows = slice(start, start + group)
                by_prompt.setdefault(piece.prompt, []).append((piece.take(rows), rewards[rows]))
        correct += scored.correct
        extra += len(prompts)
        still = []
        for i, g in todo:
            new_rows, new_rewards = by_prompt[pieces[i].prompt].pop(0)
            discarded += group
            pieces[i] = _replace_group(pieces[i], g, group, new_rows)
            terminal[i] = terminal[i].clone()
            terminal[i][g * group : (g + 1) * group] = new_rewards.to(terminal[i].dtype)
            if bool(torch.all(new_rewards == new_rewards[0])):
                still.append((i, g))
        todo = still
    # every sampled row counts once for Acc: the kept ones by their pieces, the others here
    refilled = OnPolicyRows(tuple(pieces), tuple(terminal), correct, rollout.discarded + discarded)
    return refilled, Refill(rounds, extra, before, len(todo))
