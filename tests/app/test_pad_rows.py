"""``pad_rows``: token rows padded into one LongTensor, against element-by-element filling, on
random rows (lists, tuples, tensors, empty rows and empty batches), and its error for a row that
is too long."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.app.task_and_policy import pad_rows


def reference(rows, max_length: int, pad_id: int) -> torch.Tensor:
    out = torch.full((len(rows), max_length), pad_id, dtype=torch.long)
    for b, tokens in enumerate(rows):
        for t, token in enumerate(tokens):
            out[b, t] = int(token)
    return out


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 500), max_size=9), max_size=12),
    st.sampled_from([list, tuple, torch.tensor]),
    st.integers(0, 3),
)
def test_pad_rows_equals_filling_each_element(rows, kind, extra) -> None:
    typed = [kind(row) if row or kind is not torch.tensor else torch.tensor([]) for row in rows]
    typed = [t.long() if isinstance(t, torch.Tensor) else t for t in typed]
    got = pad_rows(typed, 9 + extra, pad_id=97)
    assert got.dtype == torch.long and got.shape == (len(rows), 9 + extra)
    assert torch.equal(got, reference(rows, 9 + extra, 97))


def test_a_row_longer_than_max_length_is_an_error() -> None:
    with pytest.raises(ValueError, match="row 1 has 4 > max_length 3"):
        pad_rows([[1], [1, 2, 3, 4]], 3, pad_id=0)
