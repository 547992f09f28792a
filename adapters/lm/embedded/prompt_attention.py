"""The rescoring's attention when every row shares one prompt, as Numba loops over the tokens.

``lean_gpt2.shared_prompt_logits`` runs the prompt's P tokens and the B rows' T tokens each in one
pass of N = P + B T tokens. Per head, query n sees:

- the prompt's keys j < P: all of them for a row's token, j <= n for a prompt token;
- its own row's keys at offsets o = 0..t back, for a row's token at position t of its row.

So every query has at most L = P + T keys, found at fixed places: prompt key j at token j, own key
at offset o at token n - o. With the tokens as the last (contiguous) axis, every product of the
attention is an axpy or a dot product over the N tokens, which LLVM vectorises:

    s[j, n] = scale q[:, n] . k[:, key(j, n)]             (scores, L x N per head)
    p[:, n] = softmax(s[:, n]) over the keys n sees       (0 elsewhere)
    y[:, n] = sum_j p[j, n] v[:, key(j, n)]

and the backward, with dp[j, n] = dy[:, n] . v[:, key(j, n)] and ds = p (dp - sum_j p dp) scale:
dq[:, n] = sum_j ds[j, n] k[:, key(j, n)], dk[:, key(j, n)] += ds[j, n] q[:, n], dv[:, key(j, n)]
+= p[j, n] dy[:, n]. The inputs are the c_attn output transposed, qkv^T [3 W, N] (an ``addmm`` of
the transposed operands gives it without a copy), the output y^T [W, N] (c_proj reads it
transposed the same way). The exponentials are torch's (``exp_`` over the L x N scores; a masked
score is set to -50, whose exponential is normal and fast, then its probability to 0).

torch's flash attention at the embedded model's shapes (881 tokens, 4 heads of 16, 17 keys) needs
the prompt's keys and values concatenated to every row's and costs 0.6-0.9 ms forward and 1-2 ms
backward per block on one CPU core, most of it per-row overhead; these loops do the same
arithmetic in one pass over the tokens (benchmarks/step_speed.md). Values and gradients equal
torch's SDPA up to float rounding (tests/adapters/test_prompt_attention.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
_MASKED = np.float32(-50.0)  # exp(-50) ~ 2e-22: a normal float, fast; its probability is set to 0


@nb.njit(cache=True, inline="always")
def _sizes(qkv: np.ndarray, heads: int, keys: int, prompt: int) -> tuple[int, int, int, int]:
    """Tokens N, head width, model width W and own keys T of qkv^T [3 W, N] with L keys."""
    dim = qkv.shape[0] // 3 // heads
    return qkv.shape[1], dim, heads * dim, keys - prompt


@nb.njit(cache=True, inline="always")
def _sees(at: np.ndarray, n: int, j: int, prompt: int) -> bool:
    """Whether query n sees key j: a prompt key j < P if n is a row's token or j <= n; own key
    j = P + o if n is a row's token at least o into its row."""
    return (at[n] >= 0 or j <= n) if j < prompt else at[n] >= j - prompt


@nb.njit(cache=True, inline="always")
def _add_scaled(out: np.ndarray, a: np.ndarray, c: np.float32) -> None:
    """out += a c over the tokens (a prompt key's or value's column, c its entry)."""
    for n in range(out.shape[0]):
        out[n] += a[n] * c


@nb.njit(cache=True, inline="always")
def _add_shifted(out: np.ndarray, a: np.ndarray, b: np.ndarray, o: int) -> None:
    """out[n] += a[n] b[n - o] for n >= o: query n's own key or value o tokens back."""
    size = out.shape[0] - o
    outs = out[o:]
    as_ = a[o:]
    bs = b[:size]
    for i in range(size):
        outs[i] += as_[i] * bs[i]


