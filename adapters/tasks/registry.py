"""The task registry: everything raptb knows about a task, in one ``TaskSpec`` per task.

Each task declares its spec (a module-level ``SPEC``) and names it in a ``raptb.tasks`` entry
point; the app reads every task-dependent choice from the spec (the CLI's ``--task`` choices,
the task's config section and presets, the SubM preset, the success predicate, evaluation
metrics and plots, ``raptb enumerate``). :func:`register_task` adds a spec by hand (a test's
task, a script's).

The tasks are loaded lazily, on the first lookup, from the ``raptb.tasks`` entry points
(core.plugins): raptb's own, which declare the built-in tasks (its ``setup.py`` names
each ``adapters/tasks/<name>/spec.py:SPEC``), then those of installed packages. A built-in task
is declared exactly as a plug-in's is; importing a spec module registers nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from raptb.core.plugins import check_named, is_builtin, load_group_once
from raptb.core.ports import Score, Task
from raptb.core.registry import Registry
from raptb.core.replay import replay_kwargs

TASK_GROUP = "raptb.tasks"


class TaskOptions(BaseModel):
    """Base of a task's config section ``[<task name>]``: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoOptions(TaskOptions):
    """The section of a task that takes no options."""


def valid_only(score: Score) -> bool:
    """The default success predicate: the task called the text valid."""
    return score.valid


@dataclass(frozen=True)
class TaskSpec:
    """One task, declared once.

    Attributes:
        name: the ``--task`` value and the name of the config section ``[name]``.
        build: the task (a :class:`raptb.core.ports.Task`) from its validated options.
        metrics: evaluation metrics of sample rows (dicts with tokens, text, valid, correct,
            score, log_pterm_stop, prompt), JSON-ready; it may add per-row fields, which then
            reach samples.jsonl.
        headline: keys of the metrics that ``raptb eval`` prints.
        subm: the task's SubM preset, ``[replay]`` options by name (``subm_weights``,
            ``gating_ratio``, ``similarity``, ``shingle_k``, ...: SubM's options schema in
            core.replay), the paper's SubM column for the task; validated when registered.
        options: the config section's model (a :class:`TaskOptions`); ``NoOptions`` when none.
        required: option names the task cannot run without (checked when it is the run's task).
        is_correct: success predicate on a terminal score (Acc counts these samples).
        replay_valid: what ``valid`` means for a replay item (SubM's gating and w_val), on the
            terminal score: feasibility by default; Expr24 uses correctness (the paper's metrics
            appendix: for Expr24 "valid" means equal to 24). samples.jsonl keeps both.
        replay_score: SubM's static reward r(x), the task score S of a replay item (never lambda
            S): ``"terminal"``, S of the whole text (Expr24: 0/1), or ``"best_prefix"``, the
            largest S over its prefixes (SMILES).
        defaults: config values the task changes under the file and the flags (the paper's column
            for the task), as a nested mapping such as ``{"reward": {"kappa": 1.0}}``; the field
            defaults of ``TrainConfig`` are the Expr24 column.
        eval_samples: evaluation samples N when the run does not set ``eval_samples``.
        eval_per_prompt: N counts samples per prompt (CommonGen: 320 per concept set), not in all.
        reference_pterm: evaluation adds ``ref_log_pterm_stop`` to each sample row, the reference
            model's log p_term at the sample's stop (LoRA: the adapter disabled; otherwise the
            run's initial weights), for Delta log p_term.
        solutions: for an enumerable task, its exact solution set Y* (texts) for a built task;
            used by Oracle replay and ``raptb enumerate``. None: not enumerable.
        length_table: columns of the metrics' ``by_length`` table that ``raptb eval`` prints.
        length_plots: ``(metric, title)`` pairs plotted against length from ``by_length``.
        summary: one line for ``--help`` texts.
    """

    name: str
    build: Callable[[Any], Task]
    metrics: Callable[[Any, list[dict[str, Any]]], dict[str, Any]]
    headline: Sequence[str]
    subm: Mapping[str, Any]
    options: type[TaskOptions] = NoOptions
    required: Sequence[str] = ()
    is_correct: Callable[[Score], bool] = valid_only
    replay_valid: Callable[[Score], bool] = valid_only
    replay_score: Literal["terminal", "best_prefix"] = "terminal"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    eval_samples: int = 6400
    eval_per_prompt: bool = False
    reference_pterm: bool = False
    solutions: Callable[[Any], list[str]] | None = None
    length_table: Sequence[str] = ()
    length_plots: Sequence[tuple[str, str]] = ()
    summary: str = ""

    @property
    def enumerable(self) -> bool:
        """Whether the task's solution set can be enumerated exactly."""
        return self.solutions is not None


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add ``spec`` to the registry and return it; a name may be registered only once, and its
    SubM preset must be valid for SubM's options schema (ValueError otherwise)."""
    try:
        replay_kwargs("subm", spec.subm)
    except ValueError as exc:
        raise ValueError(f"task {spec.name!r}: SubM preset: {exc}") from None
    return TASKS.register(spec)


_builtin_names: list[str] = []
"""The tasks raptb's own entry points registered, in registration order."""


def _load_tasks() -> None:
    """Register the specs of the ``raptb.tasks`` entry points, raptb's own first."""
    load_group_once(TASK_GROUP, _register_entry_point, builtin=True)


def _register_entry_point(point: EntryPoint, spec: Any) -> None:
    """Register the TaskSpec an entry point of ``raptb.tasks`` names (core.plugins)."""
    check_named(point, spec, TaskSpec, "TaskSpec")
    register_task(spec)
    if is_builtin(point):
        _builtin_names.append(spec.name)


TASKS: Registry[TaskSpec] = Registry("task", lambda spec: spec.name, load=_load_tasks)
"""The tasks by name (built-in ones first, by name, then the plug-ins' and those registered by
hand, in registration order); the first read loads them."""


def task_names() -> tuple[str, ...]:
    """Names of the registered tasks (built-in ones first, by name; then in registration
    order)."""
    return TASKS.names()


def builtin_task_names() -> tuple[str, ...]:
    """Names of the tasks raptb ships (its own ``raptb.tasks`` entry points), by name."""
    TASKS.load()
    return tuple(_builtin_names)


def task_spec(name: str) -> TaskSpec:
    """The spec of task ``name``; a ValueError lists the valid names when it is unknown."""
    return TASKS.lookup(name)
