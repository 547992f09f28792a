"""Replay items from scored rows: what a step adds to the buffer (the on-policy rows, with
their log-rewards) and what seeds it (app.training.gflownet.replay_setup: Oracle's enumerated
solutions), each with the task's replay validity, static score and item features."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from raptb.adapters.tasks.registry import TaskSpec, task_spec
from raptb.app.reward.prefix import ScoredRows
from raptb.app.training.step import Rewards, Trajectories
from raptb.core.ports import Task, TaskCapabilities
from raptb.core.replay import ReplayItem


def new_items(
    task: Task, batch: Trajectories, rewards: Rewards, spec: TaskSpec | None = None
) -> list[ReplayItem]:
    """The on-policy rows of a sampled batch as replay items; their log-rewards include the
    reference prior when kappa > 0 (``spec``: as :func:`replay_items`)."""
    if rewards.scores is None or rewards.s_host is None or not batch.on_policy:
        return []
    log_r = rewards.u_host if rewards.prior is None else rewards.log_r.double().cpu().numpy()
    scored = ScoredRows(u=rewards.u_host, scores=rewards.scores, s=rewards.s_host)
    indices = batch.on_policy
    return replay_items(task, batch.prompt, batch.rows, batch.texts, scored, indices, log_r, spec)


def replay_items(
    task: Task,
    prompt: str,
    rows: Sequence[tuple[int, ...]],
    texts: Sequence[str],
    scored: ScoredRows,
    indices: Iterable[int],
    log_r: np.ndarray,
    spec: TaskSpec | None = None,
) -> list[ReplayItem]:
    """Replay items of rows b in ``indices``: tokens, text, task rewards u and log-rewards
    ``log_r`` (float64 [B, T+1]) cut at tau, the task's replay validity and static score (its
    spec's ``replay_valid`` and ``replay_score``: Expr24 marks correct rows valid, SMILES scores
    a row by its best prefix), and the task's item features. ``spec``: the task's (a trainer
    passes the one it holds), else looked up by the task's name."""
    spec = spec or task_spec(task.name)
    describe = TaskCapabilities.of(task).item_features
    items = []
    for b in indices:
        end = len(rows[b]) + 1
        prefix_scores = scored.s[b, :end]
        best = spec.replay_score == "best_prefix"
        items.append(
            ReplayItem(
                prompt=prompt,
                tokens=rows[b],
                text=texts[b],
                log_r=log_r[b, :end],
                u=scored.u[b, :end],
                valid=spec.replay_valid(scored.scores[b]),
                score=float(prefix_scores.max() if best else prefix_scores[-1]),
                **_item_extras(describe, prompt, texts[b]),
            )
        )
    return items


def _item_extras(
    describe: Callable[[str, str], Any] | None, prompt: str, text: str
) -> dict[str, Any]:
    """Replay-item ``features`` and ``canonical`` from the task's ``item_features`` (SMILES: the
    merged molecule's fingerprint and canonical SMILES); none for a task without it."""
    if describe is None:
        return {}
    extras = describe(prompt, text)
    return {"features": extras.features, "canonical": extras.canonical}
