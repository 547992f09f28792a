"""Task rewards S_k of the prefixes of TRL completions, from a ``prefix_reward_func``.

``prefix_reward_func`` has TRL's reward-function signature and is called once per generation
batch on every (prompt, prefix) pair of the rows it scores: ``prompts`` and ``completions`` (the
prefix texts; assistant messages for a conversational dataset), the dataset's other columns
repeated per pair, as TRL repeats them for its reward functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase
from trl.data_utils import is_conversational

PrefixRewardFunc = Callable[..., Sequence[float]]
"""TRL's reward-function signature, ``f(prompts=..., completions=..., **columns) -> rewards``,
called on (prompt, prefix of a completion) pairs."""


def prefix_scores(
    func: PrefixRewardFunc,
    tokenizer: PreTrainedTokenizerBase,
    inputs: Sequence[dict[str, Any]],
    rows: Sequence[tuple[int, ...]],
    scored: Sequence[int],
) -> tuple[list[tuple[int, int]], np.ndarray]:
    """``(pairs, S)``: the (row, k) of every prefix k < tau of the ``scored`` rows and its score
    S_k (float64); ValueError (one line) unless ``func`` returns one finite reward per pair."""
    pairs = [(b, k) for b in scored for k in range(len(rows[b]))]
    if not pairs:
        return pairs, np.zeros(0)
    texts: list[Any] = tokenizer.batch_decode(
        [rows[b][:k] for b, k in pairs], skip_special_tokens=True
    )
    prompts = [inputs[b]["prompt"] for b, _ in pairs]
    if is_conversational({"prompt": prompts[0]}):
        texts = [[{"role": "assistant", "content": t}] for t in texts]
    columns = {
        key: [inputs[b][key] for b, _ in pairs]
        for key in inputs[0]
        if key not in ("prompt", "completion", "completion_ids")
    }
    values = func(prompts=prompts, completions=texts, **columns)
    scores = np.array([np.nan if v is None else float(v) for v in values])
    if scores.shape != (len(pairs),) or not np.all(np.isfinite(scores)):
        raise ValueError(
            f"prefix_reward_func: expected {len(pairs)} finite rewards, got {values!r}"
        )
    return pairs, scores
