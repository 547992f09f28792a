"""The Task port's optional capabilities, read in one place (core.ports.TaskCapabilities)."""

from __future__ import annotations

from raptb.core.ports import Score, Task, TaskCapabilities


class Plain:
    """A task with only what the Task protocol requires."""

    name, alphabet, grammar, min_length, max_length = "plain", None, None, 1, 4

    def prompts(self) -> list[str]:
        return [""]

    def score(self, prompt: str, text: str) -> Score:
        return Score(1.0, True)


class Full(Plain):
    """A task with every optional capability."""

    stop = "."
    score_cache_size = 7

    def unchecked_score(self, prompt: str, text: str) -> Score:
        return Score(float("nan"), True)

    def prefix_score(self, prompt: str, text: str) -> Score:
        return Score(0.5, True)

    def score_batch(self, prompt: str, texts: list[str]) -> list[Score]:
        return [Score(2.0, True) for _ in texts]

    def item_features(self, prompt: str, text: str) -> str:
        return f"features of {text}"


def test_a_plain_task_has_no_optional_capability_and_scores_with_score() -> None:
    task = Plain()
    assert isinstance(task, Task)
    able = TaskCapabilities.of(task)
    assert (able.stop, able.score_cache_size, able.prefix_score) == (None, None, None)
    assert able.score_batch is None and able.item_features is None
    assert able.score("", "x") == Score(1.0, True)


def test_every_declared_capability_is_read_and_unchecked_score_replaces_score() -> None:
    able = TaskCapabilities.of(Full())
    assert (able.stop, able.score_cache_size) == (".", 7)
    value = able.score("", "x").value
    assert value != value  # unchecked_score's NaN, not score's 1.0
    assert able.prefix_score is not None and able.prefix_score("", "x") == Score(0.5, True)
    assert (
        able.score_batch is not None and able.score_batch("", ["a", "b"]) == [Score(2.0, True)] * 2
    )
    assert able.item_features is not None and able.item_features("", "ab") == "features of ab"


def test_a_capability_that_is_not_callable_is_absent() -> None:
    task = Plain()
    task.prefix_score = None  # type: ignore[attr-defined]
    task.score_batch = 3  # type: ignore[attr-defined]
    able = TaskCapabilities.of(task)
    assert able.prefix_score is None and able.score_batch is None
