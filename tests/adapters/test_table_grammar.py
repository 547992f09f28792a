"""adapters.lm.table_grammar and Expr24's automaton against xgrammar's matchers.

The reference is ``GrammarBatch`` (xgrammar) on the task's own EBNF: along random walks of legal
tokens (allowed or not), for several length bounds and two tokenizers (characters, and a BPE
whose legal tokens span several characters), the table's masks, packed masks, stop bits and
accept results equal the matchers'; exhaustively on the first four characters. Rollouts through
the table equal rollouts through the matchers on every decoding path.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.adapters.lm.grammar import GrammarBatch, unpack_bitmask
from raptb.adapters.lm.table_grammar import TableGrammarBatch, pack_mask
from raptb.adapters.tasks.expr24.task import Expr24Automaton, Expr24Task, expr24_grammar
from raptb.core.char_automaton import token_table
from tests.adapters.test_grammar import LEGAL, TEXTS
from tests.adapters.test_policy import PROMPT, make_policy

BOUNDS = [(3, 9), (1, 9), (3, 5), (5, 8), (9, 9), (1, 1), (2, 12)]


def batches(name: str, bounds: tuple[int, int], n: int) -> tuple[TableGrammarBatch, GrammarBatch]:
    automaton = Expr24Automaton(*bounds)
    table = TableGrammarBatch(token_table(automaton, TEXTS[name]), LEGAL[name], n)
    return table, GrammarBatch(expr24_grammar(*bounds), LEGAL[name], TEXTS[name], n)


def unpacked(batch: TableGrammarBatch | GrammarBatch, packed: torch.Tensor) -> torch.Tensor:
    """The first L + 1 bits of each row (xgrammar leaves the bits past them set or clear)."""
    return unpack_bitmask(packed, batch.num_legal + 1)


def assert_same_masks(table: TableGrammarBatch, matchers: GrammarBatch) -> None:
    assert torch.equal(table.next_mask(), matchers.next_mask())
    assert torch.equal(
        unpacked(table, table.next_bitmask()), unpacked(matchers, matchers.next_bitmask())
    )
    assert torch.equal(table.stop_mask(), matchers.stop_mask())


@pytest.mark.parametrize("name", ["char", "bpe"])
@pytest.mark.parametrize("bounds", BOUNDS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_masks_and_accepts_equal_the_matchers_along_random_walks(
    name: str, bounds: tuple[int, int], data: st.DataObject
) -> None:
    n = 3
    table, matchers = batches(name, bounds, n)
    legal = LEGAL[name]
    for _ in range(data.draw(st.integers(1, 12))):
        assert_same_masks(table, matchers)
        mask = matchers.next_mask()
        rows, tokens = [], []
        for row in range(n):
            allowed = np.flatnonzero(mask[row, :-1].numpy()).tolist()
            # mostly an allowed token, sometimes any legal one (a rejection leaves the row as is)
            pool = allowed if allowed and data.draw(st.integers(0, 3)) else range(len(legal))
            rows.append(row)
            tokens.append(legal[data.draw(st.sampled_from(list(pool)))])
        assert table.accept_many(rows, tokens) == matchers.accept_many(rows, tokens)
    assert_same_masks(table, matchers)
    table.reset()
    matchers.reset()
    assert_same_masks(table, matchers)


@pytest.mark.parametrize("bounds", BOUNDS)
def test_every_text_of_four_characters_or_fewer(bounds: tuple[int, int]) -> None:
    texts = TEXTS["char"]
    for depth in range(5):
        words = list(itertools.product(range(len(texts)), repeat=depth))
        table, matchers = batches("char", bounds, len(words))
        legal = LEGAL["char"]
        for k in range(depth):
            rows = list(range(len(words)))
            tokens = [legal[word[k]] for word in words]
            assert table.accept_many(rows, tokens) == matchers.accept_many(rows, tokens)
        assert_same_masks(table, matchers)


def test_single_accepts_and_partial_fills_equal_the_matchers() -> None:
    table, matchers = batches("bpe", (3, 9), 4)
    legal = LEGAL["bpe"]
    for token in legal[:40]:
        for row in (0, 2):
            assert table.accept(row, token) == matchers.accept(row, token)
    assert not table.accept(1, -5) and not matchers.accept(1, -5)  # outside the legal list
    table.next_bitmask()
    matchers.next_bitmask()
    for token, row in zip(legal[40:42], (0, 2), strict=True):  # rows 0 and 2 move on ...
        assert table.accept(row, token) == matchers.accept(row, token)
    filled = [batch.fill_bitmask([2, 0]) for batch in (table, matchers)]  # ... and are filled
    assert torch.equal(unpacked(table, filled[0]), unpacked(matchers, filled[1]))
    for row in range(4):
        assert torch.equal(table.allowed(row), matchers.allowed(row))
        assert table.can_stop(row) == matchers.can_stop(row)
    with pytest.raises(ValueError, match="legal_ids"):
        table.accept_many([0], [-5])


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 5), width=st.integers(1, 70), seed=st.integers(0, 2**31 - 1))
def test_pack_mask_inverts_unpack_bitmask(rows: int, width: int, seed: int) -> None:
    mask = np.random.default_rng(seed).random((rows, width)) < 0.5
    packed = pack_mask(mask)
    assert packed.dtype == np.int32 and packed.shape == (rows, (width + 31) // 32)
    assert np.array_equal(unpack_bitmask(torch.from_numpy(packed), width).numpy(), mask)


def test_the_task_declares_its_automaton() -> None:
    task = Expr24Task(min_length=5, max_length=7)
    assert task.automaton == Expr24Automaton(5, 7)


@pytest.mark.parametrize("decode", ["eager", "compiled", "static"])
def test_rollouts_through_the_table_equal_rollouts_through_the_matchers(decode: str) -> None:
    policy = make_policy(expr24_grammar(3, 9), seed=2, logit_scale=4.0)
    policy.decode = decode
    rollouts = []
    for automaton in (None, Expr24Automaton(3, 9)):
        policy.automaton = automaton
        gen = torch.Generator().manual_seed(5)
        rollouts.append(policy.sample(PROMPT, 24, min_length=3, max_length=9, generator=gen))
        rollouts.append(gen.get_state())
    (matched, matched_gen), (tabled, tabled_gen) = rollouts[:2], rollouts[2:]
    assert isinstance(policy.grammar_batch(24), TableGrammarBatch)
    assert matched.rows == tabled.rows and matched.texts == tabled.texts
    assert len(set(matched.texts)) > 5  # the rows differ: the masks were exercised
    assert torch.equal(matched.length, tabled.length)
    assert torch.allclose(matched.log_pf, tabled.log_pf, rtol=0, atol=1e-6)
    assert torch.allclose(matched.log_pterm, tabled.log_pterm, rtol=0, atol=1e-6)
    assert torch.equal(matched_gen, tabled_gen)
