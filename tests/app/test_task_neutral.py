"""The metrics every evaluation adds (app.evaluation.task_neutral) on hand-made sample rows:
pass@k from integer binomials, the Vendi score from the full kernel of the correct samples
(each duplicate its own row) with each kind of SubM kernel, per prompt and averaged."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from raptb.adapters.tasks.registry import task_spec
from raptb.app.evaluation.task_neutral import task_neutral_metrics
from raptb.core.subm.similarity import pack_bits
from tests.core.test_vendi import authors_score_k, set_jaccard


def rows_of(prompt: str, texts: list[str], correct: list[bool]) -> list[dict[str, Any]]:
    return [
        {"prompt": prompt, "text": t, "tokens": [ord(ch) for ch in t], "correct": ok}
        for t, ok in zip(texts, correct, strict=True)
    ]


def full_vendi(items: list[Any], similarity: Any) -> float:
    kernel = np.array([[similarity(a, b) for b in items] for a in items], dtype=np.float64)
    return authors_score_k(kernel) if items else 0.0


def word_jaccard(a: str, b: str) -> float:
    wa, wb = set(a.lower().split()), set(b.lower().split())
    return len(wa & wb) / len(wa | wb)


def test_expr24_character_bigrams() -> None:
    texts = ["12+12", "4*6", "12+12", "8*3", "1+1", "4*6", "4*6", "6*4"]
    correct = [True, True, True, True, False, True, True, True]
    rows = rows_of("Expr24:", texts, correct)
    out = task_neutral_metrics(SimpleNamespace(name="expr24"), task_spec("expr24"), rows)
    n, c = 8, 7
    assert out["pass_at_k"] == pytest.approx(
        {"1": c / n, "8": 1 - math.comb(n - c, 8) / math.comb(n, 8), "64": None, "256": None}
    )
    kept = [t for t, ok in zip(texts, correct, strict=True) if ok]
    assert out["vendi"] == pytest.approx(full_vendi(kept, set_jaccard))
    assert out["vendi_info"]["distinct"] == 4 and out["vendi_info"]["samples"] == 7


def test_prompts_are_scored_apart_and_averaged_with_word_unigrams() -> None:
    # CommonGen's kernel: Jaccard on word unigrams; prompt b has no correct sample: it counts 0
    a = ["the dog runs", "a dog runs fast", "the cat sleeps", "the dog runs"]
    b = ["nothing here", "nor here"]
    rows = rows_of("a", a, [True] * 4) + rows_of("b", b, [False, False])
    out = task_neutral_metrics(SimpleNamespace(name="commongen"), task_spec("commongen"), rows)
    assert out["vendi"] == pytest.approx(full_vendi(a, word_jaccard) / 2)
    # pass@1: prompt a 4/4, prompt b 0/2; k = 8 > n for both
    assert out["pass_at_k"]["1"] == pytest.approx(0.5) and out["pass_at_k"]["8"] is None
    assert out["vendi_info"]["kernel"] == "jaccard, 1-grams of the words"


def test_tanimoto_kernel_reads_the_tasks_item_features() -> None:
    bits = {"A": [0, 1, 2], "B": [1, 2, 3], "C": [5], "A2": [0, 1, 2]}

    def item_features(prompt: str, text: str) -> SimpleNamespace:
        row = np.zeros(64, dtype=bool)
        row[bits[text]] = True
        # A and A2 are one molecule written two ways: one canonical key
        return SimpleNamespace(features=pack_bits(row[None])[0], canonical=text[0])

    task = SimpleNamespace(name="smiles", item_features=item_features, score=None)
    rows = rows_of("*C", ["A", "B", "C", "A2", "B"], [True] * 5)
    out = task_neutral_metrics(task, task_spec("smiles"), rows)

    def tanimoto(x: str, y: str) -> float:
        sx, sy = set(bits[x]), set(bits[y])
        return len(sx & sy) / len(sx | sy)

    assert out["vendi"] == pytest.approx(full_vendi(["A", "B", "C", "A2", "B"], tanimoto))
    assert out["vendi_info"]["distinct"] == 3 and out["vendi_info"]["kernel"] == "tanimoto"


def test_token_kernel_and_subsampling() -> None:
    spec = replace(task_spec("expr24"), subm={**task_spec("expr24").subm, "shingle_on": "tokens"})
    texts = [f"{i}+{24 - i}" for i in range(1, 10)]
    rows = rows_of("p", texts, [True] * 9)
    out = task_neutral_metrics(SimpleNamespace(name="expr24"), spec, rows)
    assert out["vendi"] == pytest.approx(full_vendi(texts, set_jaccard))  # one char per token
    small = task_neutral_metrics(SimpleNamespace(name="expr24"), spec, rows, max_distinct=4)
    assert small["vendi_info"]["subsampled"] and small["vendi_info"]["samples"] == 4
    assert 1.0 <= small["vendi"] <= 4.0


def test_tanimoto_without_fingerprints_reports_no_vendi() -> None:
    task = SimpleNamespace(name="plugin", score=None)
    rows = rows_of("p", ["A", "B"], [True, False])
    out = task_neutral_metrics(task, task_spec("smiles"), rows)
    assert out["vendi"] is None and out["pass_at_k"]["1"] == pytest.approx(0.5)
