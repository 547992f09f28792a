"""Rows forwarded against their prompts' keys and values, each distinct prompt forwarded once, and
the output head applied only where a log-probability is read: the rescoring, the reference pass
and the rollout's prefill of a model that ``lean_gpt2`` does not run (a pretrained one).

Row b is prompt ids ``rows[b]`` followed by its tokens ``body[b]``. Forwarding ``cat([prompt,
body])`` for every row (the model's own forward, ``rescoring.model_logits``) repeats the prompt's
work for every row that shares it, and transformers' head turns every position's hidden state
into logits over the whole vocabulary, the prompt's too. Here instead:

1. the distinct prompts, left-padded together (``row_prompts.left_padded``: mask 0 on the pads,
   each prompt's own positions), go through the model's decoder once, with the KV cache;
2. each row takes its prompt's keys and values (``index_select`` over the distinct prompts, whose
   backward sums the rows' gradients into the prompt's: with gradients on, they flow through the
   cached keys and values to the LoRA weights of the prompt's positions) and its body is
   forwarded against them, the attention mask 0 on its prompt's pads and the positions counting on
   from its prompt's last;
3. the head is applied to the last layer's hidden state of the states a caller reads only: the
   prompt's last position (state 0, shared by the prompt's rows) and each row's body positions up
   to its stop (state k+1 after k+1 tokens, for k < length); and where a caller reads some of
   the vocabulary only (a training rollout draws from its legal tokens and the stop), to those
   columns only (``column_head``).

The same function as the model's own forward over the concatenation, up to float rounding
(tests/adapters/test_shared_prompts.py, against that forward, on Llama-, Qwen2- and GPT-2-shaped
models with LoRA adapters). Under dropout (a LoRA adapter's, in training mode) the rows of a prompt
share its positions' dropout mask: each row's distribution is the same as forwarded alone, and the
rows' draws are correlated there.

The head alone is applied where ``HEAD_ONLY`` names the model's class (its logits are
``lm_head(last hidden state)``, nothing more); another model runs its own forward on the bodies
(still against the shared prompts' cache), whose logits the caller reads at the same states.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from raptb.adapters.lm.kv_cache import cache_keyword, returned_cache
from raptb.adapters.lm.rollout_record import token_log_probs
from raptb.adapters.lm.row_prompts import left_padded

HEAD_ONLY = ("LlamaForCausalLM", "Qwen2ForCausalLM", "GPT2LMHeadModel")
"""Causal LMs whose logits are their output embeddings applied to the decoder's last hidden state
(no soft-capping, scaling or bias beyond the head's own): the decoder runs alone, the head where
it is read. Others run their own forward (logits at every body position)."""


def column_head(
    model: torch.nn.Module, columns: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The logits [..., C] over vocabulary ids ``columns`` [C] only, of last hidden states
    [..., H]: the rows ``columns`` of ``model``'s output embedding (gathered now, so call it again
    after the weights change), for a ``head_only`` model whose head is a plain linear layer; None
    for another model, or a head with adapters (a LoRA on it), whose logits need the whole head."""
    if not head_only(model):
        return None
    head = _base(model).get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return None
    weight = head.weight.index_select(0, columns)
    bias = None if head.bias is None else head.bias.index_select(0, columns)
    return partial(F.linear, weight=weight, bias=bias)


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder of ``model`` (a ``head_only`` one), which runs without the head."""
    return _base(model).get_decoder()


def _base(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def head_only(model: torch.nn.Module) -> bool:
    """Whether ``model``'s decoder runs alone and its head applies where read (``HEAD_ONLY``)."""
    return type(_base(model)).__name__ in HEAD_ONLY


class PromptPast:
    """The distinct prompts of a batch's rows forwarded once: each row's keys and values, its
    attention mask over them (None where no prompt has pads), its next position, and the logits
    after its prompt (state 0)."""

    def __init__(self, model: torch.nn.Module, rows: Sequence[Sequence[int]], pad_id: int) -> None:
        device = next(model.parameters()).device
        index_of: dict[tuple[int, ...], int] = {}
        group = [index_of.setdefault(tuple(row), len(index_of)) for row in rows]
        ids, mask, positions = left_padded(list(index_of), pad_id, device)
        self.model = model
        self.head_only = head_only(model)
        self.runner = decoder_of(model) if self.head_only else model
        self.keyword = cache_keyword(self.runner)
        padded = not bool(mask.all())
        out = self.runner(
            input_ids=ids,
            attention_mask=mask if padded else None,
            position_ids=positions,
            use_cache=True,
        )
        self.group = torch.tensor(group, dtype=torch.long, device=device)
        self.one = len(index_of) == 1
        """Whether every row has the same prompt (its keys and values broadcast, not copied)."""
        last = self.head(out.last_hidden_state[:, -1]) if self.head_only else out.logits[:, -1]
        self.state0_logits = self.rows_of(last)
        """[B, V]: each row's logits after its prompt (each distinct prompt's computed once)."""
        self.layers = [
            (self.rows_of(k), self.rows_of(v))
            for k, v in _key_values(returned_cache(out, self.keyword))
        ]
        self.mask = self.rows_of(mask) if padded else None
        self.next_position = self.rows_of(positions[:, -1:]) + 1
        self.width = ids.shape[1]
        """Columns of the left-padded prompts."""

    def rows_of(self, values: torch.Tensor) -> torch.Tensor:
        """Per-prompt ``values`` [G, ...] as per-row [B, ...] (gradients summed back over rows)."""
        if self.one:
            return values.expand(len(self.group), *values.shape[1:])
        return values.index_select(0, self.group)

    def of_rows(self, rows: range) -> PromptPast:
        """The same past for ``rows`` of the batch only (views: nothing forwarded again)."""
        part, cut = copy.copy(self), slice(rows.start, rows.stop)
        part.group = self.group[cut]
        part.state0_logits = self.state0_logits[cut]
        part.layers = [(keys[cut], values[cut]) for keys, values in self.layers]
        part.mask = None if self.mask is None else self.mask[cut]
        part.next_position = self.next_position[cut]
        return part

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (for a rollout lane's process, ``lane_process``) without the model, which the
        receiver has: it reads the keys, values, mask, positions and state-0 logits only."""
        return {**self.__dict__, "model": None, "runner": None}

    def cache(self) -> DynamicCache:
        """A fresh cache holding every row's prompt keys and values (a forward extends it)."""
        cache = DynamicCache()
        for layer, (keys, values) in enumerate(self.layers):
            cache.update(keys, values, layer)
        return cache

    def forward(self, body: torch.Tensor, cache: Any, mask: torch.Tensor | None) -> Any:
        """The runner's output on tokens ``body`` [B, S] after ``cache`` (``mask``: the attention
        mask over the cache's and these columns, None for all ones)."""
        first = self.next_position + (cache.get_seq_length() - self.width)
        return self.runner(
            input_ids=body,
            attention_mask=mask,
            position_ids=first + torch.arange(body.shape[1], device=body.device)[None, :],
            use_cache=True,
            **{self.keyword: cache},
        )

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] of hidden states [..., H] (``head_only`` models)."""
        return _base(self.model).get_output_embeddings()(hidden)


def _key_values(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values) [G, H, P, D] of a returned cache (transformers 5's layers, 4's
    lists, or the legacy tuples)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache, strict=True))
    return [(k, v) for k, v in cache]


def read_log_probs(
    model: torch.nn.Module,
    rows: Sequence[Sequence[int]],
    body: torch.Tensor,
    length: torch.Tensor,
    pad_id: int,
    stop_id: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_lp, stop_lp)`` [B, T + 1] of rows ``rows[b]`` + ``body[b]`` (``body`` [B, T], any
    id after a row's stop): at each state k <= length[b] the log-softmax of the logits /
    ``temperature`` (``token_log_probs``) at the next token (``body[b, k]``, the stop at k = T)
    and at ``stop_id``; 0 at the states after a row's stop, whose logits are never computed."""
    past = PromptPast(model, rows, pad_id)
    b, big_t = body.shape
    first_lp, first_stop = token_log_probs(
        past.state0_logits,
        body[:, 0] if big_t else torch.full_like(length, stop_id),
        stop_id,
        temperature,
    )
    span = int(length.max())  # the columns after every row's stop are never read
    token_lp = first_lp[:, None]
    stop_lp = first_stop[:, None]
    if span:
        mask = None
        if past.mask is not None:
            mask = torch.cat([past.mask, past.mask.new_ones(b, span)], dim=1)
        out = past.forward(body[:, :span], past.cache(), mask)
        # state k + 1 (after token k) is read where k < length
        read = torch.arange(span, device=body.device)[None, :] < length[:, None]
        chosen = out.last_hidden_state[read] if past.head_only else out.logits[read]
        logits = past.head(chosen) if past.head_only else chosen
        following = torch.cat([body, torch.full_like(body[:, :1], stop_id)], dim=1)[:, 1 : span + 1]
        lp, stop = token_log_probs(logits, following[read], stop_id, temperature)
        zeros = torch.zeros(read.shape, dtype=lp.dtype, device=lp.device)
        token_lp = torch.cat([token_lp, zeros.masked_scatter(read, lp)], dim=1)
        stop_lp = torch.cat([stop_lp, zeros.masked_scatter(read, stop)], dim=1)
    rest = big_t + 1 - token_lp.shape[1]
    return F.pad(token_lp, (0, rest)), F.pad(stop_lp, (0, rest))
