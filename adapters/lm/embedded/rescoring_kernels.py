"""The compiled kernels of the rescoring (``compiled_rescoring``): GPT-2's forward over the
prompt's and the rows' tokens with every activation the backward reads kept (``forward_pass``),
and the chain rule back through it to every weight (``backward_pass``), in Numba.

Every activation is transposed, [features, N] with N = P + B T tokens (the prompt's, then the
rows'), the layout of ``prompt_attention``'s loops, whose kernels compute the attention; the
products go through BLAS (``gemm.gemm``), the exponentials through ``vector_exp.exp32``.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from raptb.adapters.lm.embedded.compiled_gpt2 import _add, _tanh
from raptb.adapters.lm.embedded.gemm import gemm
from raptb.adapters.lm.embedded.prompt_attention import _backward as _attention_backward
from raptb.adapters.lm.embedded.prompt_attention import _mix, _scores
from raptb.adapters.lm.embedded.vector_exp import exp32

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
    """out = act(u) and slope = act'(u) elementwise (``weights.KINDS``; the tanh GELU with
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
