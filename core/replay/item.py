"""``ReplayItem``: one stored trajectory, and its flat array form for checkpoints.

A store of items packs into numpy arrays (ragged fields as values + offsets) plus JSON-able
lists (``pack_items``), so a buffer's ``state_dict`` round-trips exactly through a checkpoint
(``unpack_items``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class ReplayItem:
    """One generated trajectory for a prompt.

    prompt: the conditioning text (buffers are kept per prompt).
    tokens: generated token ids, stop token excluded; length L = len(tokens).
    text: the decoded generated text.
    log_r: float64 [L + 1], log_r[k] = log-reward of the prefix of k tokens followed by stop.
    u: float64 [L + 1], task-only reward per prefix.
    valid: the task's replay validity (SubM's gating and w_val): for most tasks feasibility, for
        Expr24 correctness (the paper's metrics appendix: "valid" means equal to 24).
    features: optional 1-D array for the similarity backend (e.g. a packed uint64 fingerprint).
    canonical: optional canonical form for SubM's dedup (e.g. canonical SMILES); defaults to text.
    score: SubM's static reward r(x), the task score S in [0, 1] (unscaled by lambda; Expr24 the
        terminal score, SMILES the best prefix score); None when unknown (an item restored from a
        checkpoint written before items carried it).
    """

    prompt: str
    tokens: tuple[int, ...]
    text: str
    log_r: np.ndarray
    u: np.ndarray
    valid: bool
    features: np.ndarray | None = None
    canonical: str | None = field(default=None)
    score: float | None = None

    def __post_init__(self) -> None:
        tokens = tuple(int(t) for t in self.tokens)
        object.__setattr__(self, "tokens", tokens)
        shape = (len(tokens) + 1,)
        for name in ("log_r", "u"):
            arr = np.array(getattr(self, name), dtype=np.float64)
            if arr.shape != shape:
                raise ValueError(
                    f"{name} must have shape {shape} (len(tokens) + 1), got {arr.shape}"
                )
            if np.isnan(arr).any():
                raise ValueError(f"{name} contains NaN")
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        if self.features is not None:
            feats = np.array(self.features)
            if feats.ndim != 1:
                raise ValueError(f"features must be 1-D, got shape {feats.shape}")
            feats.flags.writeable = False
            object.__setattr__(self, "features", feats)
        object.__setattr__(self, "valid", bool(self.valid))
        if self.score is not None:
            if not math.isfinite(self.score):
                raise ValueError(f"score must be finite, got {self.score}")
            object.__setattr__(self, "score", float(self.score))

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def terminal_log_r(self) -> float:
        return float(self.log_r[-1])

    @property
    def terminal_u(self) -> float:
        return float(self.u[-1])

    @property
    def key(self) -> str:
        """Canonical identity for SubM's dedup: ``canonical`` if given, else the text."""
        return self.text if self.canonical is None else self.canonical


def pack_items(items: Sequence[ReplayItem]) -> dict[str, Any]:
    """Flatten items into arrays (ragged fields as values + offsets) and JSON-able lists."""
    lengths = np.array([it.length for it in items], dtype=np.int64)
    has_feat = np.array([it.features is not None for it in items], dtype=bool)
    feats = [it.features for it in items if it.features is not None]
    feat_dtype = str(feats[0].dtype) if feats else "uint64"
    return {
        "prompts": [it.prompt for it in items],
        "texts": [it.text for it in items],
        "canonical": [it.canonical for it in items],
        "lengths": lengths,
        "tokens": np.array([t for it in items for t in it.tokens], dtype=np.int64),
        "log_r": np.concatenate([it.log_r for it in items]) if items else np.zeros(0),
        "u": np.concatenate([it.u for it in items]) if items else np.zeros(0),
        "valid": np.array([it.valid for it in items], dtype=bool),
        # NaN marks an item without a score (it never holds a real NaN: scores are finite)
        "score": np.array([np.nan if it.score is None else it.score for it in items]),
        "has_features": has_feat,
        "feature_lengths": np.array([f.size for f in feats], dtype=np.int64),
        "features": np.concatenate(feats) if feats else np.zeros(0, dtype=feat_dtype),
        "feature_dtype": feat_dtype,
    }


def unpack_items(d: dict[str, Any]) -> list[ReplayItem]:
    """The items ``pack_items`` flattened, in the same order (a pack written before items had
    a score restores them with ``score=None``)."""
    lengths = np.asarray(d["lengths"], dtype=np.int64)
    tok_off = np.concatenate([[0], np.cumsum(lengths)])
    r_off = np.concatenate([[0], np.cumsum(lengths + 1)])
    feat_off = np.concatenate([[0], np.cumsum(np.asarray(d["feature_lengths"], dtype=np.int64))])
    feats = np.asarray(d["features"]).astype(d["feature_dtype"], copy=False)
    tokens = np.asarray(d["tokens"], dtype=np.int64)
    log_r = np.asarray(d["log_r"], dtype=np.float64)
    u = np.asarray(d["u"], dtype=np.float64)
    scores = np.asarray(d.get("score", np.full(lengths.size, np.nan)), dtype=np.float64)
    out = []
    f = 0
    for i in range(lengths.size):
        feature = None
        if bool(d["has_features"][i]):
            feature = feats[feat_off[f] : feat_off[f + 1]]
            f += 1
        out.append(
            ReplayItem(
                prompt=d["prompts"][i],
                tokens=tuple(tokens[tok_off[i] : tok_off[i + 1]].tolist()),
                text=d["texts"][i],
                log_r=log_r[r_off[i] : r_off[i + 1]],
                u=u[r_off[i] : r_off[i + 1]],
                valid=bool(d["valid"][i]),
                features=feature,
                canonical=d["canonical"][i],
                score=None if np.isnan(scores[i]) else float(scores[i]),
            )
        )
    return out
