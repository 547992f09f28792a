"""A tiny random Llama-shaped model on disk, fixed completions through TRL's ``rollout_func``, and
toy rewards, for the TRL integration tests (CPU, no download)."""

from __future__ import annotations

import math
import string
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from raptb.adapters.lm.models import build_char_tokenizer

MAX_COMPLETION = 6
CPU_RUN: dict[str, Any] = {
    "report_to": [],
    "bf16": False,
    "use_cpu": True,
    "disable_tqdm": True,
    "gradient_checkpointing": False,
    "max_completion_length": MAX_COMPLETION,
    "logging_steps": 1,
    "save_strategy": "no",
}
"""GFlowNetConfig fields of the CPU tests: float32, no trackers or checkpoints, logs every step."""


def write_tiny_llama(folder: Path, seed: int = 0) -> PreTrainedTokenizerBase:
    """A 2-layer Llama (width 32, grouped-query attention) over the character tokenizer, saved
    with its tokenizer in ``folder``; the tokenizer."""
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer


def abc_eos() -> tuple[int, int, int, int]:
    """The character tokenizer's ids of "a", "b", "c" and its EOS token."""
    tokenizer = build_char_tokenizer()
    a, b, c = (tokenizer.convert_tokens_to_ids(t) for t in "abc")
    return a, b, c, tokenizer.eos_token_id


def batch_rows(batch: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """A trainer batch's (prompt_ids, prompt_mask, completion_ids, completion_mask, length), the
    arguments of ``prefix_log_probs``."""
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "gfn_length")
    return tuple(batch[k] for k in keys)


def a_count_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """Toy task score in [0, 1]: the share of 'a' among the first six characters."""
    return [min(c.count("a"), MAX_COMPLETION) / MAX_COMPLETION for c in completions]


def scorable_lowercase(completions: list[str], **kwargs: Any) -> list[float | None]:
    """The share of lowercase letters; None for a completion starting with a digit and NaN for
    one starting with a punctuation mark (unscorable rows, as TRL marks them)."""
    out: list[float | None] = []
    for c in completions:
        if c[:1].isdigit():
            out.append(None)
        elif c[:1] in string.punctuation:
            out.append(math.nan)
        else:
            out.append(sum(ch.islower() for ch in c) / MAX_COMPLETION)
    return out


def b_prefix_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """Toy prefix score: 0.2 per 'b', so that prefixes without one have u_k = 0 (RapTB absorbs
    them) and the others differ."""
    return [0.2 * c.count("b") for c in completions]


def fixed_rollout(completions: dict[str, list[list[int]]]):
    """A TRL ``rollout_func`` returning, for each prompt, its next completion from
    ``completions`` (token ids as given, EOS included where a completion stops)."""
    served: dict[str, int] = {}

    def rollout(prompts: list[str], trainer: Any) -> dict[str, list[list[Any]]]:
        tokenizer = trainer.processing_class
        prompt_ids, completion_ids = [], []
        for prompt in prompts:
            i = served.get(prompt, 0)
            served[prompt] = i + 1
            prompt_ids.append(tokenizer.encode(prompt, add_special_tokens=False))
            completion_ids.append(completions[prompt][i % len(completions[prompt])])
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(c) for c in completion_ids],
        }

    return rollout
