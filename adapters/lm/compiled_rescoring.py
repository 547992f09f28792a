"""The rescoring of rows that share one prompt, forward and backward, as compiled Numba functions.

The same function as ``lean_gpt2.shared_prompt_logits`` followed by ``rollout_record.
token_log_probs`` (the log-probabilities [B, T + 1] of each row's tokens and of the stop after
each of its prefixes), and its gradient with respect to every parameter of a ``GPT2LMHeadModel``,
each computed in one call instead of torch's ~60 operations forward and ~120 backward, their
work arrays kept between calls (``_Arenas``) and their exponentials vectorised (``vector_exp``):
on the embedded model (0.1M parameters, ~880 tokens a step) the main job's step 1.07-1.08x
faster than through torch's autograd (benchmarks/step_speed.md).

The tokens are laid out as ``lean_gpt2.shared_prompt_logits`` lays them out (the prompt's P, then
the B rows' T one after another: N = P + B T) and every activation is kept transposed, [features,
N], the layout of ``prompt_attention``'s loops, which this module calls for the attention (the
same kernels, forward and backward). Per block, with the products by BLAS (``gemm.gemm``):

    x = ln_1(h);  qkv = W_a^T x + b_a;  y = attention(qkv)
    a = h + W_p^T y + b_p;  u = W_fc^T ln_2(a) + b_fc;  h' = a + W_o^T act(u) + b_o

then z = ln_f(h) at the prompt's last token and the rows' tokens, logits = W_head z, and
log p = log_softmax(logits / temperature) read at each row's next token and at the stop. The
backward is the chain rule through each of these, with the layer norms' normalised inputs, the
attention's probabilities, the activation's slope and the softmax kept from the forward.

``CompiledScore`` wraps the two as a ``torch.autograd.Function`` of the model's parameters;
``log_probs`` is the entry point. Values and gradients equal transformers' ``GPT2LMHeadModel`` in
float64 up to float32 rounding, and the trainer's torch path likewise
(``tests/adapters/test_compiled_rescoring.py``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numba as nb
import numpy as np
import torch

from raptb.adapters.lm.compiled_gpt2 import KINDS, _add, _tanh
from raptb.adapters.lm.gemm import gemm
from raptb.adapters.lm.onnx_builder import ACTIVATIONS, BLOCK_PARTS
from raptb.adapters.lm.prompt_attention import _backward as _attention_backward
from raptb.adapters.lm.prompt_attention import _mix, _scores, token_positions
from raptb.adapters.lm.vector_exp import exp32

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
_JIT = {"cache": True, "error_model": "numpy", "fastmath": _FASTMATH}
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)


@nb.njit(**_JIT)
def _layer_norm(
    h: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, xhat: np.ndarray, rs: np.ndarray,
    out: np.ndarray,
) -> None:  # fmt: skip
    """out = xhat w + b, xhat = (h - mean) rs, rs = 1 / sqrt(var + eps), over the features of
    each token of h [C, N] (xhat [C, N] and rs [N] kept for the backward)."""
    c, n = h.shape
    mean = np.zeros(n, np.float32)
    var = np.zeros(n, np.float32)
    for j in range(c):
        for i in range(n):
            mean[i] += h[j, i]
    for i in range(n):
        mean[i] /= np.float32(c)
    for j in range(c):
        for i in range(n):
            d = h[j, i] - mean[i]
            var[i] += d * d
    for i in range(n):
        rs[i] = _ONE / np.sqrt(var[i] / np.float32(c) + np.float32(eps))
    for j in range(c):
        for i in range(n):
            x = (h[j, i] - mean[i]) * rs[i]
            xhat[j, i] = x
            out[j, i] = x * w[j] + b[j]


@nb.njit(**_JIT)
def _layer_norm_backward(
    grad: np.ndarray, xhat: np.ndarray, rs: np.ndarray, w: np.ndarray, dw: np.ndarray,
    db: np.ndarray, dh: np.ndarray,
) -> None:  # fmt: skip
    """dh += the layer norm's input gradient from its output's ``grad`` [C, N]; dw, db += its
    weight's and bias's."""
    c, n = grad.shape
    m1 = np.zeros(n, np.float32)
    m2 = np.zeros(n, np.float32)
    for j in range(c):
        gw, gb = _ZERO, _ZERO
        for i in range(n):
            g = grad[j, i]
            gw += g * xhat[j, i]
            gb += g
            g = g * w[j]
            m1[i] += g
            m2[i] += g * xhat[j, i]
        dw[j] += gw
        db[j] += gb
    for i in range(n):
        m1[i] /= np.float32(c)
        m2[i] /= np.float32(c)
    for j in range(c):
        for i in range(n):
            dh[j, i] += rs[i] * (grad[j, i] * w[j] - m1[i] - xhat[j, i] * m2[i])


@nb.njit(**_JIT)
def _affine(w: np.ndarray, x: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = w^T x + b[:, None]: a Conv1D's (w [in, out]) output transposed, x [in, N]."""
    gemm(w, x, out, True, False)
    for j in range(out.shape[0]):
        for i in range(out.shape[1]):
            out[j, i] += b[j]


