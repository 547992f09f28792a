"""Expr24 in the task registry: its success predicate, its report and the paper's SubM column.

TrainConfig's field defaults are the paper's Expr24 column, so the spec overrides none of them.
"""

from __future__ import annotations

from typing import Any

from raptb.adapters.tasks.expr24.metrics import expr24_metrics
from raptb.adapters.tasks.expr24.task import MAX_ENUMERABLE_LENGTH, Expr24Task, enumerate_solutions
from raptb.adapters.tasks.registry import TaskSpec
from raptb.adapters.tasks.subm_presets import JACCARD_CHARACTER_BIGRAMS
from raptb.core.ports import Score


def _is_correct(score: Score) -> bool:
    """Expr24 success: the text parses and equals 24."""
    return score.valid and score.value == 1.0


def _metrics(task: Expr24Task, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return expr24_metrics(rows, enumerate_solutions(MAX_ENUMERABLE_LENGTH))


SPEC = TaskSpec(
    name="expr24",
    summary="arithmetic expressions equal to 24, enumerable",
    build=lambda options: Expr24Task(),
    is_correct=_is_correct,
    # SubM's gating and w_val see correctness, as in the paper (its valid/correct split is
    # kept in samples.jsonl); r(x) is the terminal 0/1 score.
    replay_valid=_is_correct,
    metrics=_metrics,
    headline=(
        "acc",
        "unique",
        "cov_count",
        "norm_cov",
        "kl_pi_p",
        "kl_p_pi",
        "js_tok",
        "log_pterm",
        "len_mean",
        "entropy",
    ),
    # Paper Table "Submodular replay hyperparameters (Expr24)".
    subm={
        **JACCARD_CHARACTER_BIGRAMS,
        "subm_weights": (1.0, 1.0, 1.0, 0.0),
        "gating_ratio": 1.0,
    },
    eval_samples=6400,
    solutions=lambda task: enumerate_solutions(task.max_length),
)