@nb.njit(cache=True, fastmath=_FASTMATH)
def _scores(
    qkv: np.ndarray, prompt: int, heads: int, scale: np.float32, at: np.ndarray, s: np.ndarray
) -> None:
    """s [H, L, N] = each head's scaled scores minus the query's largest (``_MASKED`` where the
    query does not see the key); ``at`` [N]: a row token's position in its row, -1 for the
    prompt's."""
    n_tok, dim, width, own = _sizes(qkv, heads, s.shape[1], prompt)
    keys = s.shape[1]
    top = np.empty(n_tok, np.float32)
    scaled = np.empty(n_tok, np.float32)
    for h in range(heads):
        for j in range(keys):
            s[h, j, :] = 0.0
        for d in range(dim):
            q = qkv[h * dim + d]
            k = qkv[width + h * dim + d]
            for j in range(prompt):
                _add_scaled(s[h, j], q, k[j] * scale)
            for n in range(n_tok):
                scaled[n] = q[n] * scale
            for o in range(own):
                _add_shifted(s[h, prompt + o], scaled, k, o)
        top[:] = -np.inf
        for j in range(keys):
            row = s[h, j]
            for n in range(n_tok):
                if not _sees(at, n, j, prompt):
                    row[n] = -np.inf
                top[n] = max(top[n], row[n])
        for j in range(keys):
            row = s[h, j]
            for n in range(n_tok):
                row[n] = max(row[n] - top[n], _MASKED)


@nb.njit(cache=True, fastmath=_FASTMATH)
def _mix(
    qkv: np.ndarray, prompt: int, heads: int, at: np.ndarray, p: np.ndarray, y: np.ndarray
) -> None:
    """p [H, L, N]: the exponentials, made the probabilities in place (0 where not seen);
    y [W, N] = the heads' outputs."""
    n_tok, dim, width, own = _sizes(qkv, heads, p.shape[1], prompt)
    keys = p.shape[1]
    total = np.empty(n_tok, np.float32)
    for h in range(heads):
        total[:] = 0.0
        for j in range(keys):
            row = p[h, j]
            for n in range(n_tok):
                e = row[n] if _sees(at, n, j, prompt) else np.float32(0.0)
                row[n] = e
                total[n] += e
        for n in range(n_tok):
            total[n] = np.float32(1.0) / total[n]
        for j in range(keys):
            row = p[h, j]
            for n in range(n_tok):
                row[n] *= total[n]
        for d in range(dim):
            out = y[h * dim + d]
            v = qkv[2 * width + h * dim + d]
            out[:] = 0.0
            for j in range(prompt):
                _add_scaled(out, p[h, j], v[j])
            for o in range(own):
                _add_shifted(out, p[h, prompt + o], v, o)


@nb.njit(cache=True, fastmath=_FASTMATH)
def _backward(
    qkv: np.ndarray,
    prompt: int,
    heads: int,
    scale: np.float32,
    p: np.ndarray,
    dy: np.ndarray,
    ds: np.ndarray,
    dqkv: np.ndarray,
) -> None:
    """dqkv [3 W, N] from dy [W, N] (module docstring); ds [L, N] scratch."""
    n_tok, dim, width, own = _sizes(qkv, heads, p.shape[1], prompt)
    keys = p.shape[1]
    delta = np.empty(n_tok, np.float32)
    dqkv[:, :] = 0.0
    for h in range(heads):
        # dp[j, n] = dy[:, n] . v[:, key(j, n)]
        ds[:, :] = 0.0
        for d in range(dim):
            g = dy[h * dim + d]
            v = qkv[2 * width + h * dim + d]
            for j in range(prompt):
                _add_scaled(ds[j], g, v[j])
            for o in range(own):
                _add_shifted(ds[prompt + o], g, v, o)
        delta[:] = 0.0
        for j in range(keys):
            pj = p[h, j]
            row = ds[j]
            for n in range(n_tok):
                delta[n] += pj[n] * row[n]
        for j in range(keys):
            pj = p[h, j]
            row = ds[j]
            for n in range(n_tok):
                row[n] = pj[n] * (row[n] - delta[n]) * scale
        for d in range(dim):
            q = qkv[h * dim + d]
            k = qkv[width + h * dim + d]
            g = dy[h * dim + d]
            dq = dqkv[h * dim + d]
            dk = dqkv[width + h * dim + d]
            dv = dqkv[2 * width + h * dim + d]
            # one store per loop: LLVM vectorises a loop it can prove free of overlaps
            for j in range(prompt):
                _add_scaled(dq, ds[j], k[j])
            for j in range(prompt):
                row = ds[j]
                total = np.float32(0.0)
                for n in range(n_tok):
                    total += row[n] * q[n]
                dk[j] += total
            for j in range(prompt):
                pj = p[h, j]
                total = np.float32(0.0)
                for n in range(n_tok):
                    total += pj[n] * g[n]
                dv[j] += total
            for o in range(own):
                _add_shifted(dq, ds[prompt + o], k, o)
            for o in range(own):
                row = ds[prompt + o][o:]
                qs = q[o:]
                dks = dk[: n_tok - o]
                for i in range(n_tok - o):
                    dks[i] += row[i] * qs[i]
            for o in range(own):
                pj = p[h, prompt + o][o:]
                gs = g[o:]
                dvs = dv[: n_tok - o]
                for i in range(n_tok - o):
                    dvs[i] += pj[i] * gs[i]


