"""Expr24's evaluation report: every Expr24 metric of metrics.md for a list of samples.

The task-neutral keys (Acc, Score, lengths, log p_term, entropy, prefix diagnostics) come from
:func:`raptb.core.metrics.sequence_report`; this module adds what needs the enumerated solution
set Y*: coverage, the target's expected coverage at the same N, the position-wise KL/JS against
the uniform target, and the counts per Expr24 length (3, 5, 7, 9).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raptb.core.metrics import (
    coverage,
    length_count,
    length_fraction,
    marginal_divergences,
    safe_div,
    sequence_report,
    target_distinct,
)

EXPR24_LENGTHS = (3, 5, 7, 9)


@dataclass(frozen=True)
class EvalSample:
    """One evaluation sample (also accepted as a mapping with the same keys).

    tokens: generated tokens before the stop (strings or ids); length = len(tokens).
    correct: the task's success (Expr24: the text parses and equals 24).
    score: the task score (Expr24: 1.0 iff equal to 24).
    log_pterm_stop: raw model log-prob of stop at the sampled stop step.
    text: the decoded text; when given, Y*-based metrics compare its characters (so that a
        tokenizer with multi-character tokens still matches the enumerated solutions).
    """

    tokens: Sequence[Hashable]
    correct: bool
    score: float
    log_pterm_stop: float
    text: str | None = None


def _as_sample(sample: EvalSample | Mapping[str, Any]) -> EvalSample:
    if isinstance(sample, EvalSample):
        return sample
    try:
        return EvalSample(
            tokens=tuple(sample["tokens"]),
            correct=bool(sample["correct"]),
            score=float(sample["score"]),
            log_pterm_stop=float(sample["log_pterm_stop"]),
            text=sample.get("text"),
        )
    except KeyError as error:
        raise ValueError(f"sample is missing the field {error.args[0]!r}") from error


def expr24_metrics(
    samples: Sequence[EvalSample | Mapping[str, Any]],
    solutions: Sequence[str],
    bucket_lengths: Sequence[int] = EXPR24_LENGTHS,
) -> dict[str, Any]:
    """Every Expr24 metric of metrics.md as a JSON-ready dict.

    Keys: n_samples, n_correct, acc, score, unique, uniq_rate, cov_count, cov, norm_cov,
    n_solutions (|Y*|), target_unique and target_norm_cov (what the target p*, uniform over Y*,
    gives in expectation at the same N),
    kl_pi_p, kl_p_pi, js_tok, log_pterm, log_pterm_by_length, len_mean, len50, len90,
    count_by_length, frac_by_length, entropy, entropy_by_length, prefix (depth/surv/pef_ent/
    eff/top1/unique_rate lists, depths 1..max(bucket_lengths)). count/frac_by_length cover
    ``bucket_lengths``.
    """
    rows = [_as_sample(sample) for sample in samples]
    correct = np.array([s.correct for s in rows], dtype=bool)
    token_lengths = np.array([len(s.tokens) for s in rows], dtype=np.int64)
    correct_tokens = [tuple(s.tokens) for s, ok in zip(rows, correct, strict=True) if ok]
    correct_texts = [
        tuple(s.text) if s.text is not None else tuple(s.tokens)
        for s, ok in zip(rows, correct, strict=True)
        if ok
    ]
    cover = coverage(correct_texts, solutions, len(rows))
    divergences = marginal_divergences(correct_texts, solutions)
    return {
        "n_samples": len(rows),
        "n_correct": int(correct.sum()),
        **sequence_report(
            correct,
            token_lengths,
            np.array([s.score for s in rows], dtype=np.float64),
            np.array([s.log_pterm_stop for s in rows], dtype=np.float64),
            correct_tokens,
            max(bucket_lengths, default=0),
        ),
        "unique": cover.unique,
        "uniq_rate": safe_div(cover.unique, correct.sum()),
        "cov_count": cover.cov_count,
        "cov": cover.cov,
        "norm_cov": cover.norm_cov,
        **_target_context(len(set(map(tuple, solutions))), len(rows)),
        "kl_pi_p": divergences.kl_pi_p,
        "kl_p_pi": divergences.kl_p_pi,
        "js_tok": divergences.js_tok,
        "count_by_length": {
            str(n): length_count(token_lengths, correct, n, n) for n in bucket_lengths
        },
        "frac_by_length": {
            str(n): length_fraction(token_lengths, correct, n, n) for n in bucket_lengths
        },
    }


def _target_context(n_solutions: int, n_samples: int) -> dict[str, Any]:
    """|Y*| and what the target (uniform over Y*) gives at the same N: expected distinct correct
    and the NormCov it implies (coverage.target_distinct)."""
    expected = target_distinct(n_solutions, n_samples)
    return {
        "n_solutions": n_solutions,
        "target_unique": expected,
        "target_norm_cov": safe_div(expected, min(n_samples, n_solutions)),
    }
