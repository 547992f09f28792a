"""Legal-token derivation on SentencePiece-style ("▁") and byte-level ("Ġ") vocabularies."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from raptb.adapters.lm.models import build_char_tokenizer
from raptb.adapters.lm.tokens import legal_token_ids, stop_token_id, token_texts

CORPUS = ["1+2*3 and 4-5/6 or 7+8 then 9*9"] * 50
ALPHABET = "123456789+-*/"


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=80, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
        ),
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", bos_token="<s>", unk_token="<unk>"
    )


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


@pytest.mark.parametrize(
    ("build", "marker"), [(metaspace_tokenizer, "▁"), (byte_level_tokenizer, "Ġ")]
)
def test_space_markers_are_spaces_in_context(
    build: Callable[[], PreTrainedTokenizerFast], marker: str
) -> None:
    tok = build()
    ids = list(range(len(tok)))
    pieces = tok.convert_ids_to_tokens(ids)
    texts = token_texts(tok, ids)
    # reference: the raw piece with its marker read as a space (these vocabularies are ASCII)
    marked = [(i, p.replace(marker, " ")) for i, p in enumerate(pieces) if marker in p]
    assert any(text.strip() and set(text.strip()) <= set(ALPHABET) for _, text in marked)
    for i, expected in marked:
        assert texts[i] == expected
    legal = legal_token_ids(tok, ALPHABET)
    special = {tok.convert_tokens_to_ids(s) for s in tok.all_special_tokens}
    expected_legal = [
        i
        for i, p in enumerate(pieces)
        if i not in special and marker not in p and p and set(p) <= set(ALPHABET)
    ]
    assert legal == expected_legal
    assert all(marker not in pieces[i] for i in legal)  # " 7" is not an Expr24 token
    with_space = legal_token_ids(tok, ALPHABET + " ")
    assert set(legal) < set(with_space)


def test_stop_token_id() -> None:
    tok = build_char_tokenizer()
    assert stop_token_id(tok) == tok.eos_token_id
    assert stop_token_id(tok, ".") == 14
    with pytest.raises(ValueError, match="stop"):
        stop_token_id(tok, "ab")
    with pytest.raises(ValueError, match="alphabet"):
        legal_token_ids(tok, "")
