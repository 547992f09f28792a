"""Expr24: generate arithmetic expressions over single digits that evaluate to 24.

Language. A text is a sentence ``num (op num)*`` with ``num`` one of the characters ``1``..``9``
(the paper's legal-token list has no ``0``) and ``op`` one of ``+ - * /``; the task's grammar
further bounds the number of characters to ``min_length..max_length`` (3..9 by default, so the
lengths are 3, 5, 7, 9). ``num`` is one character: the paper's EBNF has ``num ::= [0-9]``, so a
run of digits such as ``12`` is *not* a number, it is an invalid text. Nothing else is accepted:
no whitespace, no parentheses, no unary minus, no Unicode digits (``"３"``, ``"٣"``).

Semantics. Standard precedence (``*`` and ``/`` bind tighter than ``+`` and ``-``), left to
right within a level, exact rational arithmetic with :class:`fractions.Fraction`; a division by
zero makes the text invalid (only reachable when the digit set contains ``0``). Generated text is
never passed to Python's ``eval``.

Score. S(x) = 1 iff x is a sentence of the task grammar and its value equals 24 exactly; x is
valid iff it is such a sentence (whatever its value).

Solution set Y*. All sentences of lengths 3, 5, 7, 9 equal to 24: 4 + 82 + 2,520 + 72,839 =
75,445 texts. :func:`compute_solutions` enumerates them vectorised: for each operator pattern of
k operators it evaluates all 9^(k+1) digit tuples at once in int64 numerator/denominator arrays
(no overflow: every numerator and denominator is bounded by 5 * 9^5), then confirms every hit
with the Fraction evaluator. :func:`enumerate_solutions` caches the result on disk under
``$RAPTB_CACHE_DIR`` (default ``~/.cache/raptb``), keyed by :data:`SOLUTIONS_CACHE_VERSION`,
with a checksum so that a corrupt file is recomputed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from raptb.core.ports import Score, check_length_bounds

DIGITS = "123456789"
OPERATORS = "+-*/"
TARGET = Fraction(24)
SOLUTIONS_CACHE_VERSION = "expr24-solutions-v1"
# Longest enumerable length: length 11 would be 9^6 * 4^5 = 5.4e8 expressions.
MAX_ENUMERABLE_LENGTH = 9
# Entries of the trainer's prefix-score cache (least recently used dropped first): a long run can
# visit millions of distinct prefixes, and recomputing a score costs microseconds, so an unbounded
# memo is not worth its memory.
SCORE_CACHE_LIMIT = 1_000_000
_CORRECT = Score(value=1.0, valid=True)
_WRONG = Score(value=0.0, valid=True)
_INVALID = Score(value=0.0, valid=False)


def parse_expression(text: str, digits: str = DIGITS) -> tuple[list[int], list[str]] | None:
    """Split ``text`` into operands and operators, or return ``None`` if it is not a sentence.

    A sentence is ``num (op num)*``: characters at even positions must be in ``digits``, at odd
    positions in ``+-*/``, and the length must be odd. Returns ``(operands, operators)`` with
    ``len(operands) == len(operators) + 1``.
    """
    if len(text) % 2 == 0:
        return None
    operands: list[int] = []
    operators: list[str] = []
    for position, char in enumerate(text):
        if position % 2 == 0:
            if char not in digits:
                return None
            operands.append(ord(char) - ord("0"))
        else:
            if char not in OPERATORS:
                return None
            operators.append(char)
    return operands, operators


def exact_value(text: str, digits: str = DIGITS) -> tuple[int, int] | None:
    """The value of the expression ``text`` as an unreduced fraction (numerator, denominator >
    0) of Python integers, or ``None`` if it does not parse or divides by 0.

    Precedence is resolved in one left-to-right pass: ``term`` accumulates the current run of
    ``*``/``/`` factors and is added (with its sign) to ``total`` at each ``+``/``-``. Integer
    pairs, not ``Fraction``s: a Fraction reduces by a gcd at every operation, and the reward
    evaluates every new prefix of every row (``Expr24Task.score``: value == 24 iff numerator ==
    24 denominator).
    """
    parsed = parse_expression(text, digits)
    if parsed is None:
        return None
    operands, operators = parsed
    total_num, total_den = 0, 1
    sign = 1
    term_num, term_den = operands[0], 1
    for operator, operand in zip(operators, operands[1:], strict=True):
        if operator == "*":
            term_num *= operand
        elif operator == "/":
            if operand == 0:
                return None
            term_den *= operand
        else:
            total_num = total_num * term_den + sign * term_num * total_den
            total_den *= term_den
            sign = 1 if operator == "+" else -1
            term_num, term_den = operand, 1
    return total_num * term_den + sign * term_num * total_den, total_den * term_den


def evaluate_expression(text: str, digits: str = DIGITS) -> Fraction | None:
    """Exact value of the expression ``text``, or ``None`` if it does not parse or divides by 0
    (``exact_value``, reduced)."""
    value = exact_value(text, digits)
    return None if value is None else Fraction(*value)


def expr24_grammar(min_length: int = 3, max_length: int = 9) -> str:
    """The paper's Expr24 EBNF (xgrammar dialect) restricted to digits 1-9 and the length range.

    One alternative per admissible odd length, as in the paper's figure, so that stop is
    grammatical only at a complete sentence of an allowed length.
    """
    lengths = [n for n in range(min_length, max_length + 1) if n % 2 == 1]
    if not lengths:
        raise ValueError(
            f"min_length..max_length ({min_length}..{max_length}) contains no odd length"
        )
    alternatives = [" ".join(["num"] + ["op num"] * (n // 2)) for n in lengths]
    return (
        f"root ::= {' | '.join(alternatives)}\n"
        'op ::= "+" | "-" | "*" | "/"\n'
        f"num ::= [{DIGITS[0]}-{DIGITS[-1]}]\n"
    )


@dataclass(frozen=True)
class Expr24Automaton:
    """``expr24_grammar``'s language as an automaton over characters (core.char_automaton): the
    state is the number of characters read. A digit may follow an even count, an operator an odd
    one, each only while a sentence of an allowed length (the odd lengths in
    ``min_length..max_length``) can still be completed; the odd counts in that range accept."""

    min_length: int = 3
    max_length: int = 9
    start: int = 0

    def __post_init__(self) -> None:
        check_length_bounds(self.min_length, self.max_length)

    @property
    def longest(self) -> int:
        """The longest allowed length: the largest odd number <= max_length."""
        return self.max_length if self.max_length % 2 else self.max_length - 1

    def step(self, state: int, char: str) -> int | None:
        if state % 2 == 0 and char in DIGITS and state + 1 <= self.longest:
            return state + 1
        if state % 2 == 1 and char in OPERATORS and state + 2 <= self.longest:
            return state + 1
        return None

    def accepting(self, state: int) -> bool:
        return state % 2 == 1 and self.min_length <= state <= self.max_length


@dataclass
class Expr24Task:
    """The Expr24 task (implements :class:`raptb.core.ports.Task`).

    ``score_cache_size`` sizes the trainer's prefix-score cache (the one cache in front of
    ``score``): training scores every visited prefix and the same short prefixes recur in almost
    every batch.
    """

    min_length: int = 3
    max_length: int = 9
    prompt: str = "Expr24:"
    name: str = field(default="expr24", init=False)
    alphabet: str = field(default=DIGITS + OPERATORS, init=False)
    grammar: str = field(init=False)
    score_cache_size: int = field(default=SCORE_CACHE_LIMIT, init=False)

    def __post_init__(self) -> None:
        check_length_bounds(self.min_length, self.max_length)
        self.grammar = expr24_grammar(self.min_length, self.max_length)

    @property
    def automaton(self) -> Expr24Automaton:
        """The grammar as an automaton over characters: rollouts read their masks from its table
        (core.char_automaton) instead of running xgrammar's parser per row."""
        return Expr24Automaton(self.min_length, self.max_length)

    def prompts(self) -> list[str]:
        """The single conditioning prompt."""
        return [self.prompt]

    def score(self, prompt: str, text: str) -> Score:
        """S(text) = 1.0 iff text is a sentence of the task grammar equal to 24 (prompt unused)."""
        value = None
        if self.min_length <= len(text) <= self.max_length:
            value = exact_value(text)
        if value is None:
            return _INVALID
        num, den = value
        return _CORRECT if num * TARGET.denominator == den * TARGET.numerator else _WRONG


