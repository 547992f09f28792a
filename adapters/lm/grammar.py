"""Grammar-constrained decoding with xgrammar over the legal sub-vocabulary.

The task's EBNF (xgrammar dialect, ``root ::= ...``) is compiled against a ``TokenizerInfo`` whose
vocabulary is the L legal tokens only (sub-id j is full-vocabulary id ``legal_ids[j]``, with the
token's in-context text) plus one stop token at sub-id L. Filling a next-token mask therefore costs
O(L) instead of O(V): for Expr24, 13 tokens rather than a model's full vocabulary (49,152 for
SmolLM2). The stop bit of the mask is set exactly where the text accepted so far is a complete
sentence of the grammar.

``GrammarBatch`` holds one matcher per rollout row. Masks are returned over the sub-vocabulary:
``allowed_mask()`` is a bool tensor [B, L] (column j = legal_ids[j]), ``stop_mask()`` a bool
tensor [B], and ``next_mask()`` both side by side, [B, L + 1]. ``next_bitmask()`` and
``fill_bitmask(rows)`` give the same masks packed, as xgrammar fills them: int32 [B, W],
W = ceil((L + 1) / 32), bit j % 32 of word j // 32 for sub-id j, filled for all rows at once in
xgrammar's C++ (``BatchGrammarMatcher``, ``max_threads`` threads), in a buffer that can be pinned
so that one non-blocking copy per step moves it to the GPU, where ``unpack_bitmask`` expands it.
Compiled grammars are cached per (sub-vocabulary texts, grammar text), which is all a compilation
depends on, so every tokenizer with the same legal texts shares one compilation.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    import xgrammar as xgr

# The stop token's text in the sub-vocabulary: xgrammar treats stop ids separately from text, and
# an empty text can never match grammar content.
_STOP_TEXT = ""


@functools.lru_cache(maxsize=64)
def compile_grammar(texts: tuple[str, ...], grammar: str) -> xgr.CompiledGrammar:
    """Compile ``grammar`` for a vocabulary of ``texts`` followed by one stop token (id len(texts)).

    Raises ValueError naming ``grammar`` when the EBNF does not parse.
    """
    if not texts:
        raise ValueError("legal_ids: the legal sub-vocabulary is empty")
    import xgrammar as xgr  # at the first grammar: a task lookup or the CLI does not import it

    info = xgr.TokenizerInfo([*texts, _STOP_TEXT], xgr.VocabType.RAW, stop_token_ids=[len(texts)])
    try:
        return xgr.GrammarCompiler(info, max_threads=1).compile_grammar(grammar)
    except RuntimeError as exc:
        raise ValueError(f"grammar: not a valid EBNF grammar ({exc})") from exc


def packed_width(width: int) -> int:
    """Int32 words of a packed mask over ``width`` tokens: ceil(width / 32)."""
    return (width + 31) // 32


_LITTLE_ENDIAN = sys.byteorder == "little"


def unpack_bitmask(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """Bool [B, width] from a packed int32 bitmask [B, ceil(width / 32)] (bit j % 32 of word
    j // 32 is token j), on the bitmask's device.

    On the CPU of a little-endian machine (byte b of a word holds its bits 8b..8b+7) by NumPy's
    ``unpackbits`` over the words' bytes: one call where torch takes seven operations (in the
    main job's rollout, 23 against 109 us a column, measured alternating in one trainer)."""
    if bitmask.device.type == "cpu" and _LITTLE_ENDIAN:
        packed = np.ascontiguousarray(bitmask.numpy()).view(np.uint8)
        bits = np.unpackbits(packed, axis=1, count=width, bitorder="little")
        return torch.from_numpy(bits.view(bool))
    return _unpack_with_torch(bitmask, width)


def _unpack_with_torch(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """``unpack_bitmask`` by torch's operations, on any device and byte order."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    rows, words = bitmask.shape
    return ((bitmask.unsqueeze(-1) >> bits) & 1).reshape(rows, 32 * words)[:, :width].bool()


class RowMasks:
    """Reads of a batch's next-token masks (``next_mask()``, bool [B, L + 1], and ``num_legal``,
    L), shared by the matchers' batch and the automaton table's (adapters.lm.table_grammar)."""

    num_legal: int

    def _set_rows(self, legal_ids: Sequence[int], batch_size: int, pin_memory: bool) -> None:
        """The legal tokens' sub-ids and the packed mask buffer of ``batch_size`` rows."""
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        self.legal_ids = [int(i) for i in legal_ids]
        self.num_legal = len(self.legal_ids)
        self._sub_id = {full: sub for sub, full in enumerate(self.legal_ids)}
        # all bits set, as xgrammar allocates it: a row never filled allows everything
        self._bitmask = torch.full(
            (batch_size, packed_width(self.num_legal + 1)),
            -1,
            dtype=torch.int32,
            pin_memory=pin_memory,
        )

    def next_mask(self) -> torch.Tensor:
        raise NotImplementedError

    def _accept_sub(self, row: int, sub: int) -> bool:
        raise NotImplementedError

    def accept(self, row: int, token_id: int) -> bool:
        """Advance row ``row`` by the full-vocabulary token ``token_id``; False if rejected (the
        row's state is then unchanged, and a token outside the legal list is always rejected)."""
        sub = self._sub_id.get(int(token_id))
        return False if sub is None else self._accept_sub(row, sub)

    def _subs(self, token_ids: Sequence[int]) -> list[int]:
        """The sub-ids of full-vocabulary ``token_ids``; ValueError for one outside the list."""
        subs = [self._sub_id.get(int(t), -1) for t in token_ids]
        if any(s < 0 for s in subs):
            raise ValueError("token_ids: every token must be in legal_ids")
        return subs

    def allowed_mask(self) -> torch.Tensor:
        """Bool [B, L]: legal token j may follow each row's text and keep it a grammar prefix."""
        return self.next_mask()[:, : self.num_legal]

    def stop_mask(self) -> torch.Tensor:
        """Bool [B]: each row's text is a complete sentence of the grammar."""
        return self.next_mask()[:, self.num_legal]

    def allowed(self, row: int) -> torch.Tensor:
        """Bool [L] mask of the legal tokens that may follow row ``row``'s text."""
        return self.allowed_mask()[row]

    def can_stop(self, row: int) -> bool:
        """Whether row ``row``'s text is a complete sentence of the grammar."""
        return bool(self.stop_mask()[row])


class GrammarBatch(RowMasks):
    """B grammar matchers over the legal sub-vocabulary, one per rollout row.

    legal_ids: full-vocabulary ids of the L legal tokens; texts: their in-context texts.
    pin_memory: keep the packed bitmask in page-locked memory (for non-blocking copies to a GPU).
    """

    def __init__(
        self,
        grammar: str,
        legal_ids: Sequence[int],
        texts: Sequence[str],
        batch_size: int,
        *,
        max_threads: int = 1,
        pin_memory: bool = False,
    ) -> None:
        if len(legal_ids) != len(texts):
            raise ValueError(
                f"texts: expected one text per legal id ({len(legal_ids)}), got {len(texts)}"
            )
        self._set_rows(legal_ids, batch_size, pin_memory)
        compiled = compile_grammar(tuple(texts), grammar)
        import xgrammar as xgr

        self._matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch_size)]
        self._batch = xgr.BatchGrammarMatcher(max_threads)
        self._stale = True

    @property
    def batch_size(self) -> int:
        return len(self._matchers)

    def reset(self) -> None:
        """Return every row to the empty text (start of a rollout)."""
        for matcher in self._matchers:
            matcher.reset()
        self._stale = True

    def next_mask(self) -> torch.Tensor:
        """Bool [B, L + 1] next-token mask of every row (column j < L: legal token j may follow;
        column L: the text is complete, stop allowed), refilled only after an accept or reset.
        The tensor is the batch's own buffer: read it, do not write to it."""
        if self._stale:
            self._unpacked = unpack_bitmask(self.next_bitmask(), self.num_legal + 1)
        return self._unpacked

    def next_bitmask(self) -> torch.Tensor:
        """``next_mask()`` packed: int32 [B, W] (module docstring), every row filled, refilled
        only after an accept or a reset. The batch's own buffer: read it (or copy it), do not
        write to it."""
        if self._stale:
            self._batch.batch_fill_next_token_bitmask(self._matchers, self._bitmask)
            self._stale = False
        return self._bitmask

    def fill_bitmask(self, rows: Sequence[int]) -> torch.Tensor:
        """The packed buffer of ``next_bitmask()`` with the masks of ``rows`` filled now (one
        batched call into xgrammar); the other rows keep whatever mask they held before."""
        matchers = [self._matchers[row] for row in rows]
        if matchers:
            self._batch.batch_fill_next_token_bitmask(matchers, self._bitmask, list(rows))
        return self._bitmask

    def _accept_sub(self, row: int, sub: int) -> bool:
        self._stale = True
        return self._matchers[row].accept_token(sub)

    def accept_many(self, rows: Sequence[int], token_ids: Sequence[int]) -> list[bool]:
        """``accept`` for several rows at once. A loop over the matchers: 1.3-1.7x faster than
        xgrammar's ``batch_accept_token`` from 8 to 512 rows (one thread; 64 against 97 us for the
        main job's 34 rows, caches cold as in a training step)."""
        subs = self._subs(token_ids)
        self._stale = True
        matchers = self._matchers
        return [matchers[r].accept_token(s) for r, s in zip(rows, subs, strict=True)]
