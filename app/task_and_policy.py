"""The run's task and its constrained policy, built from the configuration, shared by training
and evaluation (the per-prefix reward they also share is app.reward's); ``pad_rows`` lays token
rows out as one tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from itertools import chain
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from raptb.adapters.lm.decode_mode import DecodeMode
from raptb.adapters.lm.lora import apply_lora, load_adapter_weights
from raptb.adapters.lm.models import load_model_and_tokenizer
from raptb.adapters.lm.policy import HFPolicy, default_grammar_threads
from raptb.adapters.lm.precision import ModelDtype, model_dtype
from raptb.adapters.lm.tokens import legal_token_ids, stop_token_id
from raptb.adapters.tasks.registry import task_spec
from raptb.app.configuration.config import LoraConfig, TinyConfig, TrainConfig
from raptb.core.ports import Task, TaskCapabilities

_log = logging.getLogger(__name__)


def build_task(config: TrainConfig) -> Task:
    """The run's task: ``config.task`` built by its registered spec from its options."""
    return task_spec(config.task).build(config.task_options())


def build_policy(
    model_name: str,
    task: Task,
    seed: int,
    *,
    lora: LoraConfig | None = None,
    adapter: Path | None = None,
    device: torch.device | None = None,
    decode: DecodeMode = "auto",
    tiny: TinyConfig | None = None,
    dtype: ModelDtype = "auto",
) -> HFPolicy:
    """The task's constrained policy on ``model_name`` ('tiny', 'smollm2-135m', a local directory
    or an HF id), on the GPU when there is one.

    lora: with ``lora.rank`` >= 1, the model is wrapped with LoRA adapters (adapters.lm.lora);
        ``adapter``, a folder written by ``save_pretrained``, then supplies their trained weights.
    device: where the model lives (a launched process's own GPU); default the GPU when there is
        one, else the CPU.
    decode: the rollout's decoding path (``sampling.decode``; ``HFPolicy``).
    tiny: the embedded model's shape when ``model_name`` is 'tiny' (default: ``TinyConfig()``).
    dtype: ``model_dtype``, resolved by ``adapters.lm.precision.model_dtype`` on ``device``
        (ValueError where refused); the model's weights load in it, LoRA adapters in float32.
    """
    torch.manual_seed(seed)
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    adapters = lora is not None and bool(lora.rank)
    model, tokenizer = load_model_and_tokenizer(
        model_name,
        seed=seed,
        dtype=model_dtype(dtype, model_name, device, lora=adapters),
        tiny_shape=(tiny or TinyConfig()).shape(),
    )
    model = model.to(device)
    if adapters:
        model = apply_lora(model, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout)
        if adapter is not None:
            load_adapter_weights(model, adapter)
    elif adapter is not None:
        raise ValueError("adapter: loading adapter weights needs lora.rank")
    capabilities = TaskCapabilities.of(task)
    stop_id = _stop_id(tokenizer, capabilities.stop)
    legal = legal_token_ids(tokenizer, task.alphabet, stop_id=stop_id)
    return HFPolicy(
        model,
        tokenizer,
        legal_ids=legal,
        stop_id=stop_id,
        grammar=task.grammar,
        automaton=capabilities.automaton,
        grammar_threads=default_grammar_threads(device),
        decode=decode,
    )


def _stop_id(tokenizer: PreTrainedTokenizerBase, stop: str | None) -> int:
    """The task's stop token (CommonGen's ".") where the tokenizer has it as one token, else EOS."""
    if stop is not None:
        try:
            return stop_token_id(tokenizer, stop)
        except ValueError:
            _log.info("stop %r is not one token of this tokenizer; stopping at EOS", stop)
    return stop_token_id(tokenizer)


def pad_rows(rows: Sequence[Sequence[int]], max_length: int, pad_id: int) -> torch.Tensor:
    """LongTensor [B, T] of token rows padded with ``pad_id``: the rows' ids in one flat array,
    written through the mask of the filled places (a copy per row, or a tensor of nested lists,
    costs more than the rest of a step's collection on a CPU)."""
    lists = [row.tolist() if isinstance(row, torch.Tensor) else row for row in rows]
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    for b in np.flatnonzero(lengths > max_length)[:1]:
        raise ValueError(f"tokens: row {b} has {lengths[b]} > max_length {max_length}")
    out = np.full((len(lists), max_length), pad_id, dtype=np.int64)
    ids = chain.from_iterable(lists)
    out[np.arange(max_length) < lengths[:, None]] = np.fromiter(ids, np.int64, int(lengths.sum()))
    return torch.from_numpy(out)
