"""Grammar masks over the legal sub-vocabulary, checked against a regex reference.

The reference language is Expr24's ``num (op num)*``: a text is a viable prefix iff it matches
PREFIX, a complete sentence iff it matches COMPLETE. Tokenizers: the character tokenizer and a
byte-level BPE trained here whose legal tokens span several characters ("+8*", "2/7").
"""

from __future__ import annotations

import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from raptb.adapters.lm.grammar import GrammarBatch, compile_grammar, packed_width, unpack_bitmask
from raptb.adapters.lm.models import build_char_tokenizer
from raptb.adapters.lm.tokens import legal_token_ids, token_texts

GRAMMAR = 'root ::= num (op num)*\nnum ::= [1-9]\nop ::= "+" | "-" | "*" | "/"'
ALPHABET = "123456789+-*/"
PREFIX = re.compile(r"([1-9]([-+*/][1-9])*[-+*/]?)?")
COMPLETE = re.compile(r"[1-9]([-+*/][1-9])*")


def build_bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with multi-character expression tokens and non-expression words."""
    rng = random.Random(0)
    corpus = [
        "".join(rng.choice("123456789") + rng.choice("+-*/") for _ in range(4)) + "7 and words"
        for _ in range(300)
    ]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


TOKENIZERS = {"char": build_char_tokenizer(), "bpe": build_bpe_tokenizer()}
LEGAL = {name: legal_token_ids(tok, ALPHABET) for name, tok in TOKENIZERS.items()}
TEXTS = {name: token_texts(TOKENIZERS[name], LEGAL[name]) for name in TOKENIZERS}


def test_bpe_fixture_has_multi_character_legal_tokens() -> None:
    texts = TEXTS["bpe"]
    assert any(len(t) >= 3 for t in texts)
    assert all(set(t) <= set(ALPHABET) for t in texts)
    # every token whose in-context text lies in the alphabet is legal, and nothing else
    tok = TOKENIZERS["bpe"]
    ids = [i for i in range(len(tok)) if i != tok.eos_token_id]
    expected = [
        i for i, t in zip(ids, token_texts(tok, ids), strict=True) if t and set(t) <= set(ALPHABET)
    ]
    assert LEGAL["bpe"] == expected


@pytest.mark.parametrize("name", ["char", "bpe"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_masks_match_regex_reference_along_random_walks(name: str, data: st.DataObject) -> None:
    legal, texts = LEGAL[name], TEXTS[name]
    batch = GrammarBatch(GRAMMAR, legal, texts, 2)
    # row 1 stays at the empty text: rows are independent
    text = ""
    for _ in range(data.draw(st.integers(1, 6))):
        allowed = batch.allowed(0).tolist()
        assert allowed == [PREFIX.fullmatch(text + t) is not None for t in texts]
        assert batch.can_stop(0) == (COMPLETE.fullmatch(text) is not None)
        assert batch.allowed(1).tolist() == [PREFIX.fullmatch(t) is not None for t in texts]
        assert not batch.can_stop(1)
        rejected = [j for j, ok in enumerate(allowed) if not ok]
        if rejected:
            j = data.draw(st.sampled_from(rejected))
            assert not batch.accept(0, legal[j])
        choices = [j for j, ok in enumerate(allowed) if ok]
        j = data.draw(st.sampled_from(choices))
        assert batch.accept(0, legal[j])
        text += texts[j]
    assert batch.can_stop(0) == (COMPLETE.fullmatch(text) is not None)


@pytest.mark.parametrize("name", ["char", "bpe"])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_packed_masks_of_chosen_rows_equal_the_row_masks(name: str, data: st.DataObject) -> None:
    # rows advance by random allowed tokens; at every step the packed fill of a random subset of
    # rows (the static rollout's) must give, bit for bit, each row's mask from next_mask (the
    # eager rollout's), and both the regex reference
    legal, texts = LEGAL[name], TEXTS[name]
    width = len(legal) + 1
    rows = data.draw(st.integers(1, 5))
    batch = GrammarBatch(GRAMMAR, legal, texts, rows, max_threads=2)
    walks = [""] * rows
    for _ in range(data.draw(st.integers(1, 6))):
        today = batch.next_mask().clone()
        for row, text in enumerate(walks):
            reference = [PREFIX.fullmatch(text + t) is not None for t in texts]
            assert today[row].tolist() == [*reference, COMPLETE.fullmatch(text) is not None]
        chosen = data.draw(st.lists(st.integers(0, rows - 1), unique=True))
        packed = batch.fill_bitmask(chosen).clone()
        assert packed.shape == (rows, packed_width(width)) and packed.dtype == torch.int32
        unpacked = unpack_bitmask(packed, width)
        for row in chosen:
            assert torch.equal(unpacked[row], today[row])
            bits = [bool((int(packed[row, j // 32]) >> (j % 32)) & 1) for j in range(width)]
            assert bits == today[row].tolist()
        movers = [
            row
            for row in data.draw(st.lists(st.integers(0, rows - 1), unique=True))
            if today[row, :-1].any()
        ]
        picks = [
            data.draw(st.sampled_from(torch.nonzero(today[row, :-1]).flatten().tolist()))
            for row in movers
        ]
        assert batch.accept_many(movers, [legal[j] for j in picks]) == [True] * len(movers)
        for row, j in zip(movers, picks, strict=True):
            walks[row] += texts[j]


def test_accept_many_reset_and_foreign_tokens() -> None:
    tok = TOKENIZERS["char"]
    legal, texts = LEGAL["char"], TEXTS["char"]
    batch = GrammarBatch(GRAMMAR, legal, texts, 3)
    ids = {c: tok.convert_tokens_to_ids(c) for c in "3+8x"}
    assert batch.accept_many([0, 2], [ids["3"], ids["8"]]) == [True, True]
    assert batch.stop_mask().tolist() == [True, False, True]
    assert not batch.accept(0, ids["x"])  # not a legal token
    assert not batch.accept(0, tok.eos_token_id)
    assert batch.accept(0, ids["+"])
    assert batch.stop_mask().tolist() == [False, False, True]
    with pytest.raises(ValueError, match="token_ids"):
        batch.accept_many([1], [ids["x"]])
    batch.reset()
    assert batch.stop_mask().tolist() == [False, False, False]
    digits = [PREFIX.fullmatch(t) is not None for t in texts]
    assert batch.allowed_mask().tolist() == [digits] * 3


def test_compiled_on_sub_vocabulary_and_cached() -> None:
    texts = tuple(TEXTS["bpe"])
    compiled = compile_grammar(texts, GRAMMAR)
    assert compiled.tokenizer_info.vocab_size == len(texts) + 1
    assert compile_grammar(texts, GRAMMAR) is compiled
    assert compile_grammar(tuple(TEXTS["char"]), GRAMMAR) is not compiled


def test_bad_inputs() -> None:
    legal, texts = LEGAL["char"], TEXTS["char"]
    with pytest.raises(ValueError, match="grammar"):
        GrammarBatch("root ::= (", legal, texts, 1)
    with pytest.raises(ValueError, match="texts"):
        GrammarBatch(GRAMMAR, legal, texts[:-1], 1)
    with pytest.raises(ValueError, match="batch_size"):
        GrammarBatch(GRAMMAR, legal, texts, 0)
    with pytest.raises(ValueError, match="legal_ids"):
        compile_grammar((), GRAMMAR)


@given(st.data())
@settings(max_examples=60)
def test_unpack_bitmask_on_random_words(data: st.DataObject) -> None:
    """Both ways of unpacking (NumPy's on the CPU, torch's elsewhere) against the bits read one
    by one: bit j % 32 of word j // 32, sign bits and partial last words included."""
    from raptb.adapters.lm.grammar import _unpack_with_torch

    rows, words = data.draw(st.integers(0, 5)), data.draw(st.integers(1, 4))
    width = data.draw(st.integers(1, 32 * words))
    values = data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=rows * words,
                                max_size=rows * words))  # fmt: skip
    packed = torch.tensor(values, dtype=torch.int32).reshape(rows, words)
    reference = [
        [bool((values[r * words + j // 32] >> (j % 32)) & 1) for j in range(width)]
        for r in range(rows)
    ]
    for unpacked in (unpack_bitmask(packed, width), _unpack_with_torch(packed, width)):
        assert unpacked.dtype == torch.bool and tuple(unpacked.shape) == (rows, width)
        assert unpacked.tolist() == reference
