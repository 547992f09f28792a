"""The one-call rollout (``onnx_graph.rollout_graph``) as one compiled Numba function.

``onnx_rollout`` runs a rollout without a grammar, or with an automaton's table, as one call of an
ONNX graph: the columns in an ONNX ``Loop`` whose body is about 120 nodes. For the embedded model
(2 blocks of width 64, 30 rows, 9 columns) that is some 1,000 node runs of a few microseconds of
dispatch each around tens of nanoseconds of arithmetic: 3.3-5.5 ms a rollout on one core. This
module computes the same function from the same inputs (``run`` takes the graph's feeds and returns
its outputs in its order) in one compiled loop:

- per column and row, the draw: the mask from the row's state's row of the table and the rules
  (a finished row only stops, no stop below ``min_length``, a dead end stops), the behaviour
  ``softmax(logits[sub_ids] / temperature)``, ``choice = argmax(p / noise)`` (the first of ties:
  torch.multinomial's draw with the noise the caller drew from torch's generator), the
  log-normaliser over the vocabulary and the token's and stop's log-probabilities;
- then GPT-2's forward of the drawn tokens at the column's positions over each row's keys and
  values (the prompt's, with ``key_bias`` on a left-padded prompt's pads, and the columns
  before): ``compiled_gpt2.forward``.

Two shortcuts, neither visible in what the caller reads: the forward runs for the rows that moved
only (a stopped row's later columns only read the stop, and the caller masks its log-probabilities
by ``active``: they are returned as 0 here), and no forward follows a column where no row moved
(its logits would only give the last stop's log-probability of rows that are all stopped).

The same rows and log-probabilities as the graph up to float rounding (a choice can differ only
where two of a row's chances tie within rounding): ``tests/adapters/test_compiled_rollout.py``
holds them to ONNX Runtime's graph on random models, prompts, masks and temperatures. The main
job's rollout (``benchmarks/step_speed.md``): about 2x faster than the graph's call.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from raptb.adapters.lm.embedded import compiled_gpt2
from raptb.adapters.lm.embedded.compiled_gpt2 import forward, shared_prompt
from raptb.adapters.lm.embedded.onnx_graph import ColumnShape

_ZERO = np.float32(0.0)
_MINUS_INF = np.float32(-np.inf)
_JIT = {"cache": True, "error_model": "numpy"}  # (as compiled_gpt2's: IEEE division)


@nb.njit(**_JIT)
def _log_normaliser(row: np.ndarray) -> np.float32:
    """log sum exp over ``row`` (its max taken out first)."""
    top = row[0]
    for v in range(1, row.shape[0]):
        top = max(top, row[v])
    total = _ZERO
    for v in range(row.shape[0]):
        total += np.exp(row[v] - top)
    return top + np.log(total)


@nb.njit(**_JIT)
def _draw(
    logits: np.ndarray,
    mask: np.ndarray,
    sub_ids: np.ndarray,
    temperature: np.float32,
    noise: np.ndarray,
    behaviour: np.ndarray,
) -> int:
    """The choice among the K = len(sub_ids) sub-vocabulary entries of a row with ``logits`` [V]:
    argmax over ``mask`` of softmax(logits[sub_ids] / temperature) / noise, the first of ties."""
    for j in range(sub_ids.shape[0]):
        behaviour[j] = logits[sub_ids[j]] / temperature if mask[j] else _MINUS_INF
    top = _MINUS_INF
    for j in range(sub_ids.shape[0]):
        top = max(top, behaviour[j])
    total = _ZERO
    for j in range(sub_ids.shape[0]):
        behaviour[j] = np.exp(behaviour[j] - top)
        total += behaviour[j]
    choice, best = 0, np.float32(-1.0)
    for j in range(sub_ids.shape[0]):
        chance = behaviour[j] / total / noise[j]
        if chance > best:
            choice, best = j, chance
    return choice


@nb.njit(**_JIT)
def _columns(
    model: tuple,
    cache: tuple,
    work: tuple,
    rollout: tuple,
    limits: tuple,
    table: tuple,
    out: tuple,
) -> int:
    """The rollout graph's loop (module docstring) on arrays the caller made: ``cache`` the keys
    and values with the prompt's in their first slots, ``rollout`` the logits after the prompt
    (overwritten), ``key_bias``, ``positions``, ``temperature``, ``noise`` and ``sub_ids``,
    ``limits`` min_length and T, ``table`` the automaton's mask and next states, ``out`` the
    scans [T, n] (tokens filled with the pad id, the others with 0), the last active rows (all
    True) and the last stop's log-probabilities (0). Returns the columns drawn."""
    keys, values = cache
    logits, key_bias, positions, temperature, noise, sub_ids = rollout
    min_length, columns = limits
    table_mask, table_next = table
    tokens, token_lp, stop_lp, log_norm, was_active, moved, active, last_stop = out
    n, prompt, width = logits.shape[0], key_bias.shape[1], sub_ids.shape[0]
    num_legal, stop_id = width - 1, sub_ids[width - 1]
    state = np.zeros(n, np.int64)
    mask = np.empty(width, np.bool_)
    behaviour = np.empty(width, np.float32)
    rows = np.empty(n, np.int64)
    step_tokens = np.empty(n, np.int64)
    step_positions = np.empty(n, np.int64)
    used = 0
    for k in range(columns):
        m = 0
        for i in range(n):
            was_active[k, i] = active[i]
            if not active[i]:
                continue  # it may only stop: its log-probabilities are masked by the caller
            norm = _log_normaliser(logits[i])
            log_norm[k, i] = norm
            stop_lp[k, i] = logits[i, stop_id] - norm
            s = state[i]
            any_legal = False
            for j in range(num_legal):
                mask[j] = table_mask[s, j]
                any_legal = any_legal or mask[j]
            mask[num_legal] = (table_mask[s, num_legal] and k >= min_length) or not any_legal
            choice = _draw(logits[i], mask, sub_ids, temperature[i, 0], noise[k, i], behaviour)
            token_lp[k, i] = logits[i, sub_ids[choice]] - norm
            if choice == num_legal:
                active[i] = False
                continue
            moved[k, i] = True
            tokens[k, i] = sub_ids[choice]
            state[i] = table_next[s, choice]
            rows[m], step_tokens[m], step_positions[m] = i, sub_ids[choice], positions[i] + k
            m += 1
        used = k + 1
        if m == 0:
            break
        moving = rows[:m]
        step = (step_tokens[:m], step_positions[:m], moving)
        step_logits = forward(model, step, keys, values, key_bias, prompt + k, work)
        for r in range(m):
            logits[moving[r]] = step_logits[r]
    if used == columns:
        for i in range(n):
            if active[i]:
                last_stop[i] = logits[i, stop_id] - _log_normaliser(logits[i])
    return used


