"""What a rollout returns, and the arithmetic every decoding path shares.

``Rollout`` is the record of B sampled trajectories in the prefix layout of
``raptb.adapters.lm.rollout``; ``token_log_probs`` is the one float32 log-softmax gather that the
eager and static rollouts and teacher-forced rescoring all use, so they round the same way;
``row_temperatures`` checks and broadcasts the behaviour temperature of each row;
``concatenated`` joins the rollouts of lanes run side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RolloutTimings:
    """Wall-clock seconds of one rollout: model forwards, grammar masking and accepting, total."""

    model_s: float
    grammar_s: float
    total_s: float


@dataclass
class Rollout:
    """B sampled trajectories in the prefix layout (see ``raptb.adapters.lm.rollout``).

    tokens: LongTensor [B, T], generated ids, ``pad_id`` after the stop.
    length: LongTensor [B], tau (tokens before the stop).
    log_pf: float32 [B, T]; log_pterm: float32 [B, T+1] (untempered, unmasked, 0 after tau);
        both None where the rollout was asked not to record them (``record=False``).
    texts: the generated text of each row, stop excluded (the concatenated in-context token texts,
        i.e. exactly the text the grammar matched).
    rows: the host copy of each row's generated ids x_1..x_tau (the texts are built from it).
    """

    tokens: torch.Tensor
    length: torch.Tensor
    log_pf: torch.Tensor | None
    log_pterm: torch.Tensor | None
    texts: list[str]
    rows: list[tuple[int, ...]]
    timings: RolloutTimings


def token_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, stop_id: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 log-softmax of ``logits`` [..., V] / ``temperature`` at ``tokens`` [...] and at
    ``stop_id``.

    Gathers then subtracts the log-normaliser instead of materialising the full log-softmax, and is
    shared by rollout and rescoring so both round the same way. The GFlowNet objectives score the
    untempered softmax (temperature 1, no division); the RL baselines score their sampling
    temperature's, as TRL does (``app.training.rl.rl_step``).
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_norm
    return chosen, logits[..., stop_id] - log_norm


def softmax_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Float32 entropy -sum_v p_v log p_v [...] of the softmax of ``logits`` [..., V] /
    ``temperature`` over the whole vocabulary, as logsumexp(z) - sum_v p_v z_v."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def row_temperatures(temperature: float | torch.Tensor, n: int) -> torch.Tensor:
    """The behaviour temperature of each of ``n`` rows, float32 [n] on the CPU; a float is shared
    by every row. ValueError for a wrong shape or a value that is not finite and > 0."""
    temp = torch.as_tensor(temperature, dtype=torch.float32).cpu()
    if temp.ndim == 0:
        temp = temp.expand(n)
    if temp.shape != (n,):
        raise ValueError(f"temperature: expected a float or shape [{n}], got {tuple(temp.shape)}")
    if not bool(torch.all(torch.isfinite(temp) & (temp > 0))):
        raise ValueError("temperature: every value must be finite and > 0")
    return temp


def concatenated(parts: Sequence[Rollout], total_s: float, before_s: float = 0.0) -> Rollout:
    """The rows of ``parts`` (rollouts of the same T, run side by side in lanes) one after the
    other; their model and grammar seconds averaged (each lane's share of the wall time), the
    model's ``before_s`` before the lanes (their prompts' forward) added, the total ``total_s``."""
    timings = RolloutTimings(
        before_s + sum(part.timings.model_s for part in parts) / len(parts),
        sum(part.timings.grammar_s for part in parts) / len(parts),
        total_s,
    )
    recorded = all(part.log_pf is not None for part in parts)
    return Rollout(
        torch.cat([part.tokens for part in parts]),
        torch.cat([part.length for part in parts]),
        torch.cat([part.log_pf for part in parts]) if recorded else None,
        torch.cat([part.log_pterm for part in parts]) if recorded else None,
        [text for part in parts for text in part.texts],
        [row for part in parts for row in part.rows],
        timings,
    )


def side_by_side(
    columns: list[torch.Tensor],
    width: int,
    fill: float,
    dtype: torch.dtype,
    n: int,
    device: torch.device,
) -> torch.Tensor:
    """[n, width]: the rollout's per-column values side by side, ``fill`` in the columns after
    the last one computed (every row had stopped: the loop appends one column per step until
    then and none after, so a column's position is its step)."""
    if columns and len(columns) == width:
        return torch.stack(columns, dim=1)
    out = torch.full((n, width), fill, dtype=dtype, device=device)
    if columns:
        out[:, : len(columns)] = torch.stack(columns, dim=1)
    return out
