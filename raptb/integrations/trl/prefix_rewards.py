"""Task rewards S_k of the prefixes of TRL completions, from a ``prefix_reward_func``.

``prefix_reward_func`` has TRL's reward-function signature and gets the keyword arguments TRL 1.16
gives a reward function (``GRPOTrainer._calculate_rewards``): ``prompts``, ``completions`` (here
the prefix texts; assistant messages for a conversational dataset), ``completion_ids`` (the
prefixes' token ids), the dataset's other columns, ``trainer_state``, ``log_metric`` and
``log_extra``. It is called once per generation batch on every (prompt, prefix) pair of the rows
it scores, so the lists hold one entry per pair, and:

- ``log_metric(name, value)`` is reported with the same generation batch's metrics (averaged over
  processes, as TRL's);
- ``log_extra(column, values)`` takes one value per pair; the completions table gets a column
  ``prefix <column>`` holding, for each row, the list of its prefixes' values (k = 0..tau-1;
  empty for a row not scored, e.g. a replayed one).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from transformers import PreTrainedTokenizerBase
from trl.data_utils import is_conversational

PrefixRewardFunc = Callable[..., Sequence[float]]
"""TRL's reward-function signature, ``f(prompts=..., completions=..., **kwargs) -> rewards``,
called on (prompt, prefix of a completion) pairs."""


class PrefixLogs:
    """What one ``prefix_reward_func`` call logs: scalar metrics, and per-pair extra columns."""

    def __init__(self) -> None:
        self.metrics: dict[str, list[float]] = defaultdict(list)
        self.extra: dict[str, list[Any]] = defaultdict(list)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name].append(value)

    def log_extra(self, column: str, values: list[Any]) -> None:
        self.extra[column].extend(values)

    def extra_by_row(self, pairs: Sequence[tuple[int, int]], rows: int) -> dict[str, list[list]]:
        """Each extra column as one list per row (its prefixes' values, in order)."""
        out: dict[str, list[list]] = {}
        for column, values in self.extra.items():
            if len(values) != len(pairs):
                raise ValueError(
                    f"prefix_reward_func: log_extra({column!r}) got {len(values)} values, "
                    f"expected one per prefix ({len(pairs)})"
                )
            by_row: list[list] = [[] for _ in range(rows)]
            for (b, _), value in zip(pairs, values, strict=True):
                by_row[b].append(value)
            out[column] = by_row
        return out


def prefix_scores(
    func: PrefixRewardFunc,
    tokenizer: PreTrainedTokenizerBase,
    inputs: Sequence[dict[str, Any]],
    rows: Sequence[tuple[int, ...]],
    scored: Sequence[int],
    trainer_state: Any,
    logs: PrefixLogs,
) -> tuple[list[tuple[int, int]], np.ndarray]:
    """``(pairs, S)``: the (row, k) of every prefix k < tau of the ``scored`` rows and its score
    S_k (float64); ValueError (one line) unless ``func`` returns one finite reward per pair."""
    pairs = [(b, k) for b in scored for k in range(len(rows[b]))]
    if not pairs:
        return pairs, np.zeros(0)
    prefix_ids = [list(rows[b][:k]) for b, k in pairs]
    texts: list[Any] = tokenizer.batch_decode(prefix_ids, skip_special_tokens=True)
    prompts = [inputs[b]["prompt"] for b, _ in pairs]
    if is_conversational({"prompt": prompts[0]}):
        texts = [[{"role": "assistant", "content": t}] for t in texts]
    columns = {
        key: [inputs[b][key] for b, _ in pairs]
        for key in inputs[0]
        if key not in ("prompt", "completion", "completion_ids")
    }
    values = func(
        prompts=prompts,
        completions=texts,
        completion_ids=prefix_ids,
        **columns,
        trainer_state=trainer_state,
        log_extra=logs.log_extra,
        log_metric=logs.log_metric,
    )
    scores = np.array([np.nan if v is None else float(v) for v in values])
    if scores.shape != (len(pairs),) or not np.all(np.isfinite(scores)):
        raise ValueError(
            f"prefix_reward_func: expected {len(pairs)} finite rewards, got {values!r}"
        )
    return pairs, scores


def flush_prefix_logs(
    trainer: Any, logs: PrefixLogs, pairs: Sequence[tuple[int, int]], rows: int
) -> None:
    """Report what ``prefix_reward_func`` logged with this generation batch (every process calls
    it): metrics averaged over processes into the trainer's metrics, as TRL 1.16 flushes a reward
    function's ``log_metric`` values in ``_generate_and_score_completions``, and extra columns into
    its completions table."""
    mode = "train" if trainer.model.training else "eval"
    device = trainer.accelerator.device
    for name in sorted(set(gather_object(list(logs.metrics)))):
        values = logs.metrics.get(name, [])
        local = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=device)
        total, count = trainer.accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
        trainer._metrics[mode][name].append(total / count)
    by_row = logs.extra_by_row(pairs, rows)
    for column in sorted(set(gather_object(list(by_row)))):
        values = by_row.get(column, [[] for _ in range(rows)])
        trainer._logs["extra"][f"prefix {column}"].extend(gather_object(values))
