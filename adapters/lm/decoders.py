"""The model's next-token logits of a rollout's rows in lock step (``adapters.lm.rollout``): after
their prompts, then after each row's next token, through the model's own forward and transformers'
KV cache (``ModelDecoder``) or through ``raptb.adapters.lm.embedded.lean_gpt2`` (``LeanDecoder``).
"""

from __future__ import annotations

from typing import Protocol

import torch

from raptb.adapters.lm import shared_prompts
from raptb.adapters.lm.embedded import lean_gpt2
from raptb.adapters.lm.kv_cache import cache_keyword, returned_cache
from raptb.adapters.lm.row_prompts import left_padded


class Decoder(Protocol):
    """The model's next-token logits of n rows in lock step: ``prompt_logits`` [n, V] after the
    prompts, then ``next_logits(tokens)`` [n, V] after each row's next token ``tokens`` [n]; over
    the vocabulary ids ``columns`` only ([n, C]) where that is not None."""

    prompt_logits: torch.Tensor
    columns: torch.Tensor | None

    def next_logits(self, tokens: torch.Tensor) -> torch.Tensor: ...


class ModelDecoder:
    """``Decoder`` through the model's own forward and transformers' KV cache: prompts
    left-padded (``left_padded``'s ids, attention mask 0 on pads, each row's own position ids),
    then one token a call. With ``shared``, each distinct prompt is forwarded once and its keys and
    values given to its rows (``shared_prompts.PromptPast``; not for a model sharded across
    processes, whose forwards must enter at its root); ``past``: the rows' prompts already
    forwarded (a lane's rows of the whole rollout's, ``PromptPast.of_rows``).

    columns: the vocabulary ids whose logits the caller reads (a training rollout's legal tokens
    and stop): with ``shared`` or ``past``, for a model whose head may be applied alone
    (``shared_prompts.column_head``), the decoder runs without its head and the logits are those
    columns' only (the rest of the head, a fifth of SmolLM2-135M's decoding forward, never
    computed); ``self.columns`` says whether they are (else None: the whole vocabulary)."""

    def __init__(
        self,
        model: torch.nn.Module,
        prompt_rows: list[list[int]],
        pad_id: int,
        max_length: int,
        shared: bool,
        past: shared_prompts.PromptPast | None = None,
        columns: torch.Tensor | None = None,
    ) -> None:
        self.model, self.calls = model, 0
        self.keyword = cache_keyword(model)
        self.columns = self.head = None
        if shared or past is not None:
            if past is None:
                past = shared_prompts.PromptPast(model, prompt_rows, pad_id)
            self.width, self.next_position, attention = past.width, past.next_position, past.mask
            self.cache = past.cache()
            self.prompt_logits = past.state0_logits
            if columns is not None:
                self.head = shared_prompts.column_head(model, columns)
            if self.head is not None:  # the decoder alone, then the head's ``columns``
                self.columns = columns
                self.model = shared_prompts.decoder_of(model)
                self.keyword = cache_keyword(self.model)
                self.prompt_logits = self.prompt_logits.index_select(1, columns)
            if attention is None:  # no prompt has pads
                attention = past.next_position.new_ones(len(prompt_rows), past.width)
        else:
            ids, attention, positions = left_padded(
                prompt_rows, pad_id, next(model.parameters()).device
            )
            self.width = ids.shape[1]
            out = model(
                input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True
            )
            self.cache = returned_cache(out, self.keyword)
            self.next_position = positions[:, -1:] + 1
            self.prompt_logits = out.logits[:, -1, :]
        # the prompt's mask (0 on left pads), then ones for the generated tokens
        self.attention = torch.cat([attention, attention.new_ones(len(attention), max_length)], 1)

    def next_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.attention[:, : self.width + self.calls + 1],
            position_ids=self.next_position + self.calls,
            use_cache=True,
            **{self.keyword: self.cache},
        )
        self.cache = returned_cache(out, self.keyword)
        self.calls += 1
        if self.head is not None:
            return self.head(out.last_hidden_state[:, -1, :])
        return out.logits[:, -1, :]


class LeanDecoder:
    """``Decoder`` through ``raptb.adapters.lm.embedded.lean_gpt2``, from its
    ``prompt_logits_and_past`` (a prompt shared by every row computed once)."""

    def __init__(self, model: torch.nn.Module, prompts: lean_gpt2.PromptState) -> None:
        self.model, self.columns = model, None
        self.prompt_logits, self.past, self.position, self.key_mask = prompts

    def next_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.key_mask is not None:
            self.key_mask = torch.cat([self.key_mask, self.key_mask.new_ones(len(tokens), 1)], 1)
        logits, self.past = lean_gpt2.forward(
            self.model, tokens[:, None], self.position, self.past, self.key_mask
        )
        self.position = self.position + 1
        return logits[:, -1, :]
