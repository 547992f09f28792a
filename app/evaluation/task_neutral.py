"""The metrics every sampled evaluation adds, whatever the task: pass@k and the Vendi score.

- ``pass_at_k``: {k: mean over prompts of the unbiased pass@k} for k = 1, 8, 64, 256
  (``raptb.core.metrics.pass_at_k``; null where a prompt has fewer than k samples).
- ``vendi``: the Vendi score of the correct samples (``raptb.core.metrics.vendi``), an effective
  number of distinct correct samples, under the task's own similarity: the kernel of its SubM
  preset (``TaskSpec.subm``: Jaccard on character 2-grams for Expr24, AMP and custom tasks, on
  word unigrams for CommonGen, Tanimoto on the merged molecule's Morgan fingerprint for SMILES),
  the same for every run of the task whatever its own ``[replay]`` says. Samples are the same
  item when their SubM key is (the text; SMILES: the canonical molecule; ``shingle_on =
  "tokens"``: the token ids). Per prompt, then averaged over the prompts (a prompt without a
  correct sample counts 0). ``vendi_info`` says what it was computed on: samples scored,
  distinct items, whether a prompt was subsampled (more than ``max_distinct`` distinct
  correct samples), the kernel and the seconds it took. A task whose preset names Tanimoto but
  that gives no fingerprints (no ``item_features``) gets ``vendi`` null.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Hashable
from typing import Any

import numpy as np

from raptb.adapters.tasks.registry import TaskSpec
from raptb.core.metrics.pass_at_k import pass_at_k_report
from raptb.core.metrics.vendi import DEFAULT_VENDI_DISTINCT, sample_vendi
from raptb.core.ports import Task, TaskCapabilities
from raptb.core.replay import SubmodularBuffer, replay_kwargs


def task_neutral_metrics(
    task: Task,
    spec: TaskSpec,
    rows: list[dict[str, Any]],
    *,
    seed: int = 0,
    max_distinct: int = DEFAULT_VENDI_DISTINCT,
) -> dict[str, Any]:
    """``pass_at_k``, ``vendi`` and ``vendi_info`` of sample rows (dicts with prompt, text,
    tokens, correct); ``seed`` draws a subsample where one is needed."""
    start = time.perf_counter()
    prompts = [row["prompt"] for row in rows]
    kernel = SubmodularBuffer(**replay_kwargs("subm", spec.subm))
    describe = _describer(task, kernel)
    report = {"pass_at_k": pass_at_k_report(prompts, [bool(row["correct"]) for row in rows])}
    if describe is None:  # a Tanimoto preset on a task that gives no fingerprints
        return {**report, "vendi": None, "vendi_info": {"kernel": "tanimoto, no item_features"}}
    by_prompt: dict[str, list[tuple[Hashable, Any]]] = defaultdict(list)
    for row in rows:
        if row["correct"]:
            by_prompt[row["prompt"]].append(describe(row))
    pairwise = kernel.similarity_backend().pairwise  # type: ignore[attr-defined]
    estimates = [
        sample_vendi(
            [item for _, item in described],
            [key for key, _ in described],
            pairwise,
            max_distinct=max_distinct,
            seed=seed,
        )
        for described in by_prompt.values()
    ]
    n_prompts = len(set(prompts))
    return {
        **report,
        "vendi": float(sum(e.score for e in estimates) / n_prompts) if n_prompts else 0.0,
        "vendi_info": {
            "samples": sum(e.samples for e in estimates),
            "distinct": sum(e.distinct for e in estimates),
            "subsampled": any(e.subsampled for e in estimates),
            "kernel": _kernel_name(kernel),
            "seconds": time.perf_counter() - start,
        },
    }


def _describer(task: Task, kernel: SubmodularBuffer) -> Any:
    """row -> (key, item): what the task's SubM kernel compares, and when two are the same;
    None for a Tanimoto kernel on a task without ``item_features``."""
    if kernel.similarity == "tanimoto":
        features = TaskCapabilities.of(task).item_features
        if features is None:
            return None
        memo: dict[tuple[str, str], tuple[Hashable, np.ndarray]] = {}

        def molecule(row: dict[str, Any]) -> tuple[Hashable, np.ndarray]:
            at = (row["prompt"], row["text"])
            if at not in memo:
                described = features(*at)
                key = described.canonical if described.canonical is not None else at
                memo[at] = (key, described.features)
            return memo[at]

        return molecule
    if kernel.shingle_on == "tokens":
        return lambda row: (tuple(row["tokens"]), tuple(row["tokens"]))
    return lambda row: (row["text"], row["text"])


def _kernel_name(kernel: SubmodularBuffer) -> str:
    similarity = kernel.config()["similarity"]
    if similarity == "jaccard":
        return f"jaccard, {kernel.shingle_k}-grams of the {kernel.shingle_on}"
    return str(similarity)
