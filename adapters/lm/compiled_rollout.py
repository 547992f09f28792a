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
  before): layer norms, the products by BLAS (``np.dot``), attention per row and head, the
  activation (the tanh GELU with ONNX Runtime's own rational tanh, MLAS's).

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

import math

import numba as nb
import numpy as np

from raptb.adapters.lm.onnx_builder import BLOCK_PARTS
from raptb.adapters.lm.onnx_graph import ColumnShape

_KINDS = {"gelu_tanh": 0, "gelu": 1, "relu": 2, "silu": 3}
"""``ColumnShape.activation`` -> the kernel's activation code."""

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_MINUS_INF = np.float32(-np.inf)
# error_model="numpy": a float division is IEEE's (no ZeroDivisionError check), which lets LLVM
# vectorise the loops that divide
_JIT = {"cache": True, "error_model": "numpy"}


@nb.njit(inline="always", **_JIT)
def _tanh(x: np.float32) -> np.float32:
    """tanh as ONNX Runtime's MLAS computes it (onnxruntime core/mlas/lib/tanh.cpp): a rational
    function of degrees 13/6 on x clamped to [-9, 9], within a few float32 ulps of tanh."""
    v = min(max(x, np.float32(-9.0)), np.float32(9.0))
    v2 = v * v
    p = v2 * np.float32(-2.76076847742355e-16) + np.float32(2.00018790482477e-13)
    p = p * v2 + np.float32(-8.60467152213735e-11)
    p = p * v2 + np.float32(5.12229709037114e-08)
    p = p * v2 + np.float32(1.48572235717979e-05)
    p = p * v2 + np.float32(6.37261928875436e-04)
    p = p * v2 + np.float32(4.89352455891786e-03)
    q = v2 * np.float32(1.19825839466702e-06) + np.float32(1.18534705686654e-04)
    q = q * v2 + np.float32(2.26843463243900e-03)
    q = q * v2 + np.float32(4.89352518554385e-03)
    return p * v / q


@nb.njit(**_JIT)
def _activate(x: np.ndarray, kind: int) -> None:
    """The MLP's activation in place on x [m, inner] (``_KINDS``)."""
    m, width = x.shape
    if kind == 0:
        c, a = np.float32(0.7978845608028654), np.float32(0.044715)
        for i in range(m):
            for j in range(width):
                v = x[i, j]
                x[i, j] = _HALF * v * (_ONE + _tanh(c * (v + a * v * v * v)))
    elif kind == 1:
        root_half = np.float32(0.7071067811865476)
        for i in range(m):
            for j in range(width):
                v = x[i, j]
                x[i, j] = _HALF * v * (_ONE + np.float32(math.erf(v * root_half)))
    elif kind == 2:
        for i in range(m):
            for j in range(width):
                x[i, j] = max(x[i, j], _ZERO)
    else:
        for i in range(m):
            for j in range(width):
                v = x[i, j]
                x[i, j] = v / (_ONE + np.exp(-v))


@nb.njit(fastmath={"reassoc"}, **_JIT)
def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out = (x - mean) / sqrt(var + eps) w + b over each row of x [m, c] (the sums vectorised)."""
    m, c = x.shape
    for i in range(m):
        mean = _ZERO
        for j in range(c):
            mean += x[i, j]
        mean /= np.float32(c)
        var = _ZERO
        for j in range(c):
            d = x[i, j] - mean
            var += d * d
        inv = _ONE / np.sqrt(var / np.float32(c) + np.float32(eps))
        for j in range(c):
            out[i, j] = (x[i, j] - mean) * inv * w[j] + b[j]


@nb.njit(**_JIT)
def _affine(x: np.ndarray, w: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = x w + b (x [m, k], w [k, o] by BLAS)."""
    np.dot(x, w, out)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] += b[j]