def _digit_grid(n_operands: int) -> np.ndarray:
    """All digit tuples as an int64 array [n_operands, 9**n_operands], lexicographic order."""
    grid = np.indices((len(DIGITS),) * n_operands, dtype=np.int64).reshape(n_operands, -1)
    return grid + 1


def _hits_for_pattern(operators: tuple[str, ...], grid: np.ndarray) -> np.ndarray:
    """Column indices of ``grid`` whose expression with ``operators`` equals 24.

    The running sum ``total_num/total_den`` and the current term ``term_num/term_den`` are kept
    unreduced: with at most five digits every product is <= 9^5, so int64 is exact.
    """
    total_num = np.zeros(grid.shape[1], dtype=np.int64)
    total_den = np.ones(grid.shape[1], dtype=np.int64)
    term_num = grid[0].copy()
    term_den = np.ones(grid.shape[1], dtype=np.int64)
    sign = 1
    for operator, operand in zip(operators, grid[1:], strict=True):
        if operator == "*":
            term_num = term_num * operand
        elif operator == "/":
            term_den = term_den * operand
        else:
            total_num = total_num * term_den + sign * term_num * total_den
            total_den = total_den * term_den
            sign = 1 if operator == "+" else -1
            term_num = operand.copy()
            term_den = np.ones(grid.shape[1], dtype=np.int64)
    total_num = total_num * term_den + sign * term_num * total_den
    total_den = total_den * term_den
    return np.flatnonzero(total_num == int(TARGET) * total_den)


