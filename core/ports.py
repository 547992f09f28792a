"""Ports: the interfaces that adapters implement and the core and app depend on.

The core never imports an adapter; it only names these protocols. A task (Expr24, SMILES, a
user's own reward) describes what may be generated and how a generated text is scored; a
similarity backend turns items into a pairwise similarity matrix for SubM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from raptb.core.char_automaton import CharAutomaton


@dataclass(frozen=True)
class Score:
    """Task-only score of one terminated text.

    value: S(x), the task score (Expr24: 1.0 when the expression equals 24; SMILES: QED).
    valid: whether x is feasible (parses / sanitises); an invalid text has value 0.0.
    """

    value: float
    valid: bool


def check_length_bounds(min_length: int, max_length: int) -> None:
    """The shared validation of a task's generated-length bounds: 1 <= min_length <= max_length."""
    if min_length < 1:
        raise ValueError(f"min_length must be >= 1, got {min_length}")
    if max_length < min_length:
        raise ValueError(f"max_length must be >= min_length ({min_length}), got {max_length}")


@runtime_checkable
class Task(Protocol):
    """What may be generated for a prompt and how a generated text is scored.

    Attributes:
        name: short identifier (``expr24``, ``smiles``...).
        alphabet: characters a generated token may consist of; used to derive the legal-token
            list from any tokenizer. ``None`` allows every token.
        grammar: EBNF (xgrammar dialect) that every generated text must be a prefix of, with stop
            allowed only where the text is a complete sentence; ``None`` disables the grammar.
        min_length, max_length: bounds on the number of generated tokens before the stop.

    Optional capabilities (the trainer uses them where a task has them; :class:`TaskCapabilities`
    reads them, the one place that looks for them):

    - ``stop``: the text of the stop token (CommonGen: ``"."``); without it, the tokenizer's EOS.
    - ``score_cache_size``: the number of (prompt, text) scores the trainer keeps cached.
    - ``item_features(prompt, text)`` returning an object with ``features`` (a 1-D array for the
      replay similarity backend) and ``canonical`` (a dedup key or None); the trainer attaches
      them to replay items (SMILES: the merged molecule's fingerprint).
    - ``unchecked_score(prompt, text) -> Score``: ``score`` without the task's own guard against
      a non-finite value, so the reward caller can count NaN and inf rewards (a user's reward).
    - ``prefix_score(prompt, text) -> Score``: the score of an unfinished prefix x_1..x_k with
      k < tau, when it differs from that of the same text finished (AMP: 0, the reward is
      terminal-only; CommonGen: no hard bonus and no validity test before the end). Without it
      every prefix is scored by ``score``.
    - ``score_batch(prompt, texts) -> list[Score]``: ``score`` of many finished texts at once
      (one per text, in order), for a reward that is much faster batched (AMP's oracle).
    - ``automaton``: the grammar as a ``core.char_automaton.CharAutomaton`` accepting the same
      sentences with the same viable prefixes, for a regular grammar (Expr24); rollouts then
      read their masks from its table instead of running the EBNF's parser per row.
    """

    name: str
    alphabet: str | None
    grammar: str | None
    min_length: int
    max_length: int

    def prompts(self) -> list[str]:
        """The prompts (conditioning texts) training cycles through."""
        ...

    def score(self, prompt: str, text: str) -> Score:
        """Score the finished generated ``text`` (without prompt or stop token) for ``prompt``."""
        ...


ScoreFn = Callable[[str, str], Score]


@dataclass(frozen=True)
class TaskCapabilities:
    """The optional capabilities of a :class:`Task` (see its docstring), read once by :meth:`of`:
    each is the task's own or None (``score``: ``unchecked_score`` where the task has it, else
    ``score``)."""

    stop: str | None
    score_cache_size: int | None
    score: ScoreFn
    prefix_score: ScoreFn | None
    score_batch: Callable[[str, list[str]], Sequence[Score]] | None
    item_features: Callable[[str, str], Any] | None
    automaton: CharAutomaton | None = None

    @classmethod
    def of(cls, task: Task) -> TaskCapabilities:
        """The capabilities ``task`` declares."""

        def method(name: str) -> Any:
            found = getattr(task, name, None)
            return found if callable(found) else None

        return cls(
            stop=getattr(task, "stop", None),
            score_cache_size=getattr(task, "score_cache_size", None),
            score=method("unchecked_score") or task.score,
            prefix_score=method("prefix_score"),
            score_batch=method("score_batch"),
            item_features=method("item_features"),
            automaton=getattr(task, "automaton", None),
        )


@runtime_checkable
class Similarity(Protocol):
    """Pairwise similarity in [0, 1] between replay items, used by SubM's diversity term.

    It must be symmetric. A backend may declare ``symmetric = True`` when pairwise(a, b)[i, j]
    equals pairwise(b, a)[j, i] bit for bit; ``SimilarityCache`` then skips checking it.
    """

    def pairwise(self, a: Sequence[object], b: Sequence[object]) -> np.ndarray:
        """Return a float array of shape [len(a), len(b)] with values in [0, 1]."""
        ...
