"""Grammar-constrained decoding from a task's automaton table (``TableGrammarBatch``).

Where a task declares its grammar as an automaton over characters (core.char_automaton), each
row's next-token mask is one row of the automaton's token table, indexed by the row's state, and
accepting a token is one table lookup: ``GrammarBatch``'s interface (adapters.lm.grammar) without
a parser per row. Masks, stop bits and accepted tokens are those of the EBNF's matchers, which
tests hold them to; the packed form has xgrammar's layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from raptb.adapters.lm.grammar import RowMasks, packed_width
from raptb.core.char_automaton import TokenTable


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """Int32 [N, ceil(width / 32)] from bool [N, width]: bit j % 32 of word j // 32 is column j
    (xgrammar's layout; ``grammar.unpack_bitmask``'s inverse). The bits past ``width`` are
    clear; xgrammar leaves them set or clear by its own encoding, and readers unpack ``width``."""
    rows, width = mask.shape
    padded = np.zeros((rows, 32 * packed_width(width)), dtype=bool)
    padded[:, :width] = mask
    weights = np.left_shift(np.int64(1), np.arange(32, dtype=np.int64))
    words = padded.reshape(rows, packed_width(width), 32).astype(np.int64) @ weights
    return words.astype(np.uint32).view(np.int32)


class TableGrammarBatch(RowMasks):
    """B rows' states in an automaton's token table over the legal sub-vocabulary (the
    matchers' ``GrammarBatch`` interface, its mask reads shared through ``RowMasks``).

    table: the automaton's table over the L legal tokens' texts (``core.char_automaton``).
    legal_ids: full-vocabulary ids of the L legal tokens.
    pin_memory: keep the packed bitmask in page-locked memory (for non-blocking copies to a GPU).
    """

    def __init__(
        self,
        table: TokenTable,
        legal_ids: Sequence[int],
        batch_size: int,
        *,
        pin_memory: bool = False,
    ) -> None:
        if table.next_state.shape[1] != len(legal_ids):
            raise ValueError(
                f"table: {table.next_state.shape[1]} tokens, legal_ids: {len(legal_ids)}"
            )
        self._set_rows(legal_ids, batch_size, pin_memory)
        self.table = table
        self._packed = pack_mask(table.mask)
        self._state = np.zeros(batch_size, dtype=np.int64)
        # written through NumPy: no torch operation (an inference tensor where the buffer was
        # made under inference mode, as xgrammar fills it from C++)
        self._words = self._bitmask.numpy()

    @property
    def batch_size(self) -> int:
        return len(self._state)

    def reset(self) -> None:
        """Return every row to the empty text (start of a rollout)."""
        self._state[:] = 0

    def next_mask(self) -> torch.Tensor:
        """Bool [B, L + 1] next-token mask of every row (column j < L: legal token j may follow;
        column L: the text is complete, stop allowed); a new tensor each call."""
        return torch.from_numpy(self.table.mask[self._state])

    def next_bitmask(self) -> torch.Tensor:
        """``next_mask()`` packed: int32 [B, W], every row filled, in the batch's own buffer."""
        np.take(self._packed, self._state, axis=0, out=self._words)
        return self._bitmask

    def fill_bitmask(self, rows: Sequence[int]) -> torch.Tensor:
        """The packed buffer of ``next_bitmask()`` with the masks of ``rows`` filled now; the
        other rows keep whatever mask they held before."""
        index = np.asarray(rows, dtype=np.int64)
        self._words[index] = self._packed[self._state[index]]
        return self._bitmask

    def _accept_sub(self, row: int, sub: int) -> bool:
        reached = self.table.next_state[self._state[row], sub]
        if reached < 0:
            return False
        self._state[row] = reached
        return True

    def accept_many(self, rows: Sequence[int], token_ids: Sequence[int]) -> list[bool]:
        """``accept`` for several rows at once (rejected rows keep their state)."""
        subs = self._subs(token_ids)
        if len(subs) != len(rows):
            raise ValueError(f"rows ({len(rows)}) and token_ids ({len(subs)}) differ in length")
        index = np.asarray(rows, dtype=np.int64)
        reached = self.table.next_state[self._state[index], np.asarray(subs, dtype=np.int64)]
        accepted = reached >= 0
        self._state[index[accepted]] = reached[accepted]
        return accepted.tolist()
