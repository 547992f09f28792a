"""A task's grammar as a deterministic automaton over characters (``CharAutomaton``), and its
table over a vocabulary of token texts (``token_table``).

A task whose grammar is a regular language (Expr24: ``num (op num)*`` of bounded length) may
declare it as an automaton beside its EBNF: the optional ``automaton`` capability
(core.ports.TaskCapabilities). A rollout then reads each row's next-token mask from a table
indexed by the row's state (adapters.lm.table_grammar) instead of running a parser per row.

The automaton must take a character only where the text stays a prefix of some sentence (as the
EBNF's masks do: a character after which no sentence can be completed is rejected), and accept
exactly the sentences. Tests hold each declared automaton to its EBNF's masks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class CharAutomaton(Protocol):
    """A deterministic automaton over characters.

    start: the state of the empty text.
    step(state, char): the state after ``char``, or None where the text would no longer be a
        prefix of a sentence.
    accepting(state): whether the text read so far is a complete sentence.
    """

    start: Hashable

    def step(self, state: Hashable, char: str) -> Hashable | None: ...

    def accepting(self, state: Hashable) -> bool: ...


@dataclass(frozen=True)
class TokenTable:
    """An automaton's states reachable by whole tokens, numbered in the order a breadth-first
    walk from the start meets them (state 0: the empty text).

    next_state: int64 [S, L], the state after token j from state s; -1 where the token is
        rejected (a token of empty text is always rejected, as a grammar matcher rejects it).
    mask: bool [S, L + 1], ``next_state >= 0`` and, in column L, whether s accepts (stop).
    """

    next_state: np.ndarray
    mask: np.ndarray

    @property
    def num_states(self) -> int:
        return int(self.next_state.shape[0])


def token_table(
    automaton: CharAutomaton, texts: Sequence[str], max_states: int = 1 << 16
) -> TokenTable:
    """The table of ``automaton`` over tokens of texts ``texts`` (a token is read as its
    characters in order). ValueError when more than ``max_states`` states are reachable."""
    index: dict[Hashable, int] = {automaton.start: 0}
    order: list[Hashable] = [automaton.start]
    rows: list[list[int]] = []
    for state in order:  # grows while it is walked: breadth first
        row = []
        for text in texts:
            reached: Hashable | None = state if text else None
            for char in text:
                reached = automaton.step(reached, char)
                if reached is None:
                    break
            if reached is None:
                row.append(-1)
                continue
            if reached not in index:
                if len(order) == max_states:
                    raise ValueError(f"automaton: more than {max_states} states reachable")
                index[reached] = len(order)
                order.append(reached)
            row.append(index[reached])
        rows.append(row)
    next_state = np.array(rows, dtype=np.int64).reshape(len(order), len(texts))
    accepting = np.array([bool(automaton.accepting(state)) for state in order])
    mask = np.concatenate([next_state >= 0, accepting[:, None]], axis=1)
    return TokenTable(next_state=next_state, mask=mask)