def compute_solutions(max_length: int = MAX_ENUMERABLE_LENGTH) -> list[str]:
    """Enumerate Y* up to ``max_length`` characters (no cache), sorted by (length, text).

    Raises:
        ValueError: if ``max_length`` is outside 1..9.
        RuntimeError: if the Fraction evaluator disagrees with a vectorised hit (a bug).
    """
    if not 1 <= max_length <= MAX_ENUMERABLE_LENGTH:
        raise ValueError(f"max_length must be in 1..{MAX_ENUMERABLE_LENGTH}, got {max_length}")
    solutions: list[str] = []
    for n_operators in range((max_length - 1) // 2 + 1):
        grid = _digit_grid(n_operators + 1)
        characters = np.array(list(DIGITS))[grid - 1]
        for operators in itertools.product(OPERATORS, repeat=n_operators):
            for column in _hits_for_pattern(operators, grid):
                tokens = characters[:, column]
                text = tokens[0] + "".join(
                    op + digit for op, digit in zip(operators, tokens[1:], strict=True)
                )
                solutions.append(text)
    solutions.sort(key=lambda text: (len(text), text))
    wrong = [text for text in solutions if evaluate_expression(text) != TARGET]
    if wrong:
        raise RuntimeError(f"vectorised enumeration produced non-solutions, e.g. {wrong[:3]}")
    return solutions


def default_cache_dir() -> Path:
    """``$RAPTB_CACHE_DIR`` if set, else ``~/.cache/raptb``."""
    configured = os.environ.get("RAPTB_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "raptb"


def solutions_cache_path(max_length: int, cache_dir: Path | None = None) -> Path:
    """Cache file of Y* for ``max_length``; the version string is part of the name."""
    directory = default_cache_dir() if cache_dir is None else cache_dir
    return directory / f"{SOLUTIONS_CACHE_VERSION}-max{max_length}.json"


def _checksum(solutions: list[str]) -> str:
    return hashlib.sha256("\n".join(solutions).encode()).hexdigest()


def _load_cached(path: Path, max_length: int) -> list[str] | None:
    """The cached solutions, or ``None`` if the file is missing, stale or corrupt."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        solutions = payload["solutions"]
        if (
            payload["version"] != SOLUTIONS_CACHE_VERSION
            or payload["max_length"] != max_length
            or not isinstance(solutions, list)
            or not all(isinstance(text, str) for text in solutions)
            or payload["sha256"] != _checksum(solutions)
        ):
            return None
        return solutions
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(path: Path, max_length: int, solutions: list[str]) -> None:
    """Write the cache atomically (temp file then rename) so readers never see a partial file."""
    payload = {
        "version": SOLUTIONS_CACHE_VERSION,
        "max_length": max_length,
        "sha256": _checksum(solutions),
        "solutions": solutions,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, suffix=".tmp", delete=False
    ) as handle:
        json.dump(payload, handle)
        temp_name = handle.name
    os.replace(temp_name, path)


def enumerate_solutions(
    max_length: int = MAX_ENUMERABLE_LENGTH, cache_dir: Path | None = None
) -> list[str]:
    """Y* up to ``max_length`` characters, sorted by (length, text), cached on disk.

    A missing, stale or corrupt cache file is recomputed and rewritten; an unwritable cache
    directory only costs a warning, since the result is still correct.
    """
    path = solutions_cache_path(max_length, cache_dir)
    cached = _load_cached(path, max_length)
    if cached is not None:
        return cached
    solutions = compute_solutions(max_length)
    try:
        _store(path, max_length, solutions)
    except OSError as error:
        warnings.warn(f"could not write Expr24 solution cache {path}: {error}", stacklevel=2)
    return solutions


def solution_counts(solutions: list[str]) -> dict[int, int]:
    """Number of solutions per length, in increasing length order."""
    counts: dict[int, int] = {}
    for text in solutions:
        counts[len(text)] = counts.get(len(text), 0) + 1
    return dict(sorted(counts.items()))
