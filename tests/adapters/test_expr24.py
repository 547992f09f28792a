"""Expr24 parser, evaluator, task, grammar and the enumerated solution set Y*."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raptb.adapters.tasks.expr24 import task as expr24
from raptb.adapters.tasks.expr24.task import (
    Expr24Task,
    compute_solutions,
    enumerate_solutions,
    evaluate_expression,
    expr24_grammar,
    solution_counts,
    solutions_cache_path,
)
from raptb.core.ports import Score, Task

SENTENCE = re.compile(r"[1-9]([-+*/][1-9])*")


def reference_value(operands: list[int], operators: list[str]) -> Fraction | None:
    """Two-pass reference: split into +/- separated terms, then fold each term left to right."""
    terms: list[tuple[int, list[tuple[str, int]]]] = [(1, [("*", operands[0])])]
    for operator, operand in zip(operators, operands[1:], strict=True):
        if operator in "+-":
            terms.append((1 if operator == "+" else -1, [("*", operand)]))
        else:
            terms[-1][1].append((operator, operand))
    total = Fraction(0)
    for sign, factors in terms:
        value = Fraction(1)
        for operator, operand in factors:
            if operator == "/" and operand == 0:
                return None
            value = value * operand if operator == "*" else value / operand
        total += sign * value
    return total


def render(operands: list[int], operators: list[str]) -> str:
    return str(operands[0]) + "".join(
        op + str(d) for op, d in zip(operators, operands[1:], strict=True)
    )


@st.composite
def expressions(draw: st.DrawFn, digits: str = "123456789") -> tuple[list[int], list[str]]:
    n_operators = draw(st.integers(0, 12))
    operands = draw(
        st.lists(
            st.sampled_from([int(d) for d in digits]),
            min_size=n_operators + 1,
            max_size=n_operators + 1,
        )
    )
    operators = draw(st.lists(st.sampled_from("+-*/"), min_size=n_operators, max_size=n_operators))
    return operands, operators


@given(expressions())
def test_evaluator_matches_fraction_reference(expression: tuple[list[int], list[str]]) -> None:
    operands, operators = expression
    assert evaluate_expression(render(operands, operators)) == reference_value(operands, operators)


@given(expressions())
def test_the_score_is_one_exactly_at_24(expression: tuple[list[int], list[str]]) -> None:
    """``Expr24Task.score`` (integer fractions, ``exact_value``) against the Fraction reference:
    1 where the sentence's value is 24, 0 elsewhere, valid within the task's lengths."""
    operands, operators = expression
    text = render(operands, operators)
    task = Expr24Task()
    want = reference_value(operands, operators) == 24
    valid = task.min_length <= len(text) <= task.max_length
    assert task.score("Expr24:", text) == Score(float(want and valid), valid)


@given(expressions(digits="0123456789"))
def test_division_by_zero_is_invalid_when_zero_is_a_digit(
    expression: tuple[list[int], list[str]],
) -> None:
    operands, operators = expression
    text = render(operands, operators)
    assert evaluate_expression(text, digits="0123456789") == reference_value(operands, operators)


@given(st.text(alphabet=st.sampled_from("0123456789+-*/ ()x.٣３\n"), max_size=15) | st.text())
def test_arbitrary_text_is_valid_exactly_when_it_is_a_sentence(text: str) -> None:
    value = evaluate_expression(text)
    assert (value is not None) == bool(SENTENCE.fullmatch(text))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "+",
        "+-*/",
        "*3",
        "3*",
        "-3*8",
        "3**8",
        "12",
        "12*2",
        "9" * 10_000,
        "3*8" + "9" * 5_000,
        "３*８",
        "٣*٨",
        "3 * 8",
        " 3*8",
        "3*8\n",
        "3*8 ",
        "\t",
        "8/0",
        "(3*8)",
        "3x8",
        "3.0*8",
    ],
)
def test_adversarial_strings_are_invalid(text: str) -> None:
    assert evaluate_expression(text) is None
    assert Expr24Task().score("Expr24:", text) == Score(value=0.0, valid=False)


def test_division_by_zero_with_zero_digit() -> None:
    assert evaluate_expression("8/0", digits="0123456789") is None
    assert evaluate_expression("8/2-4", digits="0123456789") == 0
    assert evaluate_expression("0/8", digits="0123456789") == 0


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3*8", Fraction(24)),
        ("8-2*3", Fraction(2)),
        ("8/3*9", Fraction(24)),
        ("1-2-3", Fraction(-4)),
        ("8/2/2", Fraction(2)),
        ("1/3+1/3+1/3", Fraction(1)),
        ("7", Fraction(7)),
    ],
)
def test_hand_computed_values(text: str, value: Fraction) -> None:
    assert evaluate_expression(text) == value


def test_task_scores() -> None:
    task = Expr24Task()
    assert isinstance(task, Task)
    assert task.name == "expr24"
    assert task.alphabet == "123456789+-*/"
    assert (task.min_length, task.max_length) == (3, 9)
    assert task.prompts() == ["Expr24:"]
    assert task.score("Expr24:", "3*8") == Score(1.0, True)
    assert task.score("Expr24:", "3*8+1") == Score(0.0, True)
    assert task.score("Expr24:", "9/3*8") == Score(1.0, True)
    # A sentence outside the length range is not in the task's language.
    assert task.score("Expr24:", "8") == Score(0.0, False)
    assert task.score("Expr24:", "4*6+1-1+1-1") == Score(0.0, False)
    assert task.score("Expr24:", "3*8") is task.score("Expr24:", "3*8")


def test_task_rejects_bad_lengths() -> None:
    with pytest.raises(ValueError, match="min_length"):
        Expr24Task(min_length=0)
    with pytest.raises(ValueError, match="max_length"):
        Expr24Task(min_length=5, max_length=3)
    with pytest.raises(ValueError, match="odd length"):
        Expr24Task(min_length=4, max_length=4)


def test_grammar_accepts_exactly_the_task_language() -> None:
    xgr = pytest.importorskip("xgrammar")
    vocabulary = [*"1234567890+-*/ ", "</s>"]
    info = xgr.TokenizerInfo(vocabulary, stop_token_ids=[len(vocabulary) - 1])
    compiled = xgr.GrammarCompiler(info).compile_grammar(expr24_grammar())

    def accepted(text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiled)
        return (
            matcher.accept_string(text)
            and matcher.accept_token(len(vocabulary) - 1)
            and matcher.is_terminated()
        )

    task = Expr24Task()
    cases = ["3*8", "1+2-3*4/5", "8", "3*", "12", "3*0", "3 *8", "", "1+1+1+1+1+1", "9/9/9/9"]
    for text in cases:
        assert accepted(text) == task.score("", text).valid, text


@pytest.fixture(scope="module")
def solutions() -> list[str]:
    return compute_solutions()


def test_solution_counts(solutions: list[str]) -> None:
    assert solution_counts(solutions) == {3: 4, 5: 82, 7: 2520, 9: 72839}
    assert len(solutions) == len(set(solutions)) == 75_445
    assert solutions[:4] == ["3*8", "4*6", "6*4", "8*3"]
    assert all(SENTENCE.fullmatch(text) for text in solutions)


def test_short_solutions_match_brute_force() -> None:
    brute = []
    for n_operators in (0, 1, 2):
        for operands in itertools.product(range(1, 10), repeat=n_operators + 1):
            for operators in itertools.product("+-*/", repeat=n_operators):
                if reference_value(list(operands), list(operators)) == 24:
                    brute.append(render(list(operands), list(operators)))
    assert set(compute_solutions(5)) == set(brute)
    assert sorted(compute_solutions(6)) == sorted(brute)


def test_max_length_bounds() -> None:
    with pytest.raises(ValueError, match="max_length"):
        compute_solutions(10)
    with pytest.raises(ValueError, match="max_length"):
        compute_solutions(0)


def test_cache_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAPTB_CACHE_DIR", str(tmp_path / "cache"))
    first = enumerate_solutions(5)
    assert first == compute_solutions(5)
    path = solutions_cache_path(5)
    assert path.parent == tmp_path / "cache" and path.is_file()
    assert expr24.SOLUTIONS_CACHE_VERSION in path.name

    def fail(max_length: int) -> list[str]:
        raise AssertionError("cache was not used")

    monkeypatch.setattr(expr24, "compute_solutions", fail)
    assert enumerate_solutions(5) == first


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda text: "",
        lambda text: text[: len(text) // 2],
        lambda text: "\x00\xff garbage",
        lambda text: json.dumps([1, 2, 3]),
        lambda text: text.replace('"3*8"', '"3*9"'),
        lambda text: text.replace('"expr24-solutions-v1"', '"old-version"'),
    ],
)
def test_corrupt_cache_is_recomputed(tmp_path: Path, corrupt: Callable[[str], str]) -> None:
    expected = enumerate_solutions(5, cache_dir=tmp_path)
    path = solutions_cache_path(5, tmp_path)
    path.write_text(corrupt(path.read_text(encoding="utf-8")), encoding="utf-8")
    assert enumerate_solutions(5, cache_dir=tmp_path) == expected
    assert json.loads(path.read_text(encoding="utf-8"))["solutions"] == expected
