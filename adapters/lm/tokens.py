"""Token vocabulary helpers: the legal-token list of a task and the stop token, for any tokenizer.

A task names an alphabet (Expr24: ``"123456789+-*/"``); the legal tokens of a tokenizer are the
non-special tokens whose text is non-empty and consists only of alphabet characters. The text of a
token is its text *in context*, i.e. what it adds when it follows other text:

    text(i) = decode([a..., i]) minus the prefix decode([a...])

for an anchor ``a`` (the encoding of a plain character). Decoding a token alone is wrong for
SentencePiece vocabularies, whose decoders strip the leading space of the first token ("▁1"
decodes to "1" alone but adds " 1" after other text). Byte-level markers ("Ġ" for a space) and
byte-fallback pieces ("<0x31>" for "1") are resolved by the tokenizer's own decoder. A piece that is
only part of a UTF-8 character decodes to U+FFFD and is never legal: it is not text on its own.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

_ANCHOR_CANDIDATES = ("a", "x", "0", "A", "1")


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of every special token: the named ones (eos, pad...) and added tokens marked special."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
    return ids


def _anchor_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], str]:
    """A short token sequence that decodes to exactly its source text (the context prefix)."""
    for text in _ANCHOR_CANDIDATES:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if ids and _decode(tokenizer, ids) == text:
            return ids, text
    raise ValueError(
        "tokenizer: cannot find an anchor token (none of "
        f"{list(_ANCHOR_CANDIDATES)} round-trips through encode/decode)"
    )


def _decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def token_texts(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
    """Text each token id adds after other text (see the module docstring); "" if it adds none.

    A token whose in-context decoding does not extend the anchor's text (a decoder that merges
    across the boundary) gets "", which makes it illegal for every alphabet.
    """
    anchor, anchor_text = _anchor_ids(tokenizer)
    decoded = tokenizer.batch_decode(
        [[*anchor, i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return [d[len(anchor_text) :] if d.startswith(anchor_text) else "" for d in decoded]


def legal_token_ids(
    tokenizer: PreTrainedTokenizerBase, alphabet: str | None, *, stop_id: int | None = None
) -> list[int]:
    """Ids (ascending) of the non-special tokens whose text is non-empty and within ``alphabet``.

    ``alphabet=None`` admits every non-special token with a complete text. ``stop_id`` is excluded
    too, so that a stop token that is also a plain character (CommonGen's ".") is only the stop
    action.
    """
    if alphabet is not None and not alphabet:
        raise ValueError("alphabet: must be None or a non-empty string")
    excluded = special_token_ids(tokenizer)
    if stop_id is not None:
        excluded.add(stop_id)
    candidates = [i for i in range(len(tokenizer)) if i not in excluded]
    allowed = None if alphabet is None else set(alphabet)
    return [
        i
        for i, text in zip(candidates, token_texts(tokenizer, candidates), strict=True)
        if text and "\ufffd" not in text and (allowed is None or set(text) <= allowed)
    ]


def stop_token_id(tokenizer: PreTrainedTokenizerBase, stop: str | None = None) -> int:
    """Id of the stop action: the tokenizer's EOS token, or the single token that encodes ``stop``.

    Raises ValueError when the tokenizer has no EOS token or ``stop`` is not exactly one token.
    """
    if stop is None:
        if tokenizer.eos_token_id is None:
            raise ValueError("stop: the tokenizer has no EOS token; name a stop token explicitly")
        return int(tokenizer.eos_token_id)
    ids = tokenizer.encode(stop, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"stop: {stop!r} must encode to exactly one token, got ids {ids}")
    return int(ids[0])