@nb.njit(**_JIT)
def _affine_backward(
    w: np.ndarray, x: np.ndarray, grad: np.ndarray, dw: np.ndarray, db: np.ndarray,
    dx: np.ndarray,
) -> None:  # fmt: skip
    """From out = w^T x + b's ``grad`` [out, N]: dw = x grad^T, db = its sum over the tokens,
    dx = w grad (each overwritten)."""
    gemm(x, grad, dw, False, True)
    for j in range(grad.shape[0]):
        total = _ZERO
        for i in range(grad.shape[1]):
            total += grad[j, i]
        db[j] = total
    gemm(w, grad, dx, False, False)


@nb.njit(**_JIT)
def _activate(u: np.ndarray, kind: int, out: np.ndarray, slope: np.ndarray) -> None:
    """out = act(u) and slope = act'(u) elementwise (``compiled_gpt2.KINDS``; the tanh GELU with
    ``compiled_gpt2``'s tanh)."""
    rows, n = u.shape
    if kind == 0:
        c, a = np.float32(0.7978845608028654), np.float32(0.044715)
        for j in range(rows):
            for i in range(n):
                v = u[j, i]
                t = _tanh(c * (v + a * v * v * v))
                out[j, i] = _HALF * v * (_ONE + t)
                slope[j, i] = _HALF * (_ONE + t) + _HALF * v * (_ONE - t * t) * c * (
                    _ONE + np.float32(3.0) * a * v * v
                )
    elif kind == 1:
        root_half = np.float32(0.7071067811865476)
        density = np.float32(0.3989422804014327)
        for j in range(rows):
            for i in range(n):
                v = u[j, i]
                cdf = _HALF * (_ONE + np.float32(math.erf(v * root_half)))
                out[j, i] = v * cdf
                slope[j, i] = cdf + v * density * np.exp(-_HALF * v * v)
    elif kind == 2:
        for j in range(rows):
            for i in range(n):
                v = u[j, i]
                out[j, i] = max(v, _ZERO)
                slope[j, i] = _ONE if v > _ZERO else _ZERO
    else:
        for j in range(rows):
            for i in range(n):
                v = u[j, i]
                s = _ONE / (_ONE + np.exp(-v))
                out[j, i] = v * s
                slope[j, i] = s * (_ONE + v * (_ONE - s))


@nb.njit(**_JIT)
def _readout_columns(prompt: int, batch: int, width: int) -> np.ndarray:
    """For each log-probability (b, t) [B, T + 1], its read-out column among the R = 1 + B T
    (0: the prompt's last token, for t = 0; 1 + b T + t - 1: after the row's token t - 1)."""
    cols = np.empty((batch, width + 1), np.int64)
    for b in range(batch):
        cols[b, 0] = 0
        for t in range(1, width + 1):
            cols[b, t] = 1 + b * width + t - 1
    return cols


