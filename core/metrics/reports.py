"""The task-neutral metric report: the metrics of metrics.md that every task shares.

A sample is a mapping with the fields of a ``samples.jsonl`` row: its pre-stop ``tokens``,
``valid`` (well-formed), ``correct`` (the task's success, what Acc counts), ``score`` and
``log_pterm_stop``. :func:`sequence_metrics` is the whole report of a task with nothing more
to say (custom tasks); a task's own report (each task's ``metrics`` module, reached through its
``TaskSpec.metrics``) builds on :func:`sequence_report` and adds its keys. Every report is a
JSON-ready dict; per-length dicts have string keys (JSON object keys).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from raptb.core.metrics.prefix import prefix_diagnostics
from raptb.core.metrics.sequence import (
    accuracy,
    entropy_by_length,
    length_percentile,
    log_pterm_by_length,
    mean_length,
    mean_log_pterm,
    mean_score,
    ragged_token_entropy,
    unique_count,
    unique_rate,
)


def require_fields(samples: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> None:
    """ValueError naming the first of ``fields`` that the first sample lacks."""
    for field_name in fields:
        if samples and field_name not in samples[0]:
            raise ValueError(f"sample is missing the field {field_name!r}")


def sequence_report(
    correct: np.ndarray,
    lengths: np.ndarray,
    scores: np.ndarray,
    log_pterm: np.ndarray,
    correct_tokens: Sequence[tuple[Hashable, ...]],
    max_depth: int,
) -> dict[str, Any]:
    """The task-neutral keys every report shares: acc, score, entropy, entropy_by_length,
    len_mean, len50, len90, log_pterm, log_pterm_by_length and prefix (depths 1..max_depth).

    correct, lengths (pre-stop token counts), scores and log_pterm (at the stop) are per sample
    [N]; correct_tokens are the correct samples' token sequences.
    """
    return {
        "acc": accuracy(correct),
        "score": mean_score(scores, correct),
        "entropy": ragged_token_entropy(correct_tokens),
        "entropy_by_length": {str(n): v for n, v in entropy_by_length(correct_tokens).items()},
        "len_mean": mean_length(lengths, correct),
        "len50": length_percentile(lengths, correct, 50.0),
        "len90": length_percentile(lengths, correct, 90.0),
        "log_pterm": mean_log_pterm(log_pterm),
        "log_pterm_by_length": {
            str(n): v for n, v in log_pterm_by_length(log_pterm, lengths).items()
        },
        "prefix": prefix_diagnostics(correct_tokens, max_depth=max_depth).to_dict(),
    }


def sequence_metrics(samples: Sequence[Mapping[str, Any]], max_depth: int) -> dict[str, Any]:
    """Task-agnostic metrics of metrics.md for any task (custom tasks use these).

    samples: mappings with ``tokens`` (before the stop), ``valid`` (well-formed), ``correct``
    (the task's success), ``score`` and ``log_pterm_stop``. Keys: n_samples, n_valid,
    n_correct, acc, score, unique, uniq_rate, entropy, entropy_by_length, len_mean, len50, len90,
    log_pterm, log_pterm_by_length and prefix (depths 1..max_depth).
    """
    require_fields(samples, ("tokens", "valid", "correct", "score", "log_pterm_stop"))
    correct = np.array([bool(s["correct"]) for s in samples], dtype=bool)
    sequences = [tuple(s["tokens"]) for s in samples]
    return {
        "n_samples": len(samples),
        "n_valid": sum(bool(s["valid"]) for s in samples),
        "n_correct": int(correct.sum()),
        **sequence_report(
            correct,
            np.array([len(seq) for seq in sequences], dtype=np.int64),
            np.array([float(s["score"]) for s in samples], dtype=np.float64),
            np.array([float(s["log_pterm_stop"]) for s in samples], dtype=np.float64),
            [seq for seq, ok in zip(sequences, correct, strict=True) if ok],
            max_depth,
        ),
        "unique": unique_count(sequences, correct),
        "uniq_rate": unique_rate(sequences, correct),
    }
