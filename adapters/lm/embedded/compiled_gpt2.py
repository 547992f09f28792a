"""GPT-2's forward for a rollout's running rows, as compiled Numba functions on NumPy arrays.

``rollout_kernels``' column calls ``forward`` for the rows that moved: the layer
norms, the products by BLAS (``gemm.gemm``), attention per row and head over each row's keys and
values (the prompt's slots under an additive ``key_bias``, 0 or -inf on a left-padded prompt's
pads), the activation (the tanh GELU with ONNX Runtime's own rational tanh, MLAS's), the head.
``shared_prompt`` runs a prompt every row shares through it once, one slot at a time, and copies
its keys and values to every row. The weights are a ``GPT2LMHeadModel``'s, as ``weights.packed``
lays them out; the keys and values are ``cache``'s arrays, the keys transposed so that a query's
scores are an axpy over the slots.

The same function as transformers' GPT2LMHeadModel up to float rounding
(``tests/adapters/test_compiled_rollout.py``, through the rollout, against the eager reference
rollout).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from raptb.adapters.lm.embedded.gemm import gemm
from raptb.adapters.lm.embedded.weights import GPT2Shape

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
    """The MLP's activation in place on x [m, inner] (``weights.KINDS``)."""
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
    gemm(x, w, out, False, False)
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
def forward(
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
    gemm(x, head, logits, False, False)
    return logits


@nb.njit(**_JIT)
def shared_prompt(
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
        last = forward(model, (token[:1], position[:1], one[:1]), keys, values, unpadded, j, work)
    prompt = prompt_ids.shape[0]
    for layer in range(keys.shape[0]):
        for i in range(1, keys.shape[1]):
            keys[layer, i, :, :, :prompt] = keys[layer, 0, :, :, :prompt]
            values[layer, i, :, :prompt, :] = values[layer, 0, :, :prompt, :]
    for i in range(logits.shape[0]):
        logits[i] = last[0]


def cache(shape: GPT2Shape, rows: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Zeroed keys [L, n, H, D, S] (transposed: a score is an axpy over the slots) and values
    [L, n, H, S, D] for ``rows`` rows of ``slots`` slots."""
    heads, dim = shape.n_head, shape.n_embd // shape.n_head
    keys = np.zeros((shape.n_layer, rows, heads, dim, slots), np.float32)
    values = np.zeros((shape.n_layer, rows, heads, slots, dim), np.float32)
    return keys, values


def work(shape: GPT2Shape, rows: int, slots: int) -> tuple:
    """``forward``'s buffers for up to ``rows`` rows over ``slots`` slots."""
    width = shape.n_embd
    return (
        *(np.empty((rows, size), np.float32) for size in (width, width, 3 * width, width, width)),
        np.empty((rows, shape.n_inner), np.float32),
        np.empty((rows, shape.vocab), np.float32),
        np.empty(slots, np.float32),
    )
