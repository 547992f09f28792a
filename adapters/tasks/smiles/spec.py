"""SMILES in the task registry: its config section, its report and the paper's column."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from raptb.adapters.tasks.registry import TaskOptions, TaskSpec
from raptb.adapters.tasks.smiles.metrics import smiles_metrics
from raptb.adapters.tasks.smiles.task import DEFAULT_SCAFFOLD, SmilesTask, read_scaffolds
from raptb.adapters.tasks.subm_presets import EVERY_TERM_SUBM


class SmilesOptions(TaskOptions):
    """The ``[smiles]`` config section; ``max_length = 15`` is the paper's stress setting."""

    scaffolds: Path | None = Field(
        None,
        description="Text file of scaffolds, one SMILES with exactly one '*' per line; "
        f"None: the paper's {DEFAULT_SCAFFOLD}.",
    )
    min_length: Annotated[int, Field(ge=1, description="Fewest generated tokens.")] = 1
    max_length: Annotated[int, Field(ge=1, description="Most generated tokens.")] = 10
    ring_closures: bool = Field(
        False,
        description="Let fragments use ring-closure digits (off: they would clash with the "
        "scaffold's rings).",
    )


def _build(options: SmilesOptions) -> SmilesTask:
    scaffolds = (
        [DEFAULT_SCAFFOLD] if options.scaffolds is None else read_scaffolds(options.scaffolds)
    )
    return SmilesTask(
        scaffolds,
        min_length=options.min_length,
        max_length=options.max_length,
        ring_closures=options.ring_closures,
    )


def _metrics(task: SmilesTask, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``smiles_metrics`` of the rows, after adding each row's merged ``molecule`` and its
    ``canonical`` SMILES (None when invalid)."""
    described = [task.item_features(r["prompt"], r["text"]) for r in rows]
    for row, item in zip(rows, described, strict=True):
        row["molecule"] = task.merge(row["prompt"], row["text"])
        row["canonical"] = item.canonical
    fingerprints = np.stack([item.features for item in described])
    return smiles_metrics(rows, fingerprints, max_depth=task.max_length)


SPEC = TaskSpec(
    name="smiles",
    summary="scaffold-conditioned fragments scored by QED with RDKit",
    options=SmilesOptions,
    build=_build,
    metrics=_metrics,
    headline=(
        "acc",
        "score",
        "entropy",
        "fp_div",
        "macro_fp",
        "len_mean",
        "uniq_str",
        "uniq_mol",
        "log_pterm",
    ),
    # Paper Table "Submodular replay hyperparameters (SMILES)": Tanimoto on the merged
    # molecules' fingerprints (``item_features``).
    subm={**EVERY_TERM_SUBM, "similarity": "tanimoto"},
    replay_score="best_prefix",
    # The paper's SMILES column of its hyperparameter tables.
    defaults={
        "reward": {"kappa": 1.0, "reward_scale": 50.0},
        "objective": {"alpha": 0.5, "beta": 5.0, "rho": 0.1, "k_min": [5, 2]},
    },
    eval_samples=3200,
    length_table=("count", "frac", "score", "fp_div", "uniq_mol"),
    length_plots=(("fp_div", "FPDiv by length"),),
)
