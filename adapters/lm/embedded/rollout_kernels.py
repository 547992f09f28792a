"""The compiled rollout's kernels: one column of the draw and GPT-2's forward (``column``), and
every column of a rollout whose masks come from an automaton's table (``columns``).

``column`` computes, for column k and each row still active, from the row's logits [V] after
its tokens so far and its grammar's mask [K] over the behaviour's K choices (the legal tokens,
then stop; the caller's: xgrammar's, filled on the host between columns, or the table's row of
the row's state):

- the mask rules of ``raptb.adapters.lm.rollout``: no stop below ``min_length`` and a dead end
  (no legal token) stops;
- the behaviour ``softmax(logits[sub_ids] / temperature)`` under the mask and the choice
  ``argmax(p / noise)`` (the first of ties): torch.multinomial's draw of one sample with the
  exponential noise the caller drew from torch's generator as multinomial draws it (aten's
  ``q = empty_like(p).exponential_(1, gen); argmax(p / q)``);
- the log-normaliser over the vocabulary and the token's and the stop's log-probabilities
  (untempered, unmasked: a gathered logit minus the log-normaliser, as
  ``rollout_record.token_log_probs``);
- then GPT-2's forward (``compiled_gpt2.forward``) of the rows that moved, at their positions,
  their keys and values stored at the column's slot, their logits overwritten for column k + 1.

A stopped row's later columns only read the stop, which the caller masks by ``active``: its
log-probabilities are left 0 here and its forward skipped. ``columns`` runs ``column`` for each
column, each row's mask its automaton state's row of the table (one state allowing every choice
without a grammar), and stops after a column where no row moved.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from raptb.adapters.lm.embedded.compiled_gpt2 import forward

_ZERO = np.float32(0.0)
_MINUS_INF = np.float32(-np.inf)
_JIT = {"cache": True, "error_model": "numpy"}  # (as compiled_gpt2's: IEEE division)


@nb.njit(**_JIT)
def log_normaliser(row: np.ndarray) -> np.float32:
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
def column(
    model: tuple,
    cache: tuple,
    work: tuple,
    rollout: tuple,
    k: int,
    grammar: np.ndarray,
    noise: np.ndarray,
    out: tuple,
) -> int:
    """Column ``k`` (module docstring) on the caller's arrays: ``cache`` the keys and values,
    ``rollout`` the logits [n, V] (overwritten with the next column's for the rows that moved),
    ``key_bias`` [n, P], the prompts' ``positions`` [n], ``temperature`` [n, 1], ``sub_ids`` [K]
    and ``min_length``; ``grammar`` [n, K] each row's mask before the rules, ``noise`` [n, K];
    ``out`` the scans [T, n] (tokens filled with the pad id, the others with 0) whose row k this
    fills, the rows still active [n] (updated) and each row's choice [n] (its index into
    ``sub_ids``). Returns how many rows moved."""
    keys, values = cache
    logits, key_bias, positions, temperature, sub_ids, min_length = rollout
    tokens, token_lp, stop_lp, log_norm, was_active, moved, active, choices = out
    n, prompt, width = logits.shape[0], key_bias.shape[1], sub_ids.shape[0]
    num_legal, stop_id = width - 1, sub_ids[width - 1]
    mask = np.empty(width, np.bool_)
    behaviour = np.empty(width, np.float32)
    rows = np.empty(n, np.int64)
    step_tokens = np.empty(n, np.int64)
    step_positions = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        was_active[k, i] = active[i]
        if not active[i]:
            continue  # it may only stop: its log-probabilities are masked by the caller
        norm = log_normaliser(logits[i])
        log_norm[k, i] = norm
        stop_lp[k, i] = logits[i, stop_id] - norm
        any_legal = False
        for j in range(num_legal):
            mask[j] = grammar[i, j]
            any_legal = any_legal or mask[j]
        mask[num_legal] = (grammar[i, num_legal] and k >= min_length) or not any_legal
        choice = _draw(logits[i], mask, sub_ids, temperature[i, 0], noise[i], behaviour)
        choices[i] = choice
        token_lp[k, i] = logits[i, sub_ids[choice]] - norm
        if choice == num_legal:
            active[i] = False
            continue
        moved[k, i] = True
        tokens[k, i] = sub_ids[choice]
        rows[m], step_tokens[m], step_positions[m] = i, sub_ids[choice], positions[i] + k
        m += 1
    if m > 0:
        moving = rows[:m]
        step = (step_tokens[:m], step_positions[:m], moving)
        step_logits = forward(model, step, keys, values, key_bias, prompt + k, work)
        for r in range(m):
            logits[moving[r]] = step_logits[r]
    return m


@nb.njit(**_JIT)
def columns(
    model: tuple,
    cache: tuple,
    work: tuple,
    rollout: tuple,
    table: tuple,
    noise: np.ndarray,
    out: tuple,
) -> int:
    """Every column (``column``'s arguments; ``noise`` [T, n, K]), each row's mask read from
    ``table``'s mask [S, K] at its state, which moves by its next states [S, K] (from state 0),
    until a column where no row moved. Returns the columns drawn."""
    table_mask, table_next = table
    logits, active, choices = rollout[0], out[6], out[7]
    n, width = logits.shape[0], table_mask.shape[1]
    state = np.zeros(n, np.int64)
    grammar = np.zeros((n, width), np.bool_)
    used = 0
    for k in range(noise.shape[0]):
        for i in range(n):
            if active[i]:
                grammar[i] = table_mask[state[i]]
        m = column(model, cache, work, rollout, k, grammar, noise[k], out)
        used = k + 1
        if m == 0:
            break
        for i in range(n):
            if out[5][k, i]:
                state[i] = table_next[state[i], choices[i]]
    return used


@nb.njit(**_JIT)
def last_stops(logits: np.ndarray, stop_id: int, active: np.ndarray, out: np.ndarray) -> None:
    """out[i] = the stop's log-probability after the last column, for the active rows."""
    for i in range(logits.shape[0]):
        if active[i]:
            out[i] = logits[i, stop_id] - log_normaliser(logits[i])