def run(feeds: dict[str, np.ndarray], shape: ColumnShape) -> list[np.ndarray]:
    """The ``rollout`` graph's outputs (``onnx_graph.rollout_graph``, in its order: last stop
    log-probability, last active, then the scans tokens, token_lp, stop_lp, log_norm, active,
    moves) for its feeds, computed by the compiled loop. Instead of the prompt's ``logits`` and
    ``past_k{l}``, ``past_v{l}``, ``feeds`` may give ``prompt_ids`` [P], one prompt every row
    shares (``positions`` then P, ``key_bias`` [n, P] of 0): its forward runs here, once."""
    model = compiled_gpt2.weights(feeds, shape)
    n, columns = len(feeds["positions"]), int(feeds["columns"])
    shared = feeds.get("prompt_ids")
    prompt = len(shared) if shared is not None else feeds["past_k0"].shape[2]
    work = compiled_gpt2.work(shape, n, prompt + columns)
    keys, values = compiled_gpt2.cache(shape, n, prompt + columns)
    if shared is not None:
        logits = np.empty((n, shape.vocab), np.float32)
        shared_prompt(model, np.asarray(shared, np.int64), (keys, values), work, logits)
    else:
        logits = feeds["logits"].copy()
        for layer in range(shape.n_layer):
            keys[layer, ..., :prompt] = feeds[f"past_k{layer}"].transpose(0, 1, 3, 2)
            values[layer, :, :, :prompt] = feeds[f"past_v{layer}"]
    sub_ids = np.array(shape.sub_ids, dtype=np.int64)
    rollout = (
        logits,
        np.ascontiguousarray(feeds["key_bias"]),
        feeds["positions"],
        feeds["temperature"],
        feeds["noise"],
        sub_ids,
    )
    scans = (
        np.full((columns, n), int(feeds["pad"]), dtype=np.int64),
        *(np.zeros((columns, n), np.float32) for _ in range(3)),
        *(np.zeros((columns, n), bool) for _ in range(2)),
    )
    last_active, last_stop = np.ones(n, bool), np.zeros(n, np.float32)
    used = _columns(
        model,
        (keys, values),
        work,
        rollout,
        (int(feeds["min_length"]), columns),
        (feeds["table_mask"], feeds["table_next"]),
        (*scans, last_active, last_stop),
    )
    return [last_stop, last_active, *(scan[:used] for scan in scans)]
