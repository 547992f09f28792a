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

from raptb.adapters.tasks.dotted_path import load_dotted
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
        (app.reward.calls)."""
        return _unchecked(self.reward(prompt, text))
