"""Input checks and encodings shared by the metric modules (not part of the public API)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np

TokenSequence = Sequence[Hashable]


def safe_div(numerator: float, denominator: float) -> float:
    """numerator / denominator, or 0.0 when the denominator is zero (the paper's convention)."""
    return float(numerator) / float(denominator) if denominator else 0.0


def as_flags(flags: Iterable[bool] | np.ndarray, name: str = "correct") -> np.ndarray:
    """A one-dimensional bool array [N] of per-sample flags."""
    array = np.asarray(flags)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array.astype(bool)


def as_floats(values: Iterable[float] | np.ndarray, name: str) -> np.ndarray:
    """A one-dimensional float64 array [N]."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array


def check_same_length(**arrays: np.ndarray) -> None:
    """Raise unless every named array has the same length."""
    sizes = {name: len(array) for name, array in arrays.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"arrays must have the same length, got {sizes}")


def encode(
    sequences: Sequence[TokenSequence], vocabulary: dict[Hashable, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Pad to an int64 code array [n, T_max] (-1 after the end) and lengths [n].

    ``vocabulary`` is extended in place with unseen tokens so that several sets share codes.
    """
    lengths = np.fromiter((len(seq) for seq in sequences), dtype=np.int64, count=len(sequences))
    width = int(lengths.max()) if lengths.size else 0
    codes = np.full((len(sequences), width), -1, dtype=np.int64)
    for row, seq in enumerate(sequences):
        for column, token in enumerate(seq):
            codes[row, column] = vocabulary.setdefault(token, len(vocabulary))
    return codes, lengths
