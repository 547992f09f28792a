"""Constrained rollout of an ``HFPolicy``: B rows in lock step, one token per step, KV cache reused.

The behaviour distribution at prefix k of an unfinished row is the softmax of
``logits_k / temperature`` restricted to

    (legal tokens ∩ grammar-allowed tokens)  ∪  {stop if k >= min_length and the grammar accepts
                                                  the text as complete}

with stop the only action at k = max_length (and, as a fallback, wherever nothing else is
allowed). The recorded values are the untempered, unmasked log P_F of the chosen token and of stop
at every visited prefix (objectives.md): ``log_pf`` [B, T] (column t < tau: the (t+1)-th token,
0 after), ``log_pterm`` [B, T+1] (column k <= tau, 0 after), with T = max_length and tau = length.
A training step rescores its rows and reads none of them (``record=False``: both None); the eager
rollout through a model's own decoder then computes the logits of the behaviour's columns only
(``decoders.ModelDecoder``'s ``columns``), where the record needs the whole vocabulary's.

Rows may have different prompts (one rollout for a whole optimizer step): prompts are left-padded
to the longest, with the attention mask 0 on the pads and explicit position ids (each row's own
positions, 0 at its first prompt token), so a row's tokens and log-probs are those of rolling it
out alone, up to float rounding.

The forwards go through ``raptb.adapters.lm.embedded.lean_gpt2`` where it supports the model (the
embedded GPT-2: a shared prompt computed once, a few operations per block), else through the model's
own forward and transformers' cache; both give the same logits to float rounding. On the latter,
with ``policy.lanes`` of more than one, the rows are split into lanes side by side, each rolled out
from a seed of its own (``adapters.lm.lanes``), their prompts forwarded once for all lanes.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Protocol

import torch

from raptb.adapters.lm import shared_prompts
from raptb.adapters.lm.cpu_dropout import SEED_HIGH
from raptb.adapters.lm.decoders import Decoder, LeanDecoder, ModelDecoder
from raptb.adapters.lm.embedded import lean_gpt2
from raptb.adapters.lm.embedded.compiled_rollout import compiled_rollout
from raptb.adapters.lm.gpu.static_decode import DecodingPolicy, static_rollout
from raptb.adapters.lm.grammar import unpack_bitmask
from raptb.adapters.lm.lane_process import ENDED, LaneEnded, LaneProcess
from raptb.adapters.lm.lanes import Lanes, lane_threads, split
from raptb.adapters.lm.rollout_record import (
    Rollout,
    RolloutTimings,
    concatenated,
    row_temperatures,
    side_by_side,
    token_log_probs,
)
from raptb.adapters.lm.row_prompts import check_rollout_shape, row_prompt_ids
from raptb.adapters.lm.vllm_rollout import vllm_rollout


class RolloutPolicy(DecodingPolicy, Protocol):
    """What the rollout needs of ``raptb.adapters.lm.policy.HFPolicy`` (which calls this module, so
    it is named by its shape rather than imported): the static path's needs, the resolved decoding
    path and the lock-step hook of a sharded model (None otherwise)."""

    step_together: Callable[[bool], bool] | None
    lanes: Lanes

    @property
    def decode_path(self) -> str: ...

    def uses_lean_gpt2(self, model: torch.nn.Module) -> bool: ...


@torch.no_grad()
def sample_rollout(
    policy: RolloutPolicy,
    prompt: str | Sequence[str],
    n: int,
    *,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor = 1.0,
    generator: torch.Generator | None = None,
    record: bool = True,
) -> Rollout:
    """Draw ``n`` constrained trajectories of ``policy`` (the module docstring states the mask).

    prompt: every row's prompt, or each row's (a sequence of n prompts, left-padded together).
    temperature: every row's behaviour temperature, or each row's (float [n]).
    record: whether the rollout records ``log_pf`` and ``log_pterm``; without (both None), the
        eager path through a model's own decoder computes its legal tokens' and stop's logits
        only (the module docstring). The same rows, up to the rounding of a narrower product.

    The policy's ``decode_path`` "static" hands the rollout to ``static_rollout`` (same
    rollouts, static shapes, CUDA graphs on a GPU), "compiled" to ``compiled_rollout`` (the same
    rollouts up to float rounding, compiled by Numba), "vllm" to ``vllm_rollout``
    (the rows drawn by a vLLM engine, the record vLLM's raw log-probabilities)."""
    path = policy.decode_path
    arguments = (policy, prompt, n, min_length, max_length, temperature, generator)
    if path == "vllm":
        rollout = vllm_rollout(*arguments)
    elif path == "compiled":
        rollout = compiled_rollout(*arguments)
    elif path == "static":
        rollout = static_rollout(
            *arguments[:3],
            min_length=min_length,
            max_length=max_length,
            temperature=temperature,
            generator=generator,
        )
    elif not policy.uses_lean_gpt2(policy.model):
        lanes = policy.lanes.count > 1 and policy.step_together is None and n > 1
        return (_lane_rollout if lanes else _eager_rollout)(*arguments, record=record)
    else:
        # inference mode skips autograd's bookkeeping (a tenth of the lean rollout's time); its
        # tensors may not enter autograd or be written outside it, so the rows leave as copies
        with torch.inference_mode():
            rollout = _eager_rollout(*arguments, record=record)
        copies = {k: getattr(rollout, k) for k in ("tokens", "length", "log_pf", "log_pterm")}
        rollout = replace(rollout, **{k: v if v is None else v.clone() for k, v in copies.items()})
    return rollout if record else replace(rollout, log_pf=None, log_pterm=None)


@torch.no_grad()
def eager_logits(
    policy: RolloutPolicy, prompt_rows: Sequence[Sequence[int]], tokens: torch.Tensor
) -> torch.Tensor:
    """The logits [n, V] (float32) the eager rollout reads at column k after each row's prompt
    ids ``prompt_rows`` and ``tokens`` [n, k] (a rollout's first k columns: ``pad_id`` after a
    stop), by the rollout's own forwards (its decoder fed ``tokens``), so that a rollout's draw
    at column k can be re-examined (``adapters.lm.gpu.decode_agreement``)."""
    device = policy.device
    was_training = policy.model.training
    decoder: Decoder
    try:
        if policy.uses_lean_gpt2(policy.model):
            prompts = lean_gpt2.prompt_logits_and_past(
                policy.model, prompt_rows, policy.pad_id, device
            )
            decoder = LeanDecoder(policy.model, prompts)
        else:
            policy.model.eval()
            shared = policy.step_together is None
            rows = [list(row) for row in prompt_rows]
            decoder = ModelDecoder(policy.model, rows, policy.pad_id, tokens.shape[1], shared)
        logits = decoder.prompt_logits
        for column in tokens.to(device).T:
            logits = decoder.next_logits(column)
    finally:
        policy.model.train(was_training)
    return logits.float().clone()


def _lane_rollout(
    policy: RolloutPolicy,
    prompt: str | Sequence[str],
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
    generator: torch.Generator | None,
    record: bool = True,
) -> Rollout:
    """The eager rollout's rows in ``policy.lanes``' lanes side by side (adapters.lm.lanes):
    contiguous groups of rows, each drawn from a generator of its own seeded from ``generator``
    in lane order, so the rows depend on the seed and the number of lanes only. The rows'
    prompts are forwarded once, here, and each lane takes its rows' keys and values."""
    start = time.perf_counter()
    check_rollout_shape(n, min_length, max_length)
    groups = split(n, policy.lanes.count)
    seeds = torch.randint(0, SEED_HIGH, (len(groups),), generator=generator).tolist()
    prompts = [prompt] * n if isinstance(prompt, str) else list(prompt)
    prompt_rows = row_prompt_ids(policy.prompt_ids, prompts, n)
    policy.check_positions(max(len(row) for row in prompt_rows), max_length)
    temp = row_temperatures(temperature, n)
    was_training = policy.model.training
    policy.model.eval()  # model-wide: set once here, not by each lane
    try:
        past = shared_prompts.PromptPast(policy.model, prompt_rows, policy.pad_id)
        prefill_s = time.perf_counter() - start
        lanes = [
            {
                "prompt": prompts[rows.start : rows.stop],
                "n": len(rows),
                "min_length": min_length,
                "max_length": max_length,
                "temperature": temp[rows.start : rows.stop],
                "seed": seed,
                "lane": lane,
                "past": past.of_rows(rows),
                "record": record,
            }
            for lane, (rows, seed) in enumerate(zip(groups, seeds, strict=True))
        ]
        processes = policy.lanes.processes(policy, _seeded_rollout)
        if processes:  # the first lane here, the others each in its process (lane_process.py)
            for process, arguments in zip(processes, lanes[1:], strict=True):
                process.start(policy.model, arguments)
            try:
                with lane_threads(policy.lanes.threads):
                    parts = [_seeded_rollout(policy, **lanes[0])]
                    parts += _process_results(policy, processes, lanes[1:])
            except BaseException:
                for process in processes:  # no rows of this call left for the next to read
                    process.discard()
                raise
        else:
            work = [partial(_seeded_rollout, policy, **arguments) for arguments in lanes]
            parts = policy.lanes.run(work, dropout=False)  # eval mode: no masks
    finally:
        policy.model.train(was_training)
    return concatenated(parts, time.perf_counter() - start, prefill_s)


def _process_results(
    policy: RolloutPolicy, processes: Sequence[LaneProcess], lanes: Sequence[dict[str, Any]]
) -> list[Rollout]:
    """The rollouts the lanes' processes send back; where one has ended, its lanes rolled out
    here (the same rows: the same code and seeds), once warned, and lanes as threads after."""
    parts, ended = [], False
    for process, arguments in zip(processes, lanes, strict=True):
        try:
            parts.append(process.result())
        except LaneEnded:
            ended = True
            parts.append(_seeded_rollout(policy, **arguments))
    if ended:
        warnings.warn(ENDED, RuntimeWarning, stacklevel=2)
        policy.lanes.lost_processes()
    return parts


def _seeded_rollout(policy: RolloutPolicy, seed: int, **arguments: Any) -> Rollout:
    """One lane's rows: ``_eager_rollout`` from a generator seeded with ``seed``."""
    generator = torch.Generator(device=policy.device).manual_seed(seed)
    return _eager_rollout(policy, generator=generator, **arguments)


def _eager_rollout(
    policy: RolloutPolicy,
    prompt: str | Sequence[str],
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
    generator: torch.Generator | None,
    lane: int = 0,
    past: shared_prompts.PromptPast | None = None,
    record: bool = True,
) -> Rollout:
    """``sample_rollout`` on the eager path (``lane``: the lane whose grammar state it takes;
    ``past``: its rows' prompts already forwarded, a model's own forward only; ``record``:
    ``sample_rollout``'s)."""
    check_rollout_shape(n, min_length, max_length)
    start = time.perf_counter()
    model_s = grammar_s = 0.0
    device = policy.device
    temp = row_temperatures(temperature, n)
    # dividing by 1 changes nothing: the untempered rollout skips it (one operation a column)
    temp_col = None if bool((temp == 1).all()) else temp.to(device)[:, None]
    prompt_rows = row_prompt_ids(policy.prompt_ids, prompt, n)
    policy.check_positions(max(len(row) for row in prompt_rows), max_length)
    big_t, num_legal = max_length, len(policy.legal_ids)
    # one gather of the legal columns and the stop column: the behaviour's sub-vocabulary
    sub_ids = torch.tensor([*policy.legal_ids, policy.stop_id], dtype=torch.long, device=device)
    length = torch.full((n,), big_t, dtype=torch.long, device=device)
    # each column's tokens and log-probabilities, laid out as [n, T] (and [n, T + 1]) at the end
    token_cols: list[torch.Tensor] = []
    pf_cols: list[torch.Tensor] = []
    pterm_cols: list[torch.Tensor] = []
    active = torch.ones(n, dtype=torch.bool, device=device)
    grammar = policy.grammar_batch(n, lane)
    if grammar is not None:
        grammar.reset()
    free_mask = torch.ones(n, num_legal + 1, dtype=torch.bool, device=device)

    was_training = policy.model.training
    lean = policy.uses_lean_gpt2(policy.model)
    if not lean:  # the lean forward has no mode (no dropout, functional ops): no switch to pay
        policy.model.eval()
    try:
        tic = time.perf_counter()
        decoder: Decoder
        if lean:
            prompts = lean_gpt2.prompt_logits_and_past(
                policy.model, prompt_rows, policy.pad_id, device
            )
            decoder = LeanDecoder(policy.model, prompts)
        else:
            shared = policy.step_together is None
            columns = None if record else sub_ids
            decoder = ModelDecoder(
                policy.model, prompt_rows, policy.pad_id, big_t, shared, past, columns
            )
        logits = decoder.prompt_logits
        model_s += time.perf_counter() - tic
        idle = False  # every row of this rank has stopped (only while other ranks step on)
        for k in range(big_t + 1):
            if k == big_t:
                if record and not idle:  # (an idle rank's rows have all stopped: column 0)
                    _, stop_lp = token_log_probs(
                        logits, torch.full_like(length, policy.stop_id), policy.stop_id
                    )
                    pterm_cols.append(torch.where(active, stop_lp, 0.0))
                break
            rows: list[int] = []
            if not idle:
                tic = time.perf_counter()
                # [n, L + 1]: legal tokens, then "the text is complete"; one packed copy to the
                # device (non-blocking from pinned memory on a GPU), unpacked there
                if grammar is None:
                    mask = free_mask
                else:
                    packed = grammar.next_bitmask().to(device, non_blocking=True)
                    mask = unpack_bitmask(packed, num_legal + 1)
                grammar_s += time.perf_counter() - tic
                # a finished row may only stop; below min_length no row may stop, and a dead end
                # (nothing allowed, stop not allowed) stops rather than failing
                sub_mask = mask & active[:, None]
                if k < min_length:
                    sub_mask[:, num_legal] = False
                sub_mask[:, num_legal] |= ~sub_mask.any(dim=1)
                # the behaviour's columns: the decoder's own where it computes only those
                behaviour = logits if decoder.columns is not None else logits[:, sub_ids]
                if behaviour.dtype != torch.float32:
                    behaviour = behaviour.float()
                if temp_col is not None:
                    behaviour = behaviour / temp_col
                behaviour = torch.where(sub_mask, behaviour, float("-inf"))
                choice = torch.multinomial(
                    torch.softmax(behaviour, dim=1), 1, generator=generator
                ).squeeze(1)
                stops = active & (choice == num_legal)
                moves = active & ~stops
                # sub-vocabulary index -> vocabulary id (a stop's id is masked out by moves)
                step_tokens = torch.where(moves, sub_ids[choice], policy.pad_id)
                if record:
                    token_lp, stop_lp = token_log_probs(logits, step_tokens, policy.stop_id)
                    pterm_cols.append(torch.where(active, stop_lp, 0.0))
                    pf_cols.append(torch.where(moves, token_lp, 0.0))
                token_cols.append(step_tokens)
                length = torch.where(stops, k, length)
                active = moves
                # the step's only host round trip: each row's new token, -1 where the row is done
                moved = torch.where(moves, step_tokens, -1).tolist()
                rows = [row for row, token in enumerate(moved) if token >= 0]
            done = not rows
            if policy.step_together is not None:
                # a sharded model's forwards are collectives: step on until every rank is done
                done = policy.step_together(done)
            if done:
                break
            idle = not rows
            if grammar is not None and rows:
                tic = time.perf_counter()
                accepted = grammar.accept_many(rows, [moved[row] for row in rows])
                grammar_s += time.perf_counter() - tic
                if not all(accepted):
                    raise RuntimeError("grammar matcher rejected a token its own mask allowed")
            tic = time.perf_counter()
            logits = decoder.next_logits(step_tokens)
            model_s += time.perf_counter() - tic
    finally:
        if not lean:
            policy.model.train(was_training)

    tokens = side_by_side(token_cols, big_t, policy.pad_id, torch.long, n, device)
    log_pf = log_pterm = None
    if record:
        log_pf = side_by_side(pf_cols, big_t, 0.0, torch.float32, n, device)
        log_pterm = side_by_side(pterm_cols, big_t + 1, 0.0, torch.float32, n, device)
    rows = [tuple(row[:tau]) for row, tau in zip(tokens.tolist(), length.tolist(), strict=True)]
    texts = [policy.row_text(row) for row in rows]
    timings = RolloutTimings(model_s, grammar_s, time.perf_counter() - start)
    return Rollout(tokens, length, log_pf, log_pterm, texts, rows, timings)
