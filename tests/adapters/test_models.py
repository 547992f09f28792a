"""The embedded tiny model and character tokenizer; loading from a local directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from raptb.adapters.lm.models import (
    PRINTABLE_ASCII,
    build_char_tokenizer,
    build_tiny_model,
    load_model_and_tokenizer,
)
from raptb.adapters.lm.tokens import legal_token_ids, special_token_ids, stop_token_id

TOKENIZER = build_char_tokenizer()


def test_char_tokenizer_vocabulary() -> None:
    assert len(PRINTABLE_ASCII) == 95
    assert len(TOKENIZER) == 98
    for i, c in enumerate(PRINTABLE_ASCII):
        assert TOKENIZER.convert_tokens_to_ids(c) == i
    assert TOKENIZER.eos_token == "<eos>" and TOKENIZER.eos_token_id == 95
    assert TOKENIZER.pad_token == "<pad>" and TOKENIZER.pad_token_id == 96
    assert special_token_ids(TOKENIZER) == {95, 96, 97}
    assert stop_token_id(TOKENIZER) == 95


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=PRINTABLE_ASCII, max_size=40))
def test_char_tokenizer_one_token_per_character(text: str) -> None:
    # a special token's own spelling encodes to that special token (the usual HF behaviour)
    assume(not any(s in text for s in ("<eos>", "<pad>", "<unk>")))
    ids = TOKENIZER.encode(text, add_special_tokens=False)
    assert ids == [ord(c) - 32 for c in text]
    assert TOKENIZER.decode(ids) == text


def test_char_tokenizer_unknown_character_and_special_spellings() -> None:
    assert TOKENIZER.encode("1\n2", add_special_tokens=False) == [17, 97, 18]
    assert TOKENIZER.encode("1<pad>", add_special_tokens=False) == [17, 96]


def test_legal_tokens_of_char_tokenizer() -> None:
    legal = legal_token_ids(TOKENIZER, "123456789+-*/")
    assert legal == sorted(ord(c) - 32 for c in "123456789+-*/")
    assert legal_token_ids(TOKENIZER, None) == list(range(95))
    assert 14 not in legal_token_ids(TOKENIZER, ".,", stop_id=14)  # "." as the stop token


def test_tiny_model_is_deterministic_in_seed_and_spares_global_rng() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, _ = load_model_and_tokenizer("tiny", seed=0)
    assert torch.equal(torch.rand(1), expected_next)
    b, _ = load_model_and_tokenizer("tiny", seed=0)
    c, _ = load_model_and_tokenizer("tiny", seed=1)
    wa, wb, wc = (m.transformer.h[0].attn.c_attn.weight for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)
    cfg = a.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions) == (2, 64, 4, 128)
    assert cfg.vocab_size == len(TOKENIZER)
    assert a.transformer.wpe.weight.shape == (128, 64)
    assert torch.equal(a.transformer.wpe.weight, b.transformer.wpe.weight)


def test_tiny_model_extra_positions_leave_the_64_position_model_unchanged() -> None:
    small = build_tiny_model(TOKENIZER, seed=3, n_positions=64)
    big = build_tiny_model(TOKENIZER, seed=3)
    assert small.config.n_positions == 64 and big.config.n_positions == 128
    small_state, big_state = small.state_dict(), big.state_dict()
    assert small_state.keys() == big_state.keys()
    for name, value in small_state.items():
        other = big_state[name]
        assert torch.equal(value, other[: len(value)] if name.endswith("wpe.weight") else other)
    # a 100-token input runs, and its first 64 positions see the 64-position model's function
    ids = torch.randint(0, 95, (2, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        long_logits = big(input_ids=ids).logits
        short_logits = small(input_ids=ids[:, :64]).logits
    torch.testing.assert_close(long_logits[:, :64], short_logits)


def test_tiny_model_dtype() -> None:
    model, _ = load_model_and_tokenizer("tiny", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_save_load_round_trip(tmp_path: Path) -> None:
    model, tokenizer = load_model_and_tokenizer("tiny", seed=3)
    with torch.no_grad():
        model.transformer.wte.weight.add_(0.5)  # a change the fresh initialiser cannot reproduce
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded, loaded_tok = load_model_and_tokenizer(str(tmp_path))
    text = "3*8+1-1"
    assert loaded_tok.encode(text) == tokenizer.encode(text)
    assert loaded_tok.eos_token_id == tokenizer.eos_token_id
    assert loaded_tok.pad_token_id == tokenizer.pad_token_id
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_unloadable_names_raise_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model: name"):
        load_model_and_tokenizer("")
    with pytest.raises(ValueError, match="local directory"):
        load_model_and_tokenizer("not a valid id//x")
    with pytest.raises(ValueError, match="cannot load"):
        load_model_and_tokenizer(str(tmp_path))  # a directory without a saved model
