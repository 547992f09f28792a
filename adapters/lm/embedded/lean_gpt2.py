"""GPT-2's forward in a few operations per block, on a ``GPT2LMHeadModel``'s own parameters.

For a model as small as the embedded default (2 layers, width 64, about 0.1M parameters) a
forward's time is the count of operations, not their size: transformers' forward builds a mask
and a cache object and dispatches through several wrappers per module (about 1.5 ms a call on one
CPU core, where the matrix products take 0.1-0.5 ms). This module computes the same function with
the model's modules' weights and torch's functional ops (the same ones transformers calls):

    h_0 = wte[x] + wpe[p]
    a_l = h_l + c_proj(attention(ln_1(h_l)))        softmax(q k^T / sqrt(d_head) + mask) v per head
    h_(l+1) = a_l + c_proj(act(c_fc(ln_2(a_l))))
    logits = ln_f(h_L) W_head^T

Attention runs over the keys and values of earlier calls (``past``) followed by the call's own:
query i of a call with P past columns sees key j when j <= P + i and ``key_mask[b, j]`` (0 on a
left-padded prompt's pads). Results equal transformers' to float rounding
(tests/adapters/test_lean_gpt2.py).

Three uses, each where a forward over one shared prompt would repeat it for every row:

- ``prompt_logits_and_past``: a batch's prompts, computed once when every row has the same one
  (its keys and values broadcast to the rows, its last logits the same for all), else
  left-padded together;
- ``forward``: tokens after that, a column at a time (the rollout) or all at once with
  gradients (teacher-forced rescoring of rows with different prompts);
- ``shared_prompt_logits``: a teacher-forced rescoring whose rows share one prompt, the prompt's
  tokens and all the rows' in one pass: every matrix product, layer norm and activation over the
  P + B x T tokens at once, attention split into the prompt's (causal) and the rows' (the prompt's
  keys and values broadcast to them; autograd sums their gradient over the rows). The same
  function as ``prompt_logits_and_past`` then ``forward``, in fewer operations (the main job's
  rescoring forward of 97 rows: 5.8 against 6.3 ms on one CPU core; its backward the same).

The tanh GELU of a forward with gradients on a CPU is ``tanh_gelu``'s (the same function, its
derivative kept from the forward: 2-3% of the main job's step); the attention of
``shared_prompt_logits`` with gradients on a CPU in float32 is ``prompt_attention``'s (the same
function as loops over the tokens: 10-19% of the step). Without gradients, or on a GPU, torch's
GELU and scaled-dot-product attention run: one path per device and mode.

``supports(model)`` says when it applies: a ``GPT2LMHeadModel`` (not wrapped by peft) of
self-attention blocks without dropout (so training and evaluation modes compute the same),
without activation checkpointing and with the standard attention scaling; everything else runs
through transformers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from raptb.adapters.lm.embedded.prompt_attention import prompt_attention
from raptb.adapters.lm.embedded.tanh_gelu import applies, tanh_gelu
from raptb.adapters.lm.row_prompts import left_padded

KeyValues = list[tuple[torch.Tensor, torch.Tensor]]
"""Per block: keys and values [B, H, S, D] of the columns computed so far."""
PromptState = tuple[torch.Tensor, KeyValues, torch.Tensor, torch.Tensor | None]
"""``prompt_logits_and_past``'s: last logits [B, V], past, next positions [B, 1], key mask."""


def supports(model: torch.nn.Module) -> bool:
    """Whether ``forward`` computes ``model``'s own function (module docstring)."""
    from transformers import GPT2LMHeadModel

    if type(model) is not GPT2LMHeadModel:
        return False
    config = model.config
    dropout = (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop)
    return (
        not any(dropout)
        and config.scale_attn_weights
        and not config.scale_attn_by_inverse_layer_idx
        and not config.reorder_and_upcast_attn
        and not config.add_cross_attention
        and not _checkpointing(model)
        and isinstance(model.transformer.wpe, torch.nn.Embedding)
    )


