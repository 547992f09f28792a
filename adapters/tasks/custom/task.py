"""User-defined tasks: a reward function named by dotted path, an alphabet, an optional grammar.

A reward function takes ``(prompt, text)`` (the generated text, stop excluded) and returns either
a float score S(text), a ``(score, valid)`` pair, or a ``raptb.core.ports.Score``. A float that
is not finite counts as an invalid sample with score 0. The trainer scores every prefix with it
(u_k = lambda * S(prefix_k)), so a function that only rewards complete texts should return 0 for
incomplete ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from raptb.adapters.dotted_path import CallablePath, load_dotted
from raptb.adapters.registry import TaskOptions, TaskSpec, register_task
from raptb.core.metrics import sequence_metrics
from raptb.core.ports import Score

RewardFn = Callable[[str, str], "float | tuple[float, bool] | Score"]


def load_callable(path: str) -> RewardFn:
    """Import the reward ``package.module:function`` (ValueError naming ``custom.reward``)."""
    return load_dotted(path, "custom.reward")


def _unchecked(out: object) -> Score:
    """The reward's return value as a Score, its value possibly NaN or infinite."""
    if isinstance(out, Score):
        return out
    if isinstance(out, tuple) and len(out) == 2:
        return Score(float(out[0]), bool(out[1]))
    return Score(float(out), True)  # type: ignore[arg-type]


def _as_score(out: object) -> Score:
    score = _unchecked(out)
    if not math.isfinite(score.value):
        return Score(0.0, False)
    return score


@dataclass
class CustomTask:
    """A task from a reward function (implements :class:`raptb.core.ports.Task`)."""

    reward: RewardFn
    alphabet: str | None = None
    grammar: str | None = None
    min_length: int = 1
    max_length: int = 20
    prompt_texts: Sequence[str] = ("",)
    name: str = field(default="custom", init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.min_length <= self.max_length:
            raise ValueError(
                f"custom.min_length/max_length: need 0 <= min <= max, got "
                f"{self.min_length}, {self.max_length}"
            )
        if not self.prompt_texts:
            raise ValueError("custom.prompts: give at least one prompt (it may be empty)")

    @classmethod
    def from_paths(
        cls,
        reward: str,
        *,
        alphabet: str | None = None,
        grammar_file: Path | None = None,
        min_length: int = 1,
        max_length: int = 20,
        prompts: Sequence[str] = ("",),
    ) -> CustomTask:
        grammar = None
        if grammar_file is not None:
            try:
                grammar = Path(grammar_file).read_text()
            except OSError as exc:
                raise ValueError(f"custom.grammar_file: cannot read {grammar_file}: {exc}") from exc
        return cls(
            load_callable(reward),
            alphabet=alphabet,
            grammar=grammar,
            min_length=min_length,
            max_length=max_length,
            prompt_texts=tuple(prompts),
        )

    def prompts(self) -> list[str]:
        return list(self.prompt_texts)

    def score(self, prompt: str, text: str) -> Score:
        return _as_score(self.reward(prompt, text))

    def unchecked_score(self, prompt: str, text: str) -> Score:
        """``score`` without the non-finite rule, so a caller can count NaN and inf rewards
        (app.training.reward_calls)."""
        return _unchecked(self.reward(prompt, text))


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


SPEC = register_task(
    TaskSpec(
        name="custom",
        summary="your own reward function, needs --reward",
        options=CustomOptions,
        required=("reward",),
        build=_build,
        metrics=_metrics,
        headline=("acc", "score", "unique", "uniq_rate", "entropy", "len_mean", "log_pterm"),
        # Any string reward: the paper's string similarity (Jaccard on character 2-grams of the
        # text) with every term on, length-aware like the SMILES column, no gating.
        subm={
            "subm_weights": (1.0, 1.0, 1.0, 1.0),
            "gating_ratio": 0.0,
            "similarity": "jaccard",
            "shingle_k": 2,
            "shingle_on": "text",
            "length_bin_size": 1,
        },
    )
)
