"""Replay over TRL generation batches: which rows a buffer replaces, and the batch after it does.

Each generation batch is a set of rows (prompt, completion). Before the loss, a fraction of the
rows whose prompt has stored items is replaced by items drawn from that prompt's store (raptb's
buffers, ``core.replay``, keep one store per prompt); the replaced rows train off-policy like
raptb's replayed micro-batches, their stored task rewards u reused. The generated rows that were
kept are added to the buffer afterwards, so a batch never replays its own rows.

A stored item holds the tau tokens before the stop. Spliced back in, it ends with an EOS token
unless it fills ``max_completion_length`` (its stop was forced there): either way its prefix
layout (``prefix_log_probs``) is the one it was stored with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from raptb.core.replay import ReplayBuffer, ReplayItem


@dataclass(frozen=True)
class ReplayDraw:
    """The rows of a batch to replace (``rows``) and the stored item each one gets."""

    rows: tuple[int, ...]
    items: tuple[ReplayItem, ...]


def draw_replay(
    buffer: ReplayBuffer, prompts: Sequence[str], fraction: float, rng: np.random.Generator
) -> ReplayDraw:
    """round(fraction * B) rows, drawn without replacement among the rows whose prompt has stored
    items (fewer when fewer have), each given an item of its prompt's store."""
    stored = set(buffer.prompts())
    candidates = [b for b, p in enumerate(prompts) if p in stored]
    n = min(round(fraction * len(prompts)), len(candidates))
    if n == 0:
        return ReplayDraw((), ())
    rows = tuple(sorted(int(b) for b in rng.choice(candidates, size=n, replace=False)))
    items = tuple(buffer.sample(1, rng, prompts[b])[0] for b in rows)
    return ReplayDraw(rows, items)


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


def stored_u(draw: ReplayDraw, u: np.ndarray) -> np.ndarray:
    """``u`` [B, C+1] with the drawn rows' task rewards replaced by their items' stored u."""
    out = u.copy()
    for b, item in zip(draw.rows, draw.items, strict=True):
        out[b] = 0.0
        out[b, : item.length + 1] = item.u
    return out
