"""The completions table GFlowNetTrainer logs (``log_completions=True``): the rows it trained.

TRL's ``GRPOTrainer`` keeps, per generation batch, the generated prompts and completions, each
reward function's value and GRPO's advantage (``_logs``, filled in
``_generate_and_score_completions``), and at each log prints a sample of them (rich), writes them
to ``output_dir/completions/completions_{step:05d}.parquet`` and to wandb / trackio (``log``,
TRL 1.16.0). GFlowNetTrainer keeps TRL's rows but shows what the loss trained on:

- prompt and completion as trained: the rendered prompt text and the completion's text (a
  replayed row shows its stored prompt and completion, not the generated one it replaced);
- each reward function's column, NaN on replayed rows (they were not scored this step), and TRL's
  ``log_extra`` columns, None there;
- instead of the advantage, the GFlowNet quantities: ``replayed`` (bool), ``reward`` (S, the
  weighted sum of the reward functions; a replayed row's stored S; NaN when unscorable),
  ``log_R`` (the terminal log-reward the loss used) and ``log_pi`` (log P_F(completion + stop |
  prompt) under the policy that generated the batch, untempered; one no-grad forward per
  generation batch, only while completions are logged).
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from accelerate.utils import gather_object
from transformers.utils import is_rich_available
from trl.trainer.utils import print_prompt_completions_sample

from raptb.core.replay import ReplayItem
from raptb.integrations.trl.replay import ReplayDraw

GFLOWNET_COLUMNS = ("replayed", "reward", "log_R", "log_pi")


def record_trained_rows(
    logs: dict[str, Any],
    maxlen: int,
    draw: ReplayDraw,
    generated: tuple[Sequence[str], Sequence[str], np.ndarray],
    log_r: Sequence[float],
    log_pi: Sequence[float],
) -> None:
    """Overwrite the rows TRL has just appended to ``logs`` (its ``_logs``) with this process's
    trained rows, gathered over processes, and append the GFlowNet columns.

    generated: each row's prompt text, trained completion text and summed reward S (NaN when
        unscorable); the ``draw``'s rows take their stored item's prompt and S.
    log_r, log_pi: each row's terminal log-reward and log P_F(completion + stop | prompt).
    """
    prompts, completions, rewards = generated
    stored = dict(zip(draw.rows, draw.items, strict=True))
    rows = range(len(prompts))
    every = {
        "prompt": [stored[b].prompt if b in stored else prompts[b] for b in rows],
        "completion": list(completions),
        "replayed": [b in stored for b in rows],
        "reward": [_stored_score(stored[b]) if b in stored else float(rewards[b]) for b in rows],
        "log_R": [float(v) for v in log_r],
        "log_pi": [float(v) for v in log_pi],
    }
    every = {name: gather_object(values) for name, values in every.items()}
    n = len(every["prompt"])
    for name in ("prompt", "completion"):
        _replace_tail(logs[name], every[name])
    marked = every["replayed"]
    for column in logs["rewards"].values():
        tail = list(column)[-n:]
        _replace_tail(column, [float("nan") if r else v for v, r in zip(tail, marked, strict=True)])
    for column in logs["extra"].values():
        tail = list(column)[-n:]
        _replace_tail(column, [None if r else v for v, r in zip(tail, marked, strict=True)])
    gflownet = logs.setdefault("gflownet", defaultdict(lambda: deque(maxlen=maxlen)))
    for name in GFLOWNET_COLUMNS:
        gflownet[name].extend(every[name])


def _stored_score(item: ReplayItem) -> float:
    return float("nan") if item.score is None else item.score


def _replace_tail(column: deque, values: list[Any]) -> None:
    for _ in values:
        column.pop()
    column.extend(values)


def log_completions(trainer: Any) -> None:
    """TRL 1.16's completion logging (``GRPOTrainer.log``) with the GFlowNet columns in place of
    the advantage; on the main process only."""
    logs, step = trainer._logs, trainer.state.global_step
    gflownet = {name: list(logs.get("gflownet", {}).get(name, ())) for name in GFLOWNET_COLUMNS}
    extra = {**gflownet, **{k: list(v) for k, v in logs["extra"].items()}}
    rewards = {k: list(v) for k, v in logs["rewards"].items()}
    if is_rich_available():
        print_prompt_completions_sample(
            list(logs["prompt"]),
            list(logs["completion"]),
            rewards,
            None,
            step,
            trainer.num_completions_to_print,
            extra=extra,
        )
    table = pd.DataFrame(
        {
            "step": [step] * len(logs["prompt"]),
            "prompt": list(logs["prompt"]),
            "completion": list(logs["completion"]),
            **rewards,
            **extra,
        }
    )
    folder = os.path.join(trainer.args.output_dir, "completions")
    table.to_parquet(os.path.join(folder, f"completions_{step:05d}.parquet"))
    report_to = trainer.args.report_to or []
    backends = []
    if "wandb" in report_to:
        import wandb

        if wandb.run is not None:
            backends.append(wandb)
    if "trackio" in report_to:
        import trackio

        backends.append(trackio)
    if trainer.log_unique_prompts:
        table = table[~table["prompt"].astype(str).duplicated()]
    for backend in backends:
        backend.log({"completions": backend.Table(dataframe=table)})