@nb.njit(**_JIT)
def _add(h: np.ndarray, t: np.ndarray) -> None:
    """h += t (the residual stream)."""
    for i in range(h.shape[0]):
        for j in range(h.shape[1]):
            h[i, j] += t[i, j]


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
def _attend(
    qkv: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    key_bias: np.ndarray,
    rows: np.ndarray,
    slot: int,
    scratch: np.ndarray,
    y: np.ndarray,
) -> None:
    """Each moving row r's (``rows[r]``) attention at column ``slot``: its new key and value from
    qkv [m, 3 c] stored at ``slot`` of its ``keys`` [n, H, D, S] (transposed: the scores are
    axpys over the keys) and ``values`` [n, H, S, D], softmax over slots 0..slot (the prompt's
    slots under ``key_bias``), the heads' outputs into y [m, c]."""
    heads, dim, prompt = keys.shape[1], keys.shape[2], key_bias.shape[1]
    c = heads * dim
    scale = np.float32(dim**-0.5)
    scores = scratch[: slot + 1]
    for r in range(rows.shape[0]):
        i = rows[r]
        for h in range(heads):
            base = h * dim
            for d in range(dim):
                keys[i, h, d, slot] = qkv[r, c + base + d]
                values[i, h, slot, d] = qkv[r, 2 * c + base + d]
            for j in range(slot + 1):
                scores[j] = key_bias[i, j] if j < prompt else _ZERO
            for d in range(dim):
                q = qkv[r, base + d] * scale
                for j in range(slot + 1):
                    scores[j] += q * keys[i, h, d, j]
            top = _MINUS_INF
            for j in range(slot + 1):
                top = max(top, scores[j])
            total = _ZERO
            for j in range(slot + 1):
                scores[j] = np.exp(scores[j] - top)
                total += scores[j]
            for d in range(dim):
                y[r, base + d] = _ZERO
            for j in range(slot + 1):
                p = scores[j] / total
                for d in range(dim):
                    y[r, base + d] += p * values[i, h, j, d]


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
def _forward(
    model: tuple,
    step: tuple,
    keys: np.ndarray,
    values: np.ndarray,
    key_bias: np.ndarray,
    slot: int,
    work: tuple,
) -> np.ndarray:
    """GPT-2's forward of ``step``'s tokens [m] at its positions [m] for its cache rows [m], their
    keys and values stored at ``slot``: the logits [m, V] (a view of the work buffer)."""
    tokens, positions, rows = step
    (wte, wpe, blocks, lnf_w, lnf_b, head, eps, kind) = model
    (ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b) = blocks
    (h_all, x_all, qkv_all, y_all, t_all, f_all, logits_all, scratch) = work
    m = rows.shape[0]
    h, x, qkv, y, t, f = h_all[:m], x_all[:m], qkv_all[:m], y_all[:m], t_all[:m], f_all[:m]
    for r in range(m):
        for j in range(h.shape[1]):
            h[r, j] = wte[tokens[r], j] + wpe[positions[r], j]
    for layer in range(ln1_w.shape[0]):
        _layer_norm(h, ln1_w[layer], ln1_b[layer], eps, x)
        _affine(x, attn_w[layer], attn_b[layer], qkv)
        _attend(qkv, keys[layer], values[layer], key_bias, rows, slot, scratch, y)
        _affine(y, proj_w[layer], proj_b[layer], t)
        _add(h, t)
        _layer_norm(h, ln2_w[layer], ln2_b[layer], eps, x)
        _affine(x, fc_w[layer], fc_b[layer], f)
        _activate(f, kind)
        _affine(f, out_w[layer], out_b[layer], t)
        _add(h, t)
    _layer_norm(h, lnf_w, lnf_b, eps, x)
    logits = logits_all[:m]
    np.dot(x, head, logits)
    return logits


@nb.njit(**_JIT)
def _shared_prompt(
    model: tuple, prompt_ids: np.ndarray, cache: tuple, work: tuple, logits: np.ndarray
) -> None:
    """The prompt every row shares, once: GPT-2's forward of its P tokens one slot at a time
    (each over the slots before, as a causal pass computes it) into row 0 of the ``cache``'s
    keys and values, then its slots copied to every row, and its last logits into each row of
    ``logits`` [n, V]."""
    keys, values = cache
    one, token, position = np.zeros(1, np.int64), np.empty(1, np.int64), np.empty(1, np.int64)
    unpadded = np.zeros((1, 0), np.float32)
    last = logits[:1]
    for j in range(prompt_ids.shape[0]):
        token[0], position[0] = prompt_ids[j], j
        last = _forward(model, (token[:1], position[:1], one[:1]), keys, values, unpadded, j, work)
    prompt = prompt_ids.shape[0]
    for layer in range(keys.shape[0]):
        for i in range(1, keys.shape[1]):
            keys[layer, i, :, :, :prompt] = keys[layer, 0, :, :, :prompt]
            values[layer, i, :, :prompt, :] = values[layer, 0, :, :prompt, :]
    for i in range(logits.shape[0]):
        logits[i] = last[0]


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
        step_logits = _forward(model, step, keys, values, key_bias, prompt + k, work)
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
    layers = range(shape.n_layer)
    blocks = tuple(
        np.stack([feeds[f"transformer.h.{layer}.{part}"] for layer in layers])
        for part in BLOCK_PARTS
    )
    model = (
        feeds["transformer.wte.weight"],
        feeds["transformer.wpe.weight"],
        blocks,
        feeds["transformer.ln_f.weight"],
        feeds["transformer.ln_f.bias"],
        np.ascontiguousarray(feeds["lm_head.weight"].T),
        np.float32(shape.eps),
        _KINDS[shape.activation],
    )
    n, vocab, columns = len(feeds["positions"]), shape.vocab, int(feeds["columns"])
    width, inner = shape.n_embd, shape.n_inner
    shared = feeds.get("prompt_ids")
    prompt = len(shared) if shared is not None else feeds["past_k0"].shape[2]
    work = (
        *(np.empty((n, size), np.float32) for size in (width, width, 3 * width, width, width)),
        np.empty((n, inner), np.float32),
        np.empty((n, vocab), np.float32),
        np.empty(prompt + columns, np.float32),
    )
    # the keys transposed ([L, n, H, D, S]: a score is an axpy over the slots), the values not
    heads, dim = shape.n_head, width // shape.n_head
    keys = np.zeros((shape.n_layer, n, heads, dim, prompt + columns), np.float32)
    values = np.zeros((shape.n_layer, n, heads, prompt + columns, dim), np.float32)
    if shared is not None:
        logits = np.empty((n, vocab), np.float32)
        _shared_prompt(model, np.asarray(shared, np.int64), (keys, values), work, logits)
    else:
        logits = feeds["logits"].copy()
        for layer in layers:
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
