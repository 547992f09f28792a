"""The embedded GPT-2's rollout on the CPU, compiled by Numba (``decode = "compiled"``).

The same rollout as ``raptb.adapters.lm.rollout``'s eager path (its docstring states the
behaviour's mask and the recorded log-probabilities) for the models ``lean_gpt2`` supports with
an activation ``weights.ACTIVATIONS`` names, in float32 on the CPU. The weights are packed from
the torch module at each rollout (``weights.packed``: the optimizer's updates are read), the keys
and values live in preallocated NumPy arrays (``compiled_gpt2.cache``), and each column is
``rollout_kernels.column``: the draw of every active row and GPT-2's forward of the rows that
moved, one compiled call.

- With xgrammar's matchers (``GrammarBatch``) the host runs the columns: before each, the
  matchers fill every row's mask, which the column reads; after it, they accept the tokens drawn.
  Each column's noise is drawn from the generator as the eager path draws it.
- Without a grammar, or with a grammar a task declared as an automaton (its table,
  ``adapters.lm.table_grammar``), nothing is left for the host between columns: every column runs
  in one compiled call (``rollout_kernels.columns``, the masks read from the table), its noise
  drawn for every column beforehand from the generator as the column loop draws it and the
  generator put back to where the columns used leave it.

The draw is torch.multinomial's (``rollout_kernels``): a seed gives the same rows as the eager
path, up to a tie within float rounding, and leaves the generator in the same state
(``tests/adapters/test_compiled_rollout.py``). A prompt every row shares is run through the
compiled forward once (``compiled_gpt2.shared_prompt``); rows with prompts of different lengths
are left-padded together by ``lean_gpt2.prompt_logits_and_past``, as on the eager path, the pads
masked out of every column's attention (``key_bias``).

``usable(model)`` says when it applies (with ``lean_gpt2.supports``), ``preferred(model)`` when
``decode = "auto"`` takes it (small models: ``AUTO_MAX_PARAMETERS``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from raptb.adapters.lm.embedded import compiled_gpt2, lean_gpt2
from raptb.adapters.lm.embedded.rollout_kernels import column, columns, last_stops
from raptb.adapters.lm.embedded.weights import ACTIVATIONS, packed, shape_of
from raptb.adapters.lm.grammar import GrammarBatch
from raptb.adapters.lm.rollout_record import Rollout, RolloutTimings, row_temperatures
from raptb.adapters.lm.row_prompts import check_rollout_shape, row_prompt_ids
from raptb.adapters.lm.table_grammar import TableGrammarBatch

AUTO_MAX_PARAMETERS = 2_000_000
"""The largest model ``decode = "auto"`` hands to this path. Measured for the ONNX Runtime
rollout this path replaced (one thread, 34 rows, 9 columns, the two alternating, ``python
benchmarks/step_speed.py sizes``, 2026-11-29, a 2-core Intel Xeon; GPT-2 shapes with the embedded
model's 98-token vocabulary unless said), eager's time over that path's: 1.32-1.37x at 0.11M
parameters (the embedded model), 1.26-1.34x at 0.8M, 0.99-1.13x at 4.8M, 0.84-0.87x at 25M. Once
the products are large, torch's are the faster ones."""


def usable(model: torch.nn.Module) -> bool:
    """Whether this path runs ``model``'s rollouts: a model ``lean_gpt2`` supports (the caller
    asks that, memoised), with an activation the kernels compute (``weights.ACTIVATIONS``) and
    every parameter float32 on the CPU."""
    return getattr(model.config, "activation_function", None) in ACTIVATIONS and all(
        p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters()
    )


def preferred(model: torch.nn.Module) -> bool:
    """``usable`` and at most ``AUTO_MAX_PARAMETERS`` parameters: where ``auto`` takes it."""
    return sum(p.numel() for p in model.parameters()) <= AUTO_MAX_PARAMETERS and usable(model)


def compiled_rollout(
    policy,
    prompt: str | Sequence[str],
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
    generator: torch.Generator | None,
) -> Rollout:
    """``sample_rollout`` on this path (``policy``: ``rollout.RolloutPolicy``)."""
    check_rollout_shape(n, min_length, max_length)
    prompt_rows = row_prompt_ids(policy.prompt_ids, prompt, n)
    policy.check_positions(max(len(row) for row in prompt_rows), max_length)
    start = time.perf_counter()
    model, big_t = policy.model, max_length
    shape = shape_of(model)
    sub_ids = np.array([*policy.legal_ids, policy.stop_id], dtype=np.int64)
    with torch.inference_mode():
        weights = packed(model)
        logits, key_bias, positions, cache, work = _prompt(
            policy, weights, shape, prompt_rows, big_t
        )
    model_s = time.perf_counter() - start
    temp = row_temperatures(temperature, n).numpy()[:, None]
    rollout = (logits, key_bias, positions, temp, sub_ids, min_length)
    out = (
        np.full((big_t, n), policy.pad_id, dtype=np.int64),
        *(np.zeros((big_t, n), np.float32) for _ in range(3)),
        *(np.zeros((big_t, n), bool) for _ in range(2)),
        np.ones(n, bool),
        np.zeros(n, np.int64),
    )
    arrays = (weights, cache, work, rollout)
    grammar = policy.grammar_batch(n)
    source = torch.default_generator if generator is None else generator
    if isinstance(grammar, GrammarBatch):
        used, model_s, grammar_s = _host_columns(arrays, grammar, out, source, (model_s, 0.0))
    else:
        used = _one_call(arrays, grammar, out, source)
        model_s, grammar_s = time.perf_counter() - start, 0.0
    _check_finite(out)
    last_stop = np.zeros(n, np.float32)
    if used == big_t:
        last_stops(logits, policy.stop_id, out[6], last_stop)
    return _recorded(policy, out, used, last_stop, (model_s, grammar_s, start))


def _prompt(policy, weights: tuple, shape, prompt_rows: list[list[int]], big_t: int) -> tuple:
    """The logits [n, V] after each row's prompt, the key bias [n, P] (0, or -inf on a
    left-padded prompt's pads), each row's first position [n], the cache with the prompt's keys
    and values in its first P slots and ``forward``'s work buffers."""
    n = len(prompt_rows)
    if all(row == prompt_rows[0] for row in prompt_rows):
        p = len(prompt_rows[0])
        cache = compiled_gpt2.cache(shape, n, p + big_t)
        work = compiled_gpt2.work(shape, n, p + big_t)
        logits = np.empty((n, shape.vocab), np.float32)
        ids = np.array(prompt_rows[0], dtype=np.int64)
        compiled_gpt2.shared_prompt(weights, ids, cache, work, logits)
        return logits, np.zeros((n, p), np.float32), np.full(n, p, np.int64), cache, work
    first, past, position, key_mask = lean_gpt2.prompt_logits_and_past(
        policy.model, prompt_rows, policy.pad_id, policy.device
    )
    p = past[0][0].shape[2]
    keys, values = cache = compiled_gpt2.cache(shape, n, p + big_t)
    for layer, (k, v) in enumerate(past):
        keys[layer, ..., :p] = k.numpy().transpose(0, 1, 3, 2)
        values[layer, :, :, :p] = v.numpy()
    key_bias = np.zeros((n, p), dtype=np.float32)
    if key_mask is not None:
        key_bias[~key_mask.numpy()] = -np.inf
    positions = position[:, 0].numpy().astype(np.int64)
    logits = first.contiguous().numpy().copy()
    return logits, key_bias, positions, cache, compiled_gpt2.work(shape, n, p + big_t)


def _host_columns(
    arrays: tuple,
    grammar: GrammarBatch,
    out: tuple,
    generator: torch.Generator,
    times: tuple[float, float],
) -> tuple[int, float, float]:
    """The columns one compiled call each, xgrammar's matchers filling the masks before each
    and accepting the tokens drawn after it. Returns the columns drawn and the model's and the
    grammar's seconds (``times``: before)."""
    model_s, grammar_s = times
    weights, cache, work, rollout = arrays
    n, width = rollout[0].shape[0], rollout[4].shape[0]
    tokens, moved = out[0], out[5]
    grammar.reset()
    used = 0
    for k in range(tokens.shape[0]):
        tic = time.perf_counter()
        mask = grammar.next_mask().numpy()
        grammar_s += time.perf_counter() - tic
        # torch.multinomial's noise, from the same generator in the same order
        noise = torch.empty((n, width), dtype=torch.float32).exponential_(generator=generator)
        tic = time.perf_counter()
        m = column(weights, cache, work, rollout, k, mask, noise.numpy(), out)
        model_s += time.perf_counter() - tic
        used = k + 1
        _check_finite(out, k)
        if m == 0:
            break
        rows = np.flatnonzero(moved[k])
        tic = time.perf_counter()
        accepted = grammar.accept_many(rows.tolist(), tokens[k, rows].tolist())
        grammar_s += time.perf_counter() - tic
        if not all(accepted):
            raise RuntimeError("grammar matcher rejected a token its own mask allowed")
    return used, model_s, grammar_s


def _check_finite(out: tuple, column: int | None = None) -> None:
    """RuntimeError, as torch.multinomial's, where an active row's log-normaliser is not finite
    (in ``column``, or in any)."""
    log_norm, was_active = out[3], out[4]
    if column is not None:
        log_norm, was_active = log_norm[column], was_active[column]
    if not np.isfinite(log_norm[was_active]).all():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")


def _one_call(
    arrays: tuple, grammar: TableGrammarBatch | None, out: tuple, generator: torch.Generator
) -> int:
    """Every column in one compiled call, the masks from the automaton's table (its stop
    column's next state 0, never read: a stopped row keeps its state; without a grammar one
    state allowing all), the noise of every column drawn first as the column loop draws it and
    the generator put back to where the columns used leave it. Returns the columns drawn."""
    rollout = arrays[3]
    n, width, big_t = rollout[0].shape[0], rollout[4].shape[0], out[0].shape[0]
    if grammar is None:
        table = (np.ones((1, width), dtype=bool), np.zeros((1, width), dtype=np.int64))
    else:
        t = grammar.table
        stop = np.zeros((t.num_states, 1), dtype=np.int64)
        table = (t.mask, np.concatenate([t.next_state, stop], axis=1))
    # every column's noise and the generator's state after each (a state is 5 us to take, a
    # column's redraw 20)
    noise = torch.empty((big_t, n, width))
    after = []
    for column_noise in noise:
        column_noise.exponential_(generator=generator)
        after.append(generator.get_state())
    used = columns(*arrays, table, noise.numpy(), out)
    if 0 < used < big_t:
        generator.set_state(after[used - 1])
    return used


def _recorded(
    policy, out: tuple, used: int, last_stop: np.ndarray, times: tuple[float, float, float]
) -> Rollout:
    """The ``Rollout`` of the scans' first ``used`` columns, on the policy's device, with each
    row's ids and text; ``times``: the model's and the grammar's seconds and when the rollout
    began."""
    step_tokens, token_lp, stop_lp, _, active, moves, last_active, _ = out
    big_t, n = step_tokens.shape
    tokens = np.ascontiguousarray(step_tokens.T)
    log_pf = np.where(moves, token_lp, 0.0).T.astype(np.float32)
    log_pterm = np.zeros((n, big_t + 1), dtype=np.float32)
    log_pterm[:, :big_t] = np.where(active, stop_lp, 0.0).T
    length = np.full(n, big_t, dtype=np.int64)
    if used:  # (T = 0: no column drawn)
        stopped = (active & ~moves)[:used].T  # [n, used]: the column where each row stopped
        length = np.where(stopped.any(axis=1), stopped.argmax(axis=1), big_t)
    if used == big_t:
        log_pterm[:, big_t] = np.where(last_active, last_stop, 0.0)
    model_s, grammar_s, start = times
    row_ids = [tuple(row[:tau]) for row, tau in zip(tokens.tolist(), length.tolist(), strict=True)]
    device = policy.device
    return Rollout(
        torch.from_numpy(tokens).to(device),
        torch.from_numpy(length.astype(np.int64)).to(device),
        torch.from_numpy(np.ascontiguousarray(log_pf)).to(device),
        torch.from_numpy(log_pterm).to(device),
        [policy.row_text(row) for row in row_ids],
        row_ids,
        RolloutTimings(model_s, grammar_s, time.perf_counter() - start),
    )
