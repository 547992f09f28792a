"""Oracle replay: uniform draws from a given solution set (Expr24's enumerated answers)."""

from __future__ import annotations

from collections.abc import Sequence

from raptb.core.replay.base import ReplayBuffer
from raptb.core.replay.item import ReplayItem


class OracleBuffer(ReplayBuffer):
    """Oracle: uniform draws from a given solution set (``add`` extends it, exact dups dropped)."""

    kind = "oracle"
    oracle = True

    def __init__(self, items: Sequence[ReplayItem] = ()) -> None:
        super().__init__()
        self.add(items)

    def add_to_prompt(self, prompt: str, items: list[ReplayItem]) -> None:
        store = self._stores.setdefault(prompt, [])
        seen = {it.tokens for it in store}
        for it in items:
            if it.tokens not in seen:
                seen.add(it.tokens)
                store.append(it)
