"""Per-task metric reports: every metric of metrics.md for a list of evaluation samples.

A sample is a mapping with the fields of a ``samples.jsonl`` row (or an ``EvalSample``): its
pre-stop ``tokens``, ``correct`` (the task's success, what Acc counts), ``score`` and
``log_pterm_stop``; SMILES also reads ``valid``, ``text`` and ``canonical``. Every report is a
JSON-ready dict; per-length dicts have string keys (JSON object keys).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raptb.core.metrics._arrays import safe_div
from raptb.core.metrics.coverage import coverage, target_distinct
from raptb.core.metrics.divergence import marginal_divergences
from raptb.core.metrics.diversity import fp_div, macro_fp_div
from raptb.core.metrics.prefix import prefix_diagnostics
from raptb.core.metrics.sequence import (
    accuracy,
    entropy_by_length,
    length_count,
    length_fraction,
    length_percentile,
    log_pterm_by_length,
    mean_length,
    mean_log_pterm,
    mean_score,
    ragged_token_entropy,
    unique_count,
    unique_rate,
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


def _require_fields(samples: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> None:
    for field_name in fields:
        if samples and field_name not in samples[0]:
            raise ValueError(f"sample is missing the field {field_name!r}")


def _sequence_report(
    correct: np.ndarray,
    lengths: np.ndarray,
    scores: np.ndarray,
    log_pterm: np.ndarray,
    correct_tokens: Sequence[tuple[Hashable, ...]],
    max_depth: int,
) -> dict[str, Any]:
    """The task-agnostic keys every report shares; arrays are per sample [N]."""
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
        **_sequence_report(
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


def smiles_metrics(
    samples: Sequence[Mapping[str, Any]], fingerprints: np.ndarray, max_depth: int
) -> dict[str, Any]:
    """Every SMILES metric of metrics.md as a JSON-ready dict.

    samples: mappings with ``tokens`` (before the stop), ``valid`` (the merged molecule
        sanitises), ``correct`` (the task's success, a valid molecule), ``score`` (its QED),
        ``log_pterm_stop``, ``text`` (the fragment) and ``canonical`` (canonical SMILES of the
        merged molecule, None when invalid).
    fingerprints: packed uint64 [N, W] Morgan fingerprints of the merged molecules, one row per
        sample (rows of samples that are not correct are ignored).
    max_depth: deepest prefix depth for the diagnostics (the task's max length).

    Keys: n_samples, n_valid, n_correct, acc, score, uniq_str, uniq_str_rate, uniq_mol,
    uniq_mol_rate, fp_div, macro_fp, entropy, entropy_by_length, len_mean, len50, len90,
    log_pterm, log_pterm_by_length, by_length ({length: {count, frac, score, fp_div, uniq_mol}}
    over correct samples) and prefix (depth/surv/pef_ent/eff/top1/unique_rate lists, depths
    1..max_depth).
    """
    # imported here: the similarity kernels compile with Numba, which only SMILES metrics need
    from raptb.core.subm.similarity import tanimoto_matrix

    fps = np.asarray(fingerprints)
    if fps.ndim != 2 or fps.shape[0] != len(samples):
        raise ValueError(
            f"fingerprints must have shape [{len(samples)}, W], got {tuple(fps.shape)}"
        )
    fields = ("tokens", "valid", "correct", "score", "log_pterm_stop", "text", "canonical")
    _require_fields(samples, fields)
    correct = np.array([bool(s["correct"]) for s in samples], dtype=bool)
    lengths = np.array([len(s["tokens"]) for s in samples], dtype=np.int64)
    scores = np.array([float(s["score"]) for s in samples], dtype=np.float64)
    index = np.flatnonzero(correct)
    correct_tokens = [tuple(samples[int(i)]["tokens"]) for i in index]
    texts = [samples[int(i)]["text"] for i in index]
    molecules = [samples[int(i)]["canonical"] for i in index]
    correct_lengths = lengths[index]
    similarity = tanimoto_matrix(np.ascontiguousarray(fps[index], dtype=np.uint64))
    n_correct = int(correct.sum())
    by_length = {}
    for n in sorted({int(v) for v in correct_lengths}):
        members = np.flatnonzero(correct_lengths == n)
        by_length[str(n)] = {
            "count": int(members.size),
            "frac": safe_div(members.size, n_correct),
            "score": float(scores[index[members]].mean()),
            "fp_div": fp_div(list(members), similarity[np.ix_(members, members)]),
            "uniq_mol": len({molecules[int(m)] for m in members}),
        }
    uniq_str, uniq_mol = len(set(texts)), len(set(molecules))
    return {
        "n_samples": len(samples),
        "n_valid": sum(bool(s["valid"]) for s in samples),
        "n_correct": n_correct,
        **_sequence_report(
            correct,
            lengths,
            scores,
            np.array([float(s["log_pterm_stop"]) for s in samples], dtype=np.float64),
            correct_tokens,
            max_depth,
        ),
        "uniq_str": uniq_str,
        "uniq_str_rate": safe_div(uniq_str, n_correct),
        "uniq_mol": uniq_mol,
        "uniq_mol_rate": safe_div(uniq_mol, n_correct),
        "fp_div": fp_div(molecules, similarity),
        "macro_fp": macro_fp_div(molecules, correct_lengths, similarity),
        "by_length": by_length,
    }


def sequence_metrics(samples: Sequence[Mapping[str, Any]], max_depth: int) -> dict[str, Any]:
    """Task-agnostic metrics of metrics.md for any task (custom tasks use these).

    samples: mappings with ``tokens`` (before the stop), ``valid`` (well-formed), ``correct``
    (the task's success), ``score`` and ``log_pterm_stop``. Keys: n_samples, n_valid,
    n_correct, acc, score, unique, uniq_rate, entropy, entropy_by_length, len_mean, len50, len90,
    log_pterm, log_pterm_by_length and prefix (depths 1..max_depth).
    """
    _require_fields(samples, ("tokens", "valid", "correct", "score", "log_pterm_stop"))
    correct = np.array([bool(s["correct"]) for s in samples], dtype=bool)
    sequences = [tuple(s["tokens"]) for s in samples]
    return {
        "n_samples": len(samples),
        "n_valid": sum(bool(s["valid"]) for s in samples),
        "n_correct": int(correct.sum()),
        **_sequence_report(
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
