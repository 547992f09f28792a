"""Replay over TRL generation batches: which rows a buffer replaces, and the batch after it does.

Each generation batch is a set of rows (prompt, completion). Before the loss, a fraction of the
rows is replaced by stored items (raptb's buffers, ``core.replay``, keep one store per prompt);
the replaced rows train off-policy like raptb's replayed micro-batches, their stored task rewards
u reused. Which items a row may take is the replay scope:

    across_prompts  any row, once the buffer holds anything; its item comes from a stored prompt
                    drawn uniformly, then from that prompt's store by the buffer's own sampling
                    rule. The row takes the item's prompt too: it is trained (and its reference
                    term scored) as the item's own (prompt, completion). Replay then fires on a
                    dataset whose prompts are each seen once.
    per_prompt      only rows whose prompt has stored items, each given an item of that prompt;
                    replay fires only when a prompt comes back (several epochs, repeated prompts).

The generated rows that were kept are added to the buffer afterwards, so a batch never replays
its own rows.

A stored item holds the tau tokens before the stop. Spliced back in, it ends with an EOS token
unless it fills ``max_completion_length`` (its stop was forced there): either way its prefix
layout (``prefix_log_probs``) is the one it was stored with. Its prompt is spliced back in from
the token ids it was generated with, left-padded as TRL pads prompts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raptb.core.replay import ReplayBuffer, ReplayItem

REPLAY_SCOPES = ("across_prompts", "per_prompt")
"""Where a replaced row's item may come from (module docstring)."""


SimilarityFunc = Callable[[Sequence[str], Sequence[str]], Any]
"""``f(texts_a, texts_b) -> [len(a), len(b)]`` similarities in [0, 1], symmetric."""


class CallableSimilarity:
    """``Similarity`` port (``core.ports``) over completion texts, from a plain callable."""

    def __init__(self, func: SimilarityFunc) -> None:
        self.func = func

    def pairwise(self, a: Sequence[object], b: Sequence[object]) -> np.ndarray:
        return np.asarray(self.func(list(a), list(b)), dtype=np.float64).reshape(len(a), len(b))


@dataclass(frozen=True)
class ReplayDraw:
    """The rows of a batch to replace (``rows``) and the stored item each one gets."""

    rows: tuple[int, ...]
    items: tuple[ReplayItem, ...]


def draw_replay(
    buffer: ReplayBuffer,
    prompts: Sequence[str],
    fraction: float,
    rng: np.random.Generator,
    scope: str = "across_prompts",
) -> ReplayDraw:
    """round(fraction * B) rows drawn without replacement, each given a stored item: with
    ``scope="across_prompts"`` any row, its item from a stored prompt drawn uniformly; with
    ``"per_prompt"`` only rows whose prompt has stored items (fewer when fewer have), each
    given an item of its own prompt's store."""
    if scope not in REPLAY_SCOPES:
        raise ValueError(f"replay scope: must be one of {REPLAY_SCOPES}, got {scope!r}")
    stored = buffer.prompts()
    if scope == "across_prompts":
        candidates = list(range(len(prompts))) if stored else []
    else:
        kept = set(stored)
        candidates = [b for b, p in enumerate(prompts) if p in kept]
    n = min(round(fraction * len(prompts)), len(candidates))
    if n == 0:
        return ReplayDraw((), ())
    rows = tuple(sorted(int(b) for b in rng.choice(candidates, size=n, replace=False)))
    if scope == "across_prompts":
        sources = [stored[int(i)] for i in rng.integers(0, len(stored), size=n)]
    else:
        sources = [prompts[b] for b in rows]
    items = tuple(buffer.sample(1, rng, source)[0] for source in sources)
    return ReplayDraw(rows, items)


