"""A toy task: one module, one ``TaskSpec``, registered by hand at import (``register_task``), as
a test or a script adds one; a package or a shipped task names its spec in a ``raptb.tasks``
entry point instead.

Texts over "ab"; S(x) = fraction of "a", every non-empty text is valid, and a text is correct
when it is all "a" (so its solution set, one text per length, is enumerable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from raptb.adapters.tasks.registry import TaskOptions, TaskSpec, register_task
from raptb.core.metrics import sequence_metrics
from raptb.core.ports import Score


class ToyOptions(TaskOptions):
    max_length: Annotated[int, Field(ge=1, description="Most generated tokens.")] = 4


@dataclass
class ToyTask:
    max_length: int = 4
    name: str = field(default="toy", init=False)
    alphabet: str = field(default="ab", init=False)
    grammar: None = field(default=None, init=False)
    min_length: int = field(default=1, init=False)

    def prompts(self) -> list[str]:
        return ["toy:"]

    def score(self, prompt: str, text: str) -> Score:
        if not text:
            return Score(0.0, False)
        return Score(text.count("a") / len(text), True)


def _metrics(task: ToyTask, rows: list[dict[str, Any]]) -> dict[str, Any]:
    all_a = sum(row["correct"] for row in rows) / len(rows)
    return {**sequence_metrics(rows, max_depth=task.max_length), "all_a": all_a}


SPEC = register_task(
    TaskSpec(
        name="toy",
        options=ToyOptions,
        build=lambda options: ToyTask(max_length=options.max_length),
        is_correct=lambda score: score.valid and score.value == 1.0,
        metrics=_metrics,
        headline=("acc", "score", "all_a"),
        subm={"similarity": "jaccard", "shingle_k": 1, "shingle_on": "text"},
        defaults={"reward": {"reward_scale": 5.0}},
        eval_samples=24,
        solutions=lambda task: ["a" * n for n in range(1, task.max_length + 1)],
    )
)
