"""Unfinished prefixes scored by ``prefix_score``, finished texts by ``score`` (batched where the
task has ``score_batch``), cached apart; failures still counted one by one."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from raptb.app.reward.calls import RewardCaller
from raptb.app.reward.prefix import PrefixScorer
from raptb.core.ports import Score


@dataclass
class TerminalTask:
    """Finished: S = (number of "a") / 4, valid; unfinished: -1 (a value no finished text has).

    ``score_batch`` raises on a batch holding "bb" (so the caller falls back to one by one) and
    ``score`` raises on "bb" alone; ``batch_calls`` counts the batched calls.
    """

    name: str = field(default="terminal", init=False)
    alphabet: str = field(default="ab", init=False)
    grammar: None = field(default=None, init=False)
    min_length: int = field(default=1, init=False)
    max_length: int = field(default=4, init=False)
    batch_calls: int = field(default=0, init=False)

    def prompts(self) -> list[str]:
        return ["p"]

    def score(self, prompt: str, text: str) -> Score:
        if text == "bb":
            raise KeyError(text)
        return Score(text.count("a") / 4, True)

    def prefix_score(self, prompt: str, text: str) -> Score:
        return Score(-1.0, True)

    def score_batch(self, prompt: str, texts: list[str]) -> list[Score]:
        self.batch_calls += 1
        if "bb" in texts:
            raise RuntimeError("batch failed")
        return [self.score(prompt, t) for t in texts]


def _policy() -> SimpleNamespace:
    # PrefixScorer only needs the legal ids and their texts
    return SimpleNamespace(legal_ids=[0, 1], texts=["a", "b"])


def test_prefixes_and_finished_texts_are_scored_and_cached_apart() -> None:
    task = TerminalTask()
    scorer = PrefixScorer(task, _policy(), 2.0)
    # row 0 = "a" (finished), row 1 = "ab": its prefix "a" equals row 0's finished text
    rows = [[0], [0, 1], [1, 0, 0]]
    scored = scorer.score_rows("p", rows, 4)
    want = np.array(
        [
            [-2.0, 2.0 * 1 / 4, 0.0, 0.0, 0.0],
            [-2.0, -2.0, 2.0 * 1 / 4, 0.0, 0.0],
            [-2.0, -2.0, -2.0, 2.0 * 2 / 4, 0.0],
        ]
    )
    np.testing.assert_array_equal(scored.u, want)
    assert scored.scores == [Score(0.25, True), Score(0.25, True), Score(0.5, True)]
    assert scorer.cache.get(("p", "a", True)) == Score(0.25, True)
    assert scorer.cache.get(("p", "a", False)) == Score(-1.0, True)
    assert task.batch_calls == 1  # the three finished texts in one call
    assert scorer.prefix_scores("p", ["", "b", "ba"]) == [
        Score(-1.0, True),
        Score(-1.0, True),
        Score(0.25, True),
    ]


def test_a_task_without_prefix_score_shares_one_entry() -> None:
    @dataclass
    class Plain:
        name: str = "plain"
        alphabet: str = "ab"
        grammar: None = None
        min_length: int = 1
        max_length: int = 3
        calls: list[str] = field(default_factory=list)

        def prompts(self) -> list[str]:
            return ["p"]

        def score(self, prompt: str, text: str) -> Score:
            self.calls.append(text)
            return Score(float(len(text)), True)

    task = Plain()
    scorer = PrefixScorer(task, _policy(), 1.0)
    scored = scorer.score_rows("p", [[0], [0, 1]], 3)
    np.testing.assert_array_equal(scored.u, [[0, 1, 0, 0], [0, 1, 2, 0]])
    assert sorted(task.calls) == ["", "a", "ab"]  # "a" scored once for both roles


@pytest.mark.parametrize("workers", [0, 2])
def test_batched_scores_equal_one_by_one_and_failures_are_counted(workers) -> None:
    texts = ["a", "ab", "aab", "bb", "ab", "bab"]
    task = TerminalTask()
    caller = RewardCaller(task, workers=workers)
    try:
        got = caller.score_many("p", texts)
        prefixes = caller.score_many("p", texts, finished=False)
    finally:
        caller.close()
    one_by_one = [Score(0.0, False) if t == "bb" else task.score("p", t) for t in texts]
    assert got == one_by_one
    assert prefixes == [Score(-1.0, True)] * len(texts)
    counts = caller.take_counts(1)
    assert counts == {"reward_errors": 1, "reward_nonfinite": 0}


def test_batched_path_is_used_when_nothing_fails() -> None:
    task = TerminalTask()
    caller = RewardCaller(task)
    assert caller.score_many("p", ["a", "aa", "ab"]) == [
        Score(0.25, True),
        Score(0.5, True),
        Score(0.25, True),
    ]
    assert task.batch_calls == 1


def test_amp_oracle_batched_equals_one_by_one() -> None:
    pytest.importorskip("macrel")
    from raptb.adapters.tasks.amp.task import AmpTask

    texts = ["GLFDIVKKVVGALGSL", "KKKKKKKKKK", "ACDEFGHIK", "XYZ", "RRWWRRWWRR", "GLFDIVKKVVGALGSL"]
    batched = RewardCaller(AmpTask()).score_many("p", texts)
    single = [AmpTask().score("p", t) for t in texts]
    # onnxruntime's float32 forest may differ in the last bits between batch sizes
    assert [s.valid for s in batched] == [s.valid for s in single]
    np.testing.assert_allclose([s.value for s in batched], [s.value for s in single], atol=1e-6)
    assert batched[3] == Score(0.0, False) and 0.0 <= batched[0].value <= 1.0
    assert RewardCaller(AmpTask()).score_many("p", texts, finished=False) == [Score(0.0, True)] * 6