def splice_prompts(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    draw: ReplayDraw,
    item_prompt_ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt_ids, prompt_mask)`` with the drawn rows' prompts replaced by
    ``item_prompt_ids`` (one token list per drawn row), left-padded with ``pad_id`` to the widest
    row."""
    if not draw.rows:
        return prompt_ids, prompt_mask
    width = max(prompt_ids.shape[1], *(len(p) for p in item_prompt_ids))
    ids = torch.full(
        (prompt_ids.shape[0], width), pad_id, dtype=prompt_ids.dtype, device=prompt_ids.device
    )
    mask = torch.zeros_like(ids, dtype=prompt_mask.dtype)
    ids[:, width - prompt_ids.shape[1] :] = prompt_ids
    mask[:, width - prompt_mask.shape[1] :] = prompt_mask
    for b, row in zip(draw.rows, item_prompt_ids, strict=True):
        ids[b] = pad_id
        mask[b] = 0
        if row:
            ids[b, width - len(row) :] = torch.tensor(list(row), dtype=ids.dtype, device=ids.device)
            mask[b, width - len(row) :] = 1
    return ids, mask


def splice_completions(
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    draw: ReplayDraw,
    *,
    stop_id: int,
    pad_id: int,
    max_completion_length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(completion_ids, completion_mask)`` with the drawn rows replaced by their items' tokens
    (plus ``stop_id`` when shorter than ``max_completion_length``), padded with ``pad_id`` to the
    widest row."""
    if not draw.rows:
        return completion_ids, completion_mask
    rows = [
        list(item.tokens) + ([stop_id] if item.length < max_completion_length else [])
        for item in draw.items
    ]
    width = max(completion_ids.shape[1], *(len(r) for r in rows))
    ids = torch.full(
        (completion_ids.shape[0], width),
        pad_id,
        dtype=completion_ids.dtype,
        device=completion_ids.device,
    )
    mask = torch.zeros_like(ids, dtype=completion_mask.dtype)
    ids[:, : completion_ids.shape[1]] = completion_ids
    mask[:, : completion_mask.shape[1]] = completion_mask
    for b, row in zip(draw.rows, rows, strict=True):
        ids[b] = pad_id
        mask[b] = 0
        ids[b, : len(row)] = torch.tensor(row, dtype=ids.dtype, device=ids.device)
        mask[b, : len(row)] = 1
    return ids, mask


def replay_items(
    kept: Sequence[int],
    generated: tuple[Sequence[str], Sequence[tuple[int, ...]], Sequence[str], np.ndarray],
    u: np.ndarray,
    log_r: torch.Tensor,
    valid_min_reward: float | None,
) -> list[ReplayItem]:
    """The buffer items of the ``kept`` rows of a batch: ``generated`` holds each row's prompt
    key, completion tokens (before the stop), text and summed reward S; ``u`` [B, C+1] and
    ``log_r`` [B, C+1] its task rewards and log-rewards. An item is valid when S >=
    ``valid_min_reward`` (every item when None)."""
    keys, rows, texts, rewards = generated
    log_r_host = log_r.double().cpu().numpy()
    return [
        ReplayItem(
            prompt=keys[b],
            tokens=rows[b],
            text=texts[b],
            log_r=log_r_host[b, : len(rows[b]) + 1],
            u=u[b, : len(rows[b]) + 1],
            valid=valid_min_reward is None or bool(rewards[b] >= valid_min_reward),
            score=float(rewards[b]),
        )
        for b in kept
    ]


def stored_u(draw: ReplayDraw, u: np.ndarray) -> np.ndarray:
    """``u`` [B, C+1] with the drawn rows' task rewards replaced by their items' stored u."""
    out = u.copy()
    for b, item in zip(draw.rows, draw.items, strict=True):
        out[b] = 0.0
        out[b, : item.length + 1] = item.u
    return out


def replay_never_fires(
    args: Any, dataset: object, num_generations: int, num_iterations: int
) -> str | None:
    """Why the replay ``args`` (a ``GFlowNetConfig``) configure can never replace a row in this
    run over ``dataset``, or None when it can (or the dataset cannot be read ahead)."""
    end = args.replay_fraction if args.replay_fraction_end is None else args.replay_fraction_end
    if args.replay_fraction == 0 and end == 0:
        return "never replays: replay_fraction is 0 throughout (the buffer is filled, never drawn)"
    columns = getattr(dataset, "column_names", None) or ()
    if (
        args.replay_scope != "per_prompt"
        or not isinstance(dataset, Sized)
        or "prompt" not in columns
    ):
        return None
    prompts = dataset["prompt"]  # type: ignore[index]
    distinct = len({repr(p) for p in prompts})
    if args.max_steps > 0:  # one generation batch per steps_per_generation x num_iterations steps
        generations = math.ceil(
            args.max_steps
            * args.gradient_accumulation_steps
            / (args.steps_per_generation * num_iterations)
        )
        drawn = generations * args.generation_batch_size // num_generations
    else:
        drawn = math.ceil(args.num_train_epochs * len(prompts))
    if distinct == len(prompts) and drawn <= distinct:
        return (
            f"never replays: replay_scope='per_prompt' replays a prompt's items only when the "
            f"prompt comes back, and this run draws {drawn} of the dataset's {distinct} distinct "
            f"prompts, each once (set replay_scope='across_prompts')"
        )
    return None
