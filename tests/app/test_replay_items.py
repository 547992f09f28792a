"""Replay items carry the task's replay validity and static score (issue 12, fixes 1 and 2)."""

from __future__ import annotations

import numpy as np
import pytest

from raptb.adapters.tasks.expr24.task import Expr24Task
from raptb.adapters.tasks.registry import task_spec
from raptb.adapters.tasks.smiles.task import SmilesTask
from raptb.app.reward.prefix import PrefixScorer, ScoredRows
from raptb.app.task_and_policy import build_policy
from raptb.app.training.gflownet.replay_items import replay_items
from raptb.core.ports import Score
from raptb.core.replay import make_buffer, replay_kwargs


@pytest.fixture(scope="module")
def expr24():
    task = Expr24Task()
    policy = build_policy("tiny", task, 0)
    return task, policy, PrefixScorer(task, policy, 50.0)


def _items(expr24, texts: list[str]):
    task, policy, scorer = expr24
    prompt = task.prompts()[0]
    rows = [tuple(policy.tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    scored = scorer.score_rows(prompt, rows, task.max_length, texts)
    return replay_items(task, prompt, rows, texts, scored, range(len(rows)), scored.u)


def test_expr24_subm_buffer_keeps_only_correct_items_after_a_refresh_with_wrong_ones(expr24):
    task, _, _ = expr24
    correct = ["4*6", "3*8", "8*3", "6*4", "2*3*4"]
    wrong = ["1+2", "9-1", "3*8+1", "5*5", "7+8*2"]  # well-formed, not 24 ("3*8+1" has a 24 prefix)
    assert all(task.score("", t).valid for t in correct + wrong)
    items = _items(expr24, correct + wrong)
    assert [it.valid for it in items] == [True] * 5 + [False] * 5
    options = {**task_spec("expr24").subm, "capacity": 200}
    buffer = make_buffer("subm", **replay_kwargs("subm", options))
    buffer.add(items[5:])  # a refresh offered only wrong items keeps none of them
    assert len(buffer) == 0
    buffer.add(items[:7])
    kept = {it.text for it in buffer.items()}
    assert kept == set(correct)  # capacity 200 would hold all 7: the gate removed the wrong ones


def test_expr24_item_score_is_the_terminal_0_1_score_not_lambda_times_it(expr24):
    items = _items(expr24, ["4*6", "3*8+1", "1+2"])
    assert [it.score for it in items] == [1.0, 0.0, 0.0]  # "3*8+1": its prefix 3*8 scores 1
    assert [it.terminal_u for it in items] == [50.0, 0.0, 0.0]


def test_smiles_item_score_is_the_best_prefix_score() -> None:
    task = SmilesTask()
    prompt = task.prompts()[0]
    s = np.array([[0.0, 0.7, 0.3, 0.0], [0.0, 0.2, 0.4, 0.6]])
    scored = ScoredRows(u=50.0 * s, scores=[Score(0.3, True), Score(0.6, True)], s=s)
    rows, texts = [(1, 2, 3), (4, 5, 6)], ["CCO", "CCN"]
    items = replay_items(task, prompt, rows, texts, scored, range(2), scored.u)
    assert [it.score for it in items] == [0.7, 0.6]
    assert [it.valid for it in items] == [True, True]
