"""core.char_automaton: an automaton's token table against a table computed by hand."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from raptb.core.char_automaton import CharAutomaton, token_table


@dataclass(frozen=True)
class AThenBs:
    """``a b*`` of at most three characters; sentences have two or three."""

    start: int = 0

    def step(self, state: int, char: str) -> int | None:
        if state == 0:
            return 1 if char == "a" else None
        return state + 1 if char == "b" and state < 3 else None

    def accepting(self, state: int) -> bool:
        return state >= 2


def test_table_of_a_hand_made_automaton() -> None:
    assert isinstance(AThenBs(), CharAutomaton)
    table = token_table(AThenBs(), ["a", "b", "ab", "bb", ""])
    # breadth first from the empty text: "a" meets 1 (id 1), "ab" meets 2 (id 2), then from
    # id 1 "bb" meets 3 (id 3); "bb" from 2 would read a fourth character; "" is always -1
    assert table.next_state.tolist() == [
        [1, -1, 2, -1, -1],
        [-1, 2, -1, 3, -1],
        [-1, 3, -1, -1, -1],
        [-1, -1, -1, -1, -1],
    ]
    assert table.mask[:, -1].tolist() == [False, False, True, True]
    assert np.array_equal(table.mask[:, :-1], table.next_state >= 0)
    assert table.num_states == 4


@dataclass(frozen=True)
class Pairs:
    """States that are tuples (any hashable): the characters read so far, up to two."""

    start: tuple[str, ...] = ()

    def step(self, state: tuple[str, ...], char: str) -> tuple[str, ...] | None:
        return (*state, char) if len(state) < 2 else None

    def accepting(self, state: tuple[str, ...]) -> bool:
        return len(state) == 2


def test_states_may_be_any_hashable_and_are_bounded() -> None:
    table = token_table(Pairs(), ["x", "y"])
    assert table.num_states == 1 + 2 + 4
    assert table.mask[:, -1].sum() == 4
    with pytest.raises(ValueError, match="more than 6 states"):
        token_table(Pairs(), ["x", "y"], max_states=6)
