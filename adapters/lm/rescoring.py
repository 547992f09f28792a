"""The teacher-forced rescoring: log P_F of given rows' tokens and of the stop, by one forward.

For B rows (prompt ids each, tokens ``body`` [B, T], the stop id after each row's ``length``):

    log_pf[b, t]    = log softmax(logits / temperature)[b, t, body[b, t]]    t < length[b], else 0
    log_pterm[b, t] = log softmax(logits / temperature)[b, t, stop]          t <= length[b], else 0

with logits [B, T + 1, V] the model's after each row's prompt and its first t tokens. The forward
that computes them is ``adapters.lm.paths.rescoring_path``'s (one per model and device; the
reference is transformers' own forward over ``cat(prompt, body)``, ``model_logits``, which every
other is held to in tests/adapters/test_one_path.py). Each distinct row is forwarded once, its
copies given its values (``adapters.lm.distinct_rows``), unless the forward is random (dropout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

import torch
from transformers import PreTrainedModel

from raptb.adapters.lm import shared_prompts
from raptb.adapters.lm.distinct_rows import distinct_rows, stochastic_forward
from raptb.adapters.lm.embedded import compiled_rescoring, lean_gpt2
from raptb.adapters.lm.lanes import Lanes, split
from raptb.adapters.lm.paths import rescoring_path
from raptb.adapters.lm.rollout import token_log_probs
from raptb.adapters.lm.row_prompts import left_padded, row_prompt_ids

PerState = Callable[[torch.Tensor], torch.Tensor]
"""A value (or a vector) per state from the untempered logits [B, T + 1, V]."""


class ScoringPolicy(Protocol):
    """What the rescoring reads of ``raptb.adapters.lm.policy.HFPolicy`` (which calls this module,
    so it is named by its shape rather than imported)."""

    stop_id: int
    pad_id: int
    step_together: Callable[[bool], bool] | None
    checkpointed: bool

    @property
    def device(self) -> torch.device: ...

    def prompt_ids(self, prompt: str) -> list[int]: ...

    def check_positions(self, prompt_len: int, max_length: int) -> None: ...

    def uses_lean_gpt2(self, model: torch.nn.Module) -> bool: ...


def forward_log_probs(
    policy: ScoringPolicy,
    model: PreTrainedModel,
    prompt: str | Sequence[str],
    tokens: torch.Tensor,
    length: torch.Tensor,
    hidden: bool = False,
    temperature: float = 1.0,
    per_state: PerState | None = None,
    lanes: Lanes | None = None,
) -> tuple[torch.Tensor, ...]:
    """``(log_pf [B, T], log_pterm [B, T + 1])`` (module docstring) of rows ``tokens`` [B, T] of
    ``length`` [B] after ``prompt`` (every row's, or B prompts) under ``model``; plus the last
    layer's hidden states [B, P + T, H] with ``hidden``, or ``per_state`` of the logits [B, T + 1,
    ...] (0 after each row's stop). ValueError for shapes or lengths that do not fit.

    lanes: a forward without gradients (the reference pass) cut by rows into ``lanes`` side by
    side (``lanes_log_probs``); not with ``hidden`` or ``per_state``, nor for a random forward."""
    if tokens.ndim != 2:
        raise ValueError(f"tokens: expected shape [B, T], got {tuple(tokens.shape)}")
    b, big_t = tokens.shape
    if tuple(length.shape) != (b,):
        raise ValueError(f"length: expected shape [{b}], got {tuple(length.shape)}")
    device = policy.device
    tokens, length = tokens.to(device), length.to(device)
    if b and (int(length.min()) < 0 or int(length.max()) > big_t):
        raise ValueError(f"length: values must lie in [0, T={big_t}]")
    rows = row_prompt_ids(policy.prompt_ids, prompt, b) if b else []
    # positions after the stop hold arbitrary ids; causal attention keeps them out of every
    # earlier prefix, so any valid id will do
    body = torch.where(torch.arange(big_t, device=device) < length[:, None], tokens, policy.stop_id)
    stochastic = stochastic_forward(model)
    copies = None if stochastic else distinct_rows(rows, body, length)
    if copies is not None:  # each distinct row once
        first = copies.first.tolist()
        if not isinstance(prompt, str):
            prompt = [prompt[i] for i in first]
        rows, body, length = [rows[i] for i in first], body[copies.first], length[copies.first]
    if lanes is not None and lanes.count > 1 and not (stochastic or hidden or per_state):

        def part(cut: slice) -> tuple[torch.Tensor, ...]:  # each part's prompts forwarded by it
            prompts = prompt if isinstance(prompt, str) else prompt[cut]
            return rows_log_probs(
                policy, model, prompts, rows[cut], body[cut], length[cut], False, temperature, None
            )

        outputs = lanes_log_probs(lanes, part, len(rows))
    else:
        outputs = rows_log_probs(
            policy, model, prompt, rows, body, length, hidden, temperature, per_state
        )
    return outputs if copies is None else tuple(copies.gather(out) for out in outputs)


def lanes_log_probs(
    lanes: Lanes, part: Callable[[slice], tuple[torch.Tensor, ...]], count: int
) -> tuple[torch.Tensor, ...]:
    """``part(rows)`` of contiguous parts of ``count`` rows, one a lane, side by side (a
    deterministic forward: ``Lanes.run`` draws no dropout seed), joined in row order. Model-wide
    state (its mode, peft's adapter switched off) is the caller's, set around this call."""
    cuts = [slice(r.start, r.stop) for r in split(count, lanes.count)]
    parts = lanes.run([partial(part, cut) for cut in cuts], dropout=False)
    return tuple(torch.cat(outputs) for outputs in zip(*parts, strict=True))


def path_of(
    policy: ScoringPolicy,
    model: PreTrainedModel,
    rows: list[list[int]],
    body: torch.Tensor,
    hidden: bool = False,
    per_state: bool = False,
) -> str:
    """``paths.rescoring_path`` of these rows under ``model`` (its facts read here)."""
    lean = bool(rows) and policy.uses_lean_gpt2(model)
    return rescoring_path(
        rows=bool(rows),
        lean=lean,
        compiled=lean and compiled_rescoring.computes(model),
        one_prompt=bool(rows)
        and bool(rows[0])
        and body.shape[1] > 0
        and all(row == rows[0] for row in rows),
        plain=policy.step_together is None and not (policy.checkpointed and model.training),
        hidden=hidden,
        per_state=per_state,
    )


def rows_log_probs(
    policy: ScoringPolicy,
    model: PreTrainedModel,
    prompt: str | Sequence[str],
    rows: list[list[int]],
    body: torch.Tensor,
    length: torch.Tensor,
    hidden: bool,
    temperature: float,
    per_state: PerState | None,
) -> tuple[torch.Tensor, ...]:
    """``forward_log_probs`` of checked rows: prompt ids ``rows``, tokens ``body`` [B, T] (the
    stop id after each row's ``length``), by ``path_of``'s forward."""
    big_t = body.shape[1]
    device = body.device
    # left-padded to the longest prompt (mask 0 on pads, each row's own positions), so every
    # row's first generated token sits in the same column
    cols = torch.arange(big_t, device=device)
    token_mask = cols[None, :] < length[:, None]
    prefix_mask = torch.arange(big_t + 1, device=device)[None, :] <= length[:, None]
    hidden_states = None
    next_tokens = torch.cat([body, torch.full_like(body[:, :1], policy.stop_id)], dim=1)
    path = path_of(policy, model, rows, body, hidden, per_state is not None)
    if path != "model":
        policy.check_positions(max(len(row) for row in rows), big_t)
    if path in ("compiled_rescoring", "shared_prompts"):
        token_lp, stop_lp = (
            compiled_rescoring.log_probs(
                model, rows[0], body, next_tokens, policy.stop_id, temperature
            )
            if path == "compiled_rescoring"
            else shared_prompts.read_log_probs(
                model, rows, body, length, policy.pad_id, policy.stop_id, temperature
            )
        )
        log_pf = torch.where(token_mask, token_lp[:, :big_t], 0.0)
        return log_pf, torch.where(prefix_mask, stop_lp, 0.0)
    if path == "lean_gpt2":
        logits = lean_logits(policy, model, rows, body)
    else:
        logits, hidden_states = model_logits(policy, model, prompt, rows, body, hidden)
    token_lp, stop_lp = token_log_probs(logits, next_tokens, policy.stop_id, temperature)
    log_pf = torch.where(token_mask, token_lp[:, :big_t], 0.0)
    log_pterm = torch.where(prefix_mask, stop_lp, 0.0)
    if per_state is not None:
        values = per_state(logits)  # [B, T + 1, ...]: a value (or a vector) per state
        mask = prefix_mask.reshape(*prefix_mask.shape, *([1] * (values.ndim - 2)))
        return log_pf, log_pterm, torch.where(mask, values, 0.0)
    return (log_pf, log_pterm, hidden_states) if hidden else (log_pf, log_pterm)


def lean_logits(
    policy: ScoringPolicy, model: PreTrainedModel, rows: list[list[int]], body: torch.Tensor
) -> torch.Tensor:
    """Logits [B, T+1, V] after each row's prompt and its tokens ``body`` [B, T], by
    ``lean_gpt2`` (a prompt shared by every row computed once, in the rows' own pass)."""
    if body.shape[1] and all(row == rows[0] for row in rows):
        return lean_gpt2.shared_prompt_logits(model, rows[0], body)
    first, past, following, key_mask = lean_gpt2.prompt_logits_and_past(
        model, rows, policy.pad_id, policy.device
    )
    big_t = body.shape[1]
    positions = following + torch.arange(big_t, device=body.device)[None, :]
    if key_mask is not None:
        key_mask = torch.cat([key_mask, key_mask.new_ones(body.shape)], dim=1)
    logits, _ = lean_gpt2.forward(model, body, positions, past, key_mask)
    return torch.cat([first[:, None, :], logits], dim=1)


def model_logits(
    policy: ScoringPolicy,
    model: PreTrainedModel,
    prompt: str | Sequence[str],
    rows: list[list[int]],
    body: torch.Tensor,
    hidden: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits [B, T+1, V] after each row's prompt and its tokens ``body`` [B, T] (and the last
    layer's hidden states [B, P + T, H] when ``hidden``), by the model's own forward (the
    reference)."""
    b, big_t = body.shape
    device = body.device
    ids, prompt_mask, positions = left_padded(
        rows or [policy.prompt_ids(prompt if isinstance(prompt, str) else "")],
        policy.pad_id,
        device,
    )
    ids, prompt_mask, positions = ids[:b], prompt_mask[:b], positions[:b]
    width = ids.shape[1]
    policy.check_positions(int(positions[:, -1].max()) + 1 if b else width, big_t)
    after = positions[:, -1:] + 1 + torch.arange(big_t, device=device)[None, :]
    out = model(
        input_ids=torch.cat([ids, body], dim=1),
        attention_mask=torch.cat([prompt_mask, torch.ones_like(body)], dim=1),
        position_ids=torch.cat([positions, after], dim=1),
        use_cache=False,
        output_hidden_states=hidden,
    )
    return out.logits[:, width - 1 :, :], out.hidden_states[-1] if hidden else None