def token_positions(prompt: int, rows: int, width: int) -> np.ndarray:
    """``at`` [P + B T]: -1 for the prompt's tokens, then each row's 0..T-1."""
    at = np.empty(prompt + rows * width, dtype=np.int64)
    at[:prompt] = -1
    at[prompt:] = np.tile(np.arange(width), rows)
    return at


class _PromptAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        qkv_t: torch.Tensor,
        prompt: int,
        rows: int,
        heads: int,
        scale: float,
    ) -> torch.Tensor:
        qkv = qkv_t.detach().contiguous()
        n_tok = qkv.shape[1]
        width = qkv.shape[0] // 3
        length = (n_tok - prompt) // rows
        at = token_positions(prompt, rows, length)
        probs = torch.empty(heads, prompt + length, n_tok)
        out = torch.empty(width, n_tok)
        _scores(qkv.numpy(), prompt, heads, np.float32(scale), at, probs.numpy())
        torch.exp_(probs)
        _mix(qkv.numpy(), prompt, heads, at, probs.numpy(), out.numpy())
        ctx.save_for_backward(qkv, probs)
        ctx.prompt, ctx.heads, ctx.scale = prompt, heads, scale  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        qkv, probs = ctx.saved_tensors  # type: ignore[attr-defined]
        prompt, heads, scale = ctx.prompt, ctx.heads, ctx.scale  # type: ignore[attr-defined]
        dqkv = torch.empty_like(qkv)
        scratch = torch.empty(probs.shape[1], qkv.shape[1])
        dy = grad.contiguous()
        _backward(
            qkv.numpy(), prompt, heads, np.float32(scale), probs.numpy(), dy.numpy(),
            scratch.numpy(), dqkv.numpy(),
        )  # fmt: skip
        return dqkv, None, None, None, None


def prompt_attention(
    qkv_t: torch.Tensor, prompt: int, rows: int, heads: int, scale: float
) -> torch.Tensor:
    """The heads' outputs y^T [W, N] of the prompt's ``prompt`` tokens and ``rows`` rows after it,
    from the c_attn output transposed ``qkv_t`` [3 W, N] (module docstring); float32 on a CPU,
    differentiable."""
    if qkv_t.dtype != torch.float32 or qkv_t.device.type != "cpu":
        raise ValueError(
            f"prompt_attention takes float32 CPU tensors, not {qkv_t.dtype} on {qkv_t.device}"
        )
    if rows < 1 or (qkv_t.shape[1] - prompt) % rows or prompt < 1:
        raise ValueError(f"{qkv_t.shape[1]} tokens are not {prompt} and {rows} rows of one length")
    return _PromptAttention.apply(qkv_t, prompt, rows, heads, scale)
