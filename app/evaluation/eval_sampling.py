"""Drawing the evaluation's samples: chunks of prompts, the lock-step rollout of each chunk on
this rank, every sample scored into one JSON-ready row, the rows gathered from all ranks in chunk
order, and the reference model's log p_term at each row's stop (app.evaluation.evaluate states the
protocol and the row's fields)."""

from __future__ import annotations

from typing import Any

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.tasks.registry import TaskSpec
from raptb.app.distribution.distributed import DistContext, sampling_seed
from raptb.app.reward.prefix import PrefixScorer
from raptb.app.task_and_policy import pad_rows
from raptb.core.ports import Task


def _progress(enabled: bool) -> Progress:
    # stderr, so that ``--json`` keeps stdout for the metrics alone
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def sample_rows(
    policy: HFPolicy,
    task: Task,
    spec: TaskSpec,
    scorer: PrefixScorer,
    *,
    samples: int,
    seed: int,
    batch_size: int,
    temperature: float,
    progress: bool,
    dist: DistContext,
) -> list[dict[str, Any]]:
    """Draw and score ``samples`` trajectories at ``temperature`` (this rank's chunks, then
    gathered from all ranks in chunk order); one JSON-ready dict per sample."""
    generator = torch.Generator(device=policy.device).manual_seed(sampling_seed(seed, dist.rank))
    chunks = _chunks(task.prompts(), samples, batch_size, per_prompt=spec.eval_per_prompt)
    mine = [chunk for chunk in range(len(chunks)) if chunk % dist.world_size == dist.rank]
    by_chunk: list[tuple[int, list[dict[str, Any]]]] = []
    rows: list[dict[str, Any]] = []
    hits = 0
    share = sum(chunks[chunk][1] for chunk in mine)
    with _progress(progress and dist.is_main) as bar:
        job = bar.add_task("sampling", total=share)
        for chunk in mine:
            prompt, n = chunks[chunk]
            by_chunk.append((chunk, []))
            rollout = policy.sample(
                prompt,
                n,
                min_length=task.min_length,
                max_length=task.max_length,
                temperature=temperature,
                generator=generator,
            )
            # every prefix of the chunk scored at once (batched rewards, one cache pass)
            scored = scorer.score_rows(prompt, rollout.rows, task.max_length, rollout.texts)
            columns = zip(
                scored.scores,
                scored.u.tolist(),
                rollout.tokens.tolist(),
                rollout.length.tolist(),
                rollout.log_pf.tolist(),
                rollout.log_pterm.tolist(),
                rollout.texts,
                strict=True,
            )
            for score, u, tokens, tau, log_pf, log_pterm, text in columns:
                correct = spec.is_correct(score)
                hits += correct
                row = {
                    "prompt": prompt,
                    "text": text,
                    "tokens": tokens[:tau],
                    "length": tau,
                    "valid": score.valid,
                    "correct": correct,
                    "score": score.value,
                    "log_pterm_stop": log_pterm[tau],
                    "log_pf": log_pf[:tau],
                    "log_pterm": log_pterm[: tau + 1],
                    "u": u[: tau + 1],
                }
                if dist.world_size > 1:
                    row["rank"] = dist.rank
                rows.append(row)
                by_chunk[-1][1].append(row)
            bar.update(
                job, completed=len(rows), description=f"sampling (acc {hits / len(rows):.3f})"
            )
    if dist.world_size == 1:
        return rows
    gathered = sorted(pair for rank in dist.all_gather_object(by_chunk) for pair in rank)
    return [row for _, chunk_rows in gathered for row in chunk_rows]


def _chunks(
    prompts: list[str], samples: int, batch_size: int, *, per_prompt: bool
) -> list[tuple[str, int]]:
    """(prompt, rows) of each sampling chunk: ``samples`` in all, chunks cycling through the
    prompts; with ``per_prompt``, ``samples`` for every prompt, prompt after prompt."""
    if per_prompt:
        return [
            (prompt, min(batch_size, samples - start))
            for prompt in prompts
            for start in range(0, samples, batch_size)
        ]
    return [
        (prompts[chunk % len(prompts)], min(batch_size, samples - start))
        for chunk, start in enumerate(range(0, samples, batch_size))
    ]


@torch.no_grad()
def add_reference_pterm(
    rows: list[dict[str, Any]], reference: HFPolicy, *, adapter: bool, batch_size: int
) -> None:
    """Add ``ref_log_pterm_stop`` to each row: the reference model's log p_term at its stop.

    adapter: ``reference`` is the trained LoRA policy, scored with its adapter disabled;
    otherwise it is a policy on the run's initial weights, scored as it is.
    """
    score = reference.reference_score if adapter else reference.score
    reference.model.eval()
    by_prompt: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_prompt.setdefault(row["prompt"], []).append(row)
    for prompt, group in by_prompt.items():
        for start in range(0, len(group), batch_size):
            chunk = group[start : start + batch_size]
            width = max(1, max(r["length"] for r in chunk))
            tokens = pad_rows([r["tokens"] for r in chunk], width, reference.pad_id)
            length = torch.tensor([r["length"] for r in chunk], dtype=torch.long)
            _, log_pterm = score(prompt, tokens, length)
            stop = log_pterm.gather(1, length.to(log_pterm.device)[:, None])[:, 0]
            for row, value in zip(chunk, stop.float().cpu().tolist(), strict=True):
                row["ref_log_pterm_stop"] = value
