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

The two compiled functions are ``rescoring_kernels``' ``forward_pass`` and ``backward_pass``;
this module lays out their inputs and work arrays. ``CompiledScore`` wraps the two as a
``torch.autograd.Function`` of the model's parameters;
``log_probs`` is the entry point. Values and gradients equal transformers' ``GPT2LMHeadModel`` in
float64 up to float32 rounding, and the trainer's torch path likewise
(``tests/adapters/test_compiled_rescoring.py``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np
import torch

from raptb.adapters.lm.embedded.prompt_attention import token_positions
from raptb.adapters.lm.embedded.rescoring_kernels import backward_pass, forward_pass
from raptb.adapters.lm.embedded.weights import ACTIVATIONS, BLOCK_PARTS, KINDS


def kind(model: torch.nn.Module) -> int | None:
    """The activation's kernel code for ``model``'s MLP (``weights.KINDS``), or None when
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