@nb.njit(**_JIT)
def forward_pass(model: tuple, feeds: tuple, space: tuple, out: tuple) -> None:
    """The log-probabilities into ``out`` (token_lp, stop_lp [B, T + 1]), every activation the
    backward reads into ``space``'s kept arrays (``workspace``)."""
    wte, wpe, blocks, lnf_w, lnf_b, head, eps, kind, heads = model
    ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b = blocks
    ids, positions, at, prompt, next_tokens, stop, inv_temp = feeds
    kept, final, work = space
    xhat1, rs1, x1, qkv, probs, y, a, xhat2, rs2, x2, m, slope = kept
    hf, xhatf, rsf, z, soft = final
    u, h = work[0], work[1]
    token_lp, stop_lp = out
    c, n = h.shape
    for i in range(n):
        for j in range(c):
            h[j, i] = wte[ids[i], j] + wpe[positions[i], j]
    scale = np.float32((c // heads) ** -0.5)
    for layer in range(ln1_w.shape[0]):
        _layer_norm(h, ln1_w[layer], ln1_b[layer], eps, xhat1[layer], rs1[layer], x1[layer])
        _affine(attn_w[layer], x1[layer], attn_b[layer], qkv[layer])
        p = probs[layer]
        _scores(qkv[layer], prompt, heads, scale, at, p)
        for hd in range(p.shape[0]):
            for j in range(p.shape[1]):
                row = p[hd, j]
                for i in range(n):
                    row[i] = exp32(row[i])
        _mix(qkv[layer], prompt, heads, at, p, y[layer])
        _affine(proj_w[layer], y[layer], proj_b[layer], a[layer])
        _add(a[layer], h)
        _layer_norm(a[layer], ln2_w[layer], ln2_b[layer], eps, xhat2[layer], rs2[layer], x2[layer])
        _affine(fc_w[layer], x2[layer], fc_b[layer], u)
        _activate(u, kind, m[layer], slope[layer])
        _affine(out_w[layer], m[layer], out_b[layer], h)
        _add(h, a[layer])
    hf[:, :] = h[:, prompt - 1 :]
    _layer_norm(hf, lnf_w, lnf_b, eps, xhatf, rsf, z)
    gemm(head, z, soft, False, False)
    vocab, reads = soft.shape
    top = np.full(reads, -np.inf, np.float32)
    total = np.zeros(reads, np.float32)
    for v in range(vocab):
        for i in range(reads):
            soft[v, i] *= inv_temp
            top[i] = max(top[i], soft[v, i])
    for v in range(vocab):
        for i in range(reads):
            total[i] += exp32(soft[v, i] - top[i])
    for i in range(reads):
        total[i] = top[i] + np.log(total[i])  # the log-normaliser
    batch, width = next_tokens.shape[0], next_tokens.shape[1] - 1
    cols = _readout_columns(prompt, batch, width)
    for b in range(batch):
        for t in range(width + 1):
            col = cols[b, t]
            token_lp[b, t] = soft[next_tokens[b, t], col] - total[col]
            stop_lp[b, t] = soft[stop, col] - total[col]
    for v in range(vocab):
        for i in range(reads):
            soft[v, i] = exp32(soft[v, i] - total[i])  # the probabilities, for the backward


@nb.njit(**_JIT)
def backward_pass(model: tuple, feeds: tuple, space: tuple, grad: tuple, grads: tuple) -> None:
    """Every weight's gradient into ``grads`` (``gradients``; the head's into its own array) from
    the log-probabilities' gradients ``grad`` (token_lp's, stop_lp's [B, T + 1])."""
    blocks, lnf_w, head, heads = model[2], model[3], model[5], model[8]
    ln1_w, attn_w, proj_w, ln2_w, fc_w, out_w = blocks[0::2]
    ids, positions, prompt, next_tokens, stop, inv_temp = feeds[:2] + feeds[3:]
    kept, final, work = space
    xhat1, rs1, x1, qkv, probs, y = kept[:6]
    xhat2, rs2, x2, m, slope = kept[7:]
    xhatf, rsf, z, soft = final[1:]
    du, dh, dm, dx, dy, dqkv, scratch, dlogp, dz, dhf = work
    g_token, g_stop = grad
    d_wte, d_wpe, d_blocks, d_lnf_w, d_lnf_b, d_head = grads
    d_ln1_w, d_ln1_b, d_attn_w, d_attn_b, d_proj_w, d_proj_b = d_blocks[:6]
    d_ln2_w, d_ln2_b, d_fc_w, d_fc_b, d_out_w, d_out_b = d_blocks[6:]
    c, n = dh.shape
    vocab, reads = soft.shape
    batch, width = next_tokens.shape[0], next_tokens.shape[1] - 1
    cols = _readout_columns(prompt, batch, width)
    # log_softmax's backward: d logits = (g - p sum(g)) / temperature
    dlogp[:, :] = 0.0
    for b in range(batch):
        for t in range(width + 1):
            col = cols[b, t]
            dlogp[next_tokens[b, t], col] += g_token[b, t]
            dlogp[stop, col] += g_stop[b, t]
    total = np.zeros(reads, np.float32)
    for v in range(vocab):
        for i in range(reads):
            total[i] += dlogp[v, i]
    for v in range(vocab):
        for i in range(reads):
            dlogp[v, i] = (dlogp[v, i] - soft[v, i] * total[i]) * inv_temp
    gemm(dlogp, z, d_head, False, True)
    gemm(head, dlogp, dz, True, False)
    d_lnf_w[:] = 0.0
    d_lnf_b[:] = 0.0
    dhf[:, :] = 0.0
    _layer_norm_backward(dz, xhatf, rsf, lnf_w, d_lnf_w, d_lnf_b, dhf)
    dh[:, : prompt - 1] = 0.0
    dh[:, prompt - 1 :] = dhf
    scale = np.float32((c // heads) ** -0.5)
    for layer in range(ln1_w.shape[0] - 1, -1, -1):
        # h' = a + W_o^T m + b_o; m = act(u)
        _affine_backward(out_w[layer], m[layer], dh, d_out_w[layer], d_out_b[layer], dm)
        sl = slope[layer]
        for j in range(du.shape[0]):
            for i in range(n):
                du[j, i] = dm[j, i] * sl[j, i]
        _affine_backward(fc_w[layer], x2[layer], du, d_fc_w[layer], d_fc_b[layer], dx)
        d_ln2_w[layer][:] = 0.0
        d_ln2_b[layer][:] = 0.0
        _layer_norm_backward(
            dx, xhat2[layer], rs2[layer], ln2_w[layer], d_ln2_w[layer], d_ln2_b[layer], dh
        )
        # dh is now a's gradient: a = h + W_p^T y + b_p
        _affine_backward(proj_w[layer], y[layer], dh, d_proj_w[layer], d_proj_b[layer], dy)
        _attention_backward(qkv[layer], prompt, heads, scale, probs[layer], dy, scratch, dqkv)
        _affine_backward(attn_w[layer], x1[layer], dqkv, d_attn_w[layer], d_attn_b[layer], dx)
        d_ln1_w[layer][:] = 0.0
        d_ln1_b[layer][:] = 0.0
        _layer_norm_backward(
            dx, xhat1[layer], rs1[layer], ln1_w[layer], d_ln1_w[layer], d_ln1_b[layer], dh
        )
    d_wte[:, :] = 0.0
    d_wpe[:, :] = 0.0
    for i in range(n):
        for j in range(c):
            d_wte[ids[i], j] += dh[j, i]
            d_wpe[positions[i], j] += dh[j, i]


def kind(model: torch.nn.Module) -> int | None:
    """The activation's kernel code for ``model``'s MLP (``compiled_gpt2.KINDS``), or None when
    this module does not compute it."""
    name = ACTIVATIONS.get(model.config.activation_function)
    return None if name is None else KINDS[name]


def _weights(model: torch.nn.Module) -> tuple[tuple, list[torch.Tensor]]:
    """``forward_pass``'s model (NumPy views of the parameters, each block part stacked over the
    blocks) and the parameters in the order ``CompiledScore`` takes them."""
    transformer = model.transformer
    blocks = list(transformer.h)
    named = dict(model.named_parameters())
    parts = [
        [named[f"transformer.h.{i}.{part}"] for i in range(len(blocks))] for part in BLOCK_PARTS
    ]
    tied = model.lm_head.weight is transformer.wte.weight
    params = [
        transformer.wte.weight,
        transformer.wpe.weight,
        *(p for part in parts for p in part),
        transformer.ln_f.weight,
        transformer.ln_f.bias,
        *([] if tied else [model.lm_head.weight]),
    ]

    def host(p: torch.Tensor) -> np.ndarray:
        return p.detach().numpy()

    stacked = tuple(np.stack([host(p) for p in part]) for part in parts)
    arrays = (
        host(transformer.wte.weight),
        host(transformer.wpe.weight),
        stacked,
        host(transformer.ln_f.weight),
        host(transformer.ln_f.bias),
        host(model.lm_head.weight),
        np.float32(model.config.layer_norm_epsilon),
        kind(model),
        model.config.n_head,
    )
    return arrays, params


def _shapes(model: tuple, tokens: int, reads: int, keys: int) -> tuple[list, list, list]:
    """The shapes of ``workspace``'s three groups of arrays."""
    _, _, blocks, _, _, head, _, _, heads = model
    layers, c = blocks[0].shape
    inner, vocab = blocks[8].shape[2], head.shape[0]
    kept = [
        (layers, *dims)
        for dims in (
            (c, tokens), (tokens,), (c, tokens), (3 * c, tokens), (heads, keys, tokens),
            (c, tokens), (c, tokens), (c, tokens), (tokens,), (c, tokens), (inner, tokens),
            (inner, tokens),
        )
    ]  # fmt: skip
    final = [(c, reads), (c, reads), (reads,), (c, reads), (vocab, reads)]
    work = [
        (inner, tokens), (c, tokens), (inner, tokens), (c, tokens), (c, tokens),
        (3 * c, tokens), (keys, tokens), (vocab, reads), (c, reads), (c, reads),
    ]  # fmt: skip
    return kept, final, work


class _Arenas:
    """Flat float32 arrays that workspaces are cut from, kept between calls: a fresh array of a
    few megabytes is fresh pages from the kernel, and faulting them in took 2-3 ms a step, as
    long as the arithmetic they hold. One arena is out from a forward to its backward."""

    KEEP = 4
    """Arenas kept for reuse at most."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> np.ndarray:
        """A free arena of at least ``size`` floats, or a new one."""
        with self._lock:
            for i, arena in enumerate(self._free):
                if arena.size >= size:
                    return self._free.pop(i)
        return np.empty(size, np.float32)

    def give(self, arena: np.ndarray) -> None:
        """``arena`` back, for a later call."""
        with self._lock:
            self._free.append(arena)
            self._free.sort(key=lambda a: a.size)
            del self._free[: max(0, len(self._free) - self.KEEP)]


_ARENAS = _Arenas()


def workspace(model: tuple, arena: np.ndarray, tokens: int, reads: int, keys: int) -> tuple:
    """``forward_pass``'s and ``backward_pass``'s arrays for ``tokens`` tokens, ``reads`` read-out
    columns and ``keys`` keys a query, cut from ``arena`` (at least ``workspace_size`` floats):
    the activations kept per block, those of the final layer norm and the head, and the work
    arrays (the forward's residual stream and pre-activation, the backward's gradients)."""
    groups = []
    start = 0
    for shapes in _shapes(model, tokens, reads, keys):
        arrays = []
        for shape in shapes:
            size = math.prod(shape)
            arrays.append(arena[start : start + size].reshape(shape))
            start += size
        groups.append(tuple(arrays))
    return tuple(groups)


def workspace_size(model: tuple, tokens: int, reads: int, keys: int) -> int:
    """The floats ``workspace`` cuts from its arena."""
    return sum(math.prod(shape) for group in _shapes(model, tokens, reads, keys) for shape in group)


def gradients(model: tuple) -> tuple:
    """``backward_pass``'s gradient arrays, new (torch keeps them as the parameters' ``.grad``)."""
    wte, wpe, blocks, lnf_w, lnf_b, head, _, _, _ = model
    return (
        np.empty_like(wte),
        np.empty_like(wpe),
        tuple(np.empty_like(part) for part in blocks),
        np.empty_like(lnf_w),
        np.empty_like(lnf_b),
        np.empty_like(head),
    )


class CompiledScore(torch.autograd.Function):
    """(token_lp, stop_lp) [B, T + 1] of the model's parameters by ``forward_pass``, with
    ``backward_pass`` as their gradient."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, model: tuple, feeds: tuple, tied: bool,
        keep: bool, *params: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        ids, prompt, next_tokens = feeds[0], feeds[3], feeds[4]
        batch, columns = next_tokens.shape
        sizes = (ids.shape[0], 1 + batch * (columns - 1), prompt + columns - 1)
        arena = _ARENAS.take(workspace_size(model, *sizes))
        space = workspace(model, arena, *sizes)
        token_lp = torch.empty(batch, columns)
        stop_lp = torch.empty(batch, columns)
        forward_pass(model, feeds, space, (token_lp.numpy(), stop_lp.numpy()))
        if keep:
            ctx.state = (model, feeds, space, arena, tied)  # type: ignore[attr-defined]
        else:
            _ARENAS.give(arena)
        return token_lp, stop_lp

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, g_token: torch.Tensor, g_stop: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        model, feeds, space, arena, tied = ctx.state  # type: ignore[attr-defined]
        del ctx.state  # type: ignore[attr-defined]  # (one backward: the arena goes back)
        grad = tuple(
            (torch.zeros(feeds[4].shape) if g is None else g.detach().float().contiguous()).numpy()
            for g in (g_token, g_stop)
        )
        grads = gradients(model)
        backward_pass(model, feeds, space, grad, grads)
        _ARENAS.give(arena)
        d_wte, d_wpe, d_blocks, d_lnf_w, d_lnf_b, d_head = grads
        if tied:
            d_wte += d_head
        out = [d_wte, d_wpe, *(part[i] for part in d_blocks for i in range(part.shape[0]))]
        out += [d_lnf_w, d_lnf_b, *([] if tied else [d_head])]
        return (None, None, None, None, *(torch.from_numpy(g) for g in out))


MAX_PARAMETERS = 2_000_000
"""The largest model the policy scores this way: measured on the embedded one (0.11M); its loops
outside the products run on one thread, where torch spreads a large model's over its threads."""


def computes(model: torch.nn.Module) -> bool:
    """Whether ``log_probs`` computes the rescoring of ``model``, a model ``lean_gpt2.supports``:
    an activation this module computes, float32 weights on a CPU, at most ``MAX_PARAMETERS``."""
    weight = model.transformer.wte.weight
    return (
        kind(model) is not None
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and sum(p.numel() for p in model.parameters()) <= MAX_PARAMETERS
    )


def log_probs(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    body: torch.Tensor,
    next_tokens: torch.Tensor,
    stop_id: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_log_probs(shared_prompt_logits(model, prompt_ids, body), next_tokens, stop_id,
    temperature)``: (token_lp, stop_lp) [B, T + 1] of B rows sharing the prompt ``prompt_ids``
    (P >= 1 ids) followed by ``body`` [B, T] (T >= 1), read at ``next_tokens`` [B, T + 1] and at
    the stop, differentiable in the model's parameters."""
    batch, width = body.shape
    prompt = len(prompt_ids)
    ids = np.concatenate(
        [np.asarray(prompt_ids, dtype=np.int64), body.reshape(-1).numpy().astype(np.int64)]
    )
    steps = np.arange(prompt + width, dtype=np.int64)
    positions = np.concatenate([steps[:prompt], np.tile(steps[prompt:], batch)])
    feeds = (
        ids,
        positions,
        token_positions(prompt, batch, width),
        prompt,
        np.ascontiguousarray(next_tokens.numpy(), dtype=np.int64),
        int(stop_id),
        np.float32(1.0 / temperature),
    )
    arrays, params = _weights(model)
    tied = model.lm_head.weight is model.transformer.wte.weight
    keep = torch.is_grad_enabled() and any(p.requires_grad for p in params)
    return CompiledScore.apply(arrays, feeds, tied, keep, *params)