def _checkpointing(model: torch.nn.Module) -> bool:
    """Whether activation checkpointing is on (transformers 5's name, else 4's)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _conv1d(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' ``Conv1D``: x W + b over the last dimension (W: [in, out])."""
    out = torch.addmm(layer.bias, x.reshape(-1, x.shape[-1]), layer.weight)
    return out.view(*x.shape[:-1], -1)


def _layer_norm(norm: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(h, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _mlp(block: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The block's second residual branch: c_proj(act(c_fc(ln_2(h)))), the activation by
    ``tanh_gelu`` where it ``applies``."""
    mlp = block.mlp
    inner = _conv1d(mlp.c_fc, _layer_norm(block.ln_2, h))
    return _conv1d(mlp.c_proj, tanh_gelu(inner) if applies(mlp.act, inner) else mlp.act(inner))


def forward(
    model: torch.nn.Module,
    ids: torch.Tensor,
    positions: torch.Tensor,
    past: KeyValues | None = None,
    key_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, KeyValues]:
    """Logits [B, S, V] of tokens ``ids`` [B, S] at ``positions`` [B, S] after the ``past``
    columns (whose keys and values may be broadcast over B), and the keys and values of all
    columns. ``key_mask``: bool [B, P + S], False on columns no query may see (pads); None: all
    visible. Causality within the call is always applied. The tanh GELU by ``tanh_gelu`` where
    it applies (with gradients, on a CPU; module docstring)."""
    transformer = model.transformer
    config = model.config
    heads = config.n_head
    scale = (config.n_embd // heads) ** -0.5  # scale_attn_weights, as supports() requires
    batch, width = ids.shape
    seen = 0 if past is None else past[0][0].shape[2]
    mask = None
    if width > 1:
        rows = torch.arange(width, device=ids.device)[:, None] + seen
        mask = rows >= torch.arange(seen + width, device=ids.device)[None, :]
    if key_mask is not None:
        visible = key_mask[:, None, None, :]
        mask = visible if mask is None else visible & mask
    elif mask is not None:
        mask = mask[None, None]
    h = transformer.wte(ids) + transformer.wpe(positions)
    present: KeyValues = []
    for index, block in enumerate(transformer.h):
        attention = block.attn
        q, k, v = _conv1d(attention.c_attn, _layer_norm(block.ln_1, h)).split(
            attention.split_size, dim=2
        )
        q, k, v = (t.view(batch, width, heads, -1).transpose(1, 2) for t in (q, k, v))
        if past is not None:
            past_k, past_v = past[index]
            k = torch.cat([past_k.expand(batch, -1, -1, -1), k], dim=2)
            v = torch.cat([past_v.expand(batch, -1, -1, -1), v], dim=2)
        present.append((k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        h = h + _conv1d(attention.c_proj, y.transpose(1, 2).reshape(batch, width, -1))
        h = h + _mlp(block, h)
    return F.linear(_layer_norm(transformer.ln_f, h), model.lm_head.weight), present


def prompt_logits_and_past(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
) -> PromptState:
    """The prompts of B rows: the logits [B, V] at each row's last prompt token (the first
    action's), the keys and values of the prompt columns, each row's next position [B, 1], and the
    key mask of the prompt columns (bool [B, P], None when no row is padded).

    Rows with one shared prompt compute it once (1 row, broadcast: the logits are an expanded
    view, the keys and values [1, H, P, D]); otherwise they are left-padded to the longest
    (``raptb.adapters.lm.row_prompts.left_padded``)."""
    batch = len(prompt_ids)
    shared = all(row == prompt_ids[0] for row in prompt_ids)
    ids, mask, positions = left_padded(prompt_ids[:1] if shared else prompt_ids, pad_id, device)
    padded = not shared and not bool(mask.all())
    key_mask = mask.bool() if padded else None
    logits, past = forward(model, ids, positions, key_mask=key_mask)
    last = logits[:, -1, :]
    following = positions[:, -1:] + 1
    if shared:
        return last.expand(batch, -1), past, following.expand(batch, -1), None
    return last, past, following, key_mask


def _split_attention(
    attention: torch.nn.Module,
    x: torch.Tensor,
    seen: int,
    batch: int,
    heads: int,
    scale: float,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """``shared_prompt_logits``' attention by torch's SDPA: the heads' outputs [N, W] of the
    prompt's ``seen`` tokens (causal) and the ``batch`` rows after it (the prompt's keys and
    values broadcast to each row's own, under ``mask``) from the block's input ``x`` [N, W]."""
    width = (x.shape[0] - seen) // batch
    q, k, v = _conv1d(attention.c_attn, x).split(attention.split_size, dim=1)
    # [1, H, P, D] for the prompt, [B, H, T, D] for the rows
    qp, kp, vp = (t[:seen].view(1, seen, heads, -1).transpose(1, 2) for t in (q, k, v))
    qb, kb, vb = (t[seen:].view(batch, width, heads, -1).transpose(1, 2) for t in (q, k, v))
    yp = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale)
    kb = torch.cat([kp.expand(batch, -1, -1, -1), kb], dim=2)
    vb = torch.cat([vp.expand(batch, -1, -1, -1), vb], dim=2)
    yb = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
    return torch.cat(
        [yp.transpose(1, 2).reshape(seen, -1), yb.transpose(1, 2).reshape(-1, x.shape[1])]
    )


def shared_prompt_logits(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    body: torch.Tensor,
) -> torch.Tensor:
    """Logits [B, T + 1, V] of B rows that share the prompt ``prompt_ids`` (P ids, positions 0..P-1)
    followed by each row's tokens ``body`` [B, T] (positions P..P+T-1): column 0 after the prompt
    (the first action's, the same for every row), column t + 1 after the row's t + 1 tokens.
    With gradients on a CPU in float32, the attention by ``prompt_attention`` (the same function,
    Numba loops over the tokens), else by torch's SDPA."""
    transformer = model.transformer
    config = model.config
    heads = config.n_head
    scale = (config.n_embd // heads) ** -0.5  # scale_attn_weights, as supports() requires
    batch, width = body.shape
    device = body.device
    prompt = torch.as_tensor(list(prompt_ids), dtype=body.dtype, device=device)
    seen = prompt.shape[0]
    # the prompt's tokens, then the rows' one after another: [N = P + B T]
    ids = torch.cat([prompt, body.reshape(-1)])
    steps = torch.arange(seen + width, device=device)
    positions = torch.cat([steps[:seen], steps[seen:].repeat(batch)])
    h = transformer.wte(ids) + transformer.wpe(positions)
    tokens = h.requires_grad and h.dtype == torch.float32 and h.device.type == "cpu"
    # else: a row's query t sees the prompt and its own tokens up to t
    mask = None if tokens else (steps[seen:, None] >= steps[None, :])[None, None]
    for block in transformer.h:
        attention = block.attn
        x = _layer_norm(block.ln_1, h)
        if tokens:
            # c_attn's output and c_proj's input transposed ([3 W, N], [W, N]) by the products
            qkv = torch.addmm(attention.c_attn.bias[:, None], attention.c_attn.weight.t(), x.t())
            y = prompt_attention(qkv, seen, batch, heads, scale)
            h = h + torch.addmm(attention.c_proj.bias, y.t(), attention.c_proj.weight)
        else:
            y = _split_attention(attention, x, seen, batch, heads, scale, mask)
            h = h + _conv1d(attention.c_proj, y)
        h = h + _mlp(block, h)
    # only the prompt's last token and the rows' tokens are read out
    h = _layer_norm(transformer.ln_f, h[seen - 1 :])
    logits = F.linear(h, model.lm_head.weight)
    first = logits[:1].expand(batch, -1)[:, None, :]
    return torch.cat([first, logits[1:].view(batch, width, -1)], dim=1)
