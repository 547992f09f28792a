"""The run's replay buffer: none, one of the configured kind, or the Oracle buffer filled once
with the task's enumerated solutions (tokenised, scored like rollouts, stored as replay items)."""

from __future__ import annotations

from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.tasks.registry import task_spec
from raptb.app.configuration.config import ConfigError, TrainConfig
from raptb.app.reward.prefix import PrefixScorer
from raptb.app.training.gflownet.replay_items import replay_items
from raptb.core.ports import Task
from raptb.core.replay import NO_REPLAY, ReplayBuffer, ReplayItem, buffer_class, make_buffer


def build_buffer(
    config: TrainConfig, task: Task, policy: HFPolicy, scorer: PrefixScorer
) -> ReplayBuffer | None:
    """The buffer of ``config.replay.kind`` (None for 'none'); an oracle kind filled with the
    task's solutions (ConfigError on a task whose solutions cannot be enumerated)."""
    kind = config.replay.kind
    if kind == NO_REPLAY:
        return None
    if buffer_class(kind).oracle:
        return make_buffer(kind, items=oracle_items(config, task, policy, scorer))
    return make_buffer(kind, **config.replay.buffer_kwargs())


def oracle_items(
    config: TrainConfig, task: Task, policy: HFPolicy, scorer: PrefixScorer
) -> list[ReplayItem]:
    """Every enumerated solution of ``task`` for its first prompt, as a scored replay item."""
    solutions = task_spec(config.task).solutions
    if solutions is None:
        raise ConfigError(
            f"replay {config.replay.kind!r} needs an enumerable task, not {config.task!r}"
        )
    prompt = task.prompts()[0]
    encode = policy.tokenizer
    rows = [tuple(encode.encode(text, add_special_tokens=False)) for text in solutions(task)]
    texts = [scorer.texts(tokens)[-1] for tokens in rows]
    scored = scorer.score_rows(prompt, rows, task.max_length, texts)
    return replay_items(task, prompt, rows, texts, scored, range(len(rows)), scored.u)
