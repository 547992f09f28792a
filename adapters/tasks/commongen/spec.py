"""CommonGen in the task registry: its config section, the paper's column, its metrics.

The paper gives no CommonGen hyperparameter table; the column below is the released run's
(RapTB+SubM row, tasks-more.md), which the paper's CommonGen table reports, including its two
schedules, linear over the run's schedule horizon (2500 steps):

- lambda (``reward.reward_scale`` -> ``reward.reward_scale_end``) 5 -> 50;
- reward temperature (``reward.temperature`` -> ``reward.temperature_end``, log R divided by it)
  1.5 -> 1.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from raptb.adapters.tasks.commongen.data import DIAGNOSTIC_SOURCE, load_concept_sets
from raptb.adapters.tasks.commongen.metrics import (
    EVAL_SAMPLES_PER_SET,
    METRIC_NAMES,
    SetSamples,
    commongen_metrics,
)
from raptb.adapters.tasks.commongen.task import CommonGenTask
from raptb.adapters.tasks.registry import TaskOptions, TaskSpec
from raptb.core.metrics import sequence_metrics

STEPS = 2500


class CommonGenOptions(TaskOptions):
    """The ``[commongen]`` config section (module doc of ``adapters.tasks.commongen.task`` for
    the reward)."""

    prompts: str = Field(
        DIAGNOSTIC_SOURCE,
        description="Concept sets: 'diagnostic' (the paper's 10), 'dev' (the 993 shipped "
        "validation sets) or a JSON Lines file of {concepts, references}.",
    )
    min_length: Annotated[int, Field(ge=1, description="Fewest generated tokens.")] = 4
    max_length: Annotated[int, Field(ge=1, description="Most generated tokens.")] = 20
    coverage_weight: Annotated[float, Field(ge=0, description="Weight of concept coverage.")] = 1.0
    quality_weight: Annotated[
        float, Field(ge=0, description="Weight of the reference-based quality shaping.")
    ] = 1.0
    hard_coverage_bonus: Annotated[
        float, Field(ge=0, description="Added at the end when every concept is present.")
    ] = 1.0
    quality: Literal["bigram_f1", "bleu"] = Field(
        "bigram_f1", description="Quality shaping: best bigram F1 or sentence BLEU-4 / 100."
    )


def _build(options: CommonGenOptions) -> CommonGenTask:
    source: str | Path = options.prompts
    return CommonGenTask(
        concept_sets=load_concept_sets(source),
        min_length=options.min_length,
        max_length=options.max_length,
        coverage_weight=options.coverage_weight,
        quality_weight=options.quality_weight,
        hard_coverage_bonus=options.hard_coverage_bonus,
        quality=options.quality,
    )


def _metrics(task: CommonGenTask, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sequence metrics of all samples, the paper's metrics averaged over the concept sets
    (keys as in its table: Entropy, BLEU, Len, DeltaLogPterm; and Coverage, Validity) and
    ``per_set``, the same per prompt."""
    by_prompt: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_prompt[row["prompt"]].append(row)
    table = commongen_metrics(
        task,
        [
            SetSamples(
                prompt=prompt,
                texts=[r["text"] for r in group],
                tokens=[r["tokens"] for r in group],
                log_pterm=[r["log_pterm_stop"] for r in group],
                reference_log_pterm=[r["ref_log_pterm_stop"] for r in group],
            )
            for prompt, group in by_prompt.items()
        ],
    )
    mean = table.pop("mean")
    return {
        **sequence_metrics(rows, max_depth=task.max_length),
        **{name: mean[name] for name in METRIC_NAMES},
        "per_set": table,
    }


SPEC = TaskSpec(
    name="commongen",
    summary="a sentence using every concept of a CommonGen set (--prompts diagnostic|dev|FILE)",
    options=CommonGenOptions,
    build=_build,
    metrics=_metrics,
    headline=(*METRIC_NAMES, "unique"),
    # Released SubM column: validity gating, diversity weighted 2, no length term, Jaccard on
    # word unigrams, length bins of 4 tokens.
    subm={
        "subm_weights": (1.0, 1.0, 2.0, 0.0),
        "gating_ratio": 1.0,
        "similarity": "jaccard",
        "shingle_k": 1,
        "shingle_on": "words",
        "length_bin_size": 4,
    },
    defaults={
        "steps": STEPS,
        "reward": {
            "kappa": 1.0,
            "reward_scale": 5.0,
            "reward_scale_end": 50.0,
            "temperature": 1.5,
            "temperature_end": 1.0,
        },
        "objective": {"eta": 0.1, "alpha": 0.8, "beta": 8.0, "rho": 0.5, "k_min": [16, 8]},
        "optim": {"grad_accum": 1},
        "replay": {"capacity": 100},
    },
    eval_samples=EVAL_SAMPLES_PER_SET,
    eval_per_prompt=True,
    reference_pterm=True,
)
