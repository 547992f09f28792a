"""SMILES's evaluation report: every SMILES metric of metrics.md for a list of samples.

The task-neutral keys come from :func:`raptb.core.metrics.sequence_report`; this module adds
string and molecule uniqueness, FPDiv and MacroFP (Tanimoto on the merged molecules' Morgan
fingerprints) and a per-length table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from raptb.core.metrics import fp_div, macro_fp_div, require_fields, safe_div, sequence_report


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
    require_fields(samples, fields)
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
        **sequence_report(
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
