"""Custom tasks in the task registry: the ``[custom]`` section naming the reward function."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from raptb.adapters.tasks.custom.task import CustomTask
from raptb.adapters.tasks.dotted_path import CallablePath
from raptb.adapters.tasks.registry import TaskOptions, TaskSpec
from raptb.adapters.tasks.subm_presets import STRING_SUBM
from raptb.core.metrics import sequence_metrics


class CustomOptions(TaskOptions):
    """The ``[custom]`` config section: a user task whose reward function is named by path."""

    reward: CallablePath | None = Field(
        None,
        description="'module:function' taking (prompt, text) and returning a score "
        "(see adapters.tasks.custom.task); the module is looked up in the current directory "
        "first, then on PYTHONPATH.",
    )
    alphabet: str | None = Field(
        None, description="Characters generated tokens may use; None allows every token."
    )
    grammar_file: Path | None = Field(
        None,
        description="EBNF (xgrammar dialect) the generated text must follow; None: no grammar.",
    )
    min_length: Annotated[int, Field(ge=0, description="Fewest generated tokens.")] = 1
    max_length: Annotated[int, Field(ge=1, description="Most generated tokens.")] = 20
    prompts: list[str] = Field([""], description="Prompts training cycles through.")


def _build(options: CustomOptions) -> CustomTask:
    assert options.reward is not None  # the spec requires it
    return CustomTask.from_paths(
        options.reward,
        alphabet=options.alphabet,
        grammar_file=options.grammar_file,
        min_length=options.min_length,
        max_length=options.max_length,
        prompts=options.prompts,
    )


def _metrics(task: CustomTask, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return sequence_metrics(rows, max_depth=task.max_length)


SPEC = TaskSpec(
    name="custom",
    summary="your own reward function, needs --reward",
    options=CustomOptions,
    required=("reward",),
    build=_build,
    metrics=_metrics,
    headline=("acc", "score", "unique", "uniq_rate", "entropy", "len_mean", "log_pterm"),
    # Any string reward: the paper's string similarity (Jaccard on character 2-grams of the
    # text) with every term on, length-aware like the SMILES column, no gating.
    subm=STRING_SUBM,
)
