"""AMP in the task registry: its config section, the paper's column, the top-k metrics.

The column is the released run's (tasks-more.md): kappa 1, lambda 50, no tempering, eta 0.25,
alpha 0.5, beta 5, rho 0.1, k_min 2, grad accumulation 4, clip 0.5, SubM with 200 items per
prompt and reward, validity and diversity weights 1 (plus the length term, as for SMILES), 5000
steps (the paper's table trains RapTB 5K, RapTB+SubM 3K, TB and SubTB 10K steps:
``studies/amp_main.toml`` sets those per row).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from raptb.adapters.tasks.amp.metrics import TOP_K, amp_metrics
from raptb.adapters.tasks.amp.oracle import FORMER_MACREL_ORACLE, MACREL_ORACLE
from raptb.adapters.tasks.amp.task import DEFAULT_PROMPT, AmpTask, training_peptides
from raptb.adapters.tasks.dotted_path import CallablePath
from raptb.adapters.tasks.registry import TaskOptions, TaskSpec
from raptb.adapters.tasks.subm_presets import STRING_SUBM
from raptb.core.metrics import sequence_metrics


class AmpOptions(TaskOptions):
    """The ``[amp]`` config section (module doc of ``adapters.tasks.amp.task`` for the reward)."""

    oracle: CallablePath = Field(
        MACREL_ORACLE,
        description="'module:function' mapping a list of peptides to probabilities; default "
        "Macrel's AMP classifier (pip install 'raptb[amp]'). The module is looked up in the "
        "current directory first, then on PYTHONPATH.",
    )
    min_length: Annotated[int, Field(ge=1, description="Fewest generated residues.")] = 5
    max_length: Annotated[int, Field(ge=1, description="Most generated residues.")] = 50
    prompt: str = Field(DEFAULT_PROMPT, description="The conditioning prompt.")
    top_k: Annotated[
        int, Field(ge=1, description="Evaluation: the top-k samples by oracle score.")
    ] = TOP_K

    @field_validator("oracle", mode="before")
    @classmethod
    def _former_default(cls, value: object) -> object:
        """The default's path before AMP had its folder, as runs saved it: the same oracle."""
        return MACREL_ORACLE if value == FORMER_MACREL_ORACLE else value


def _build(options: AmpOptions) -> AmpTask:
    return AmpTask(
        oracle=options.oracle,
        min_length=options.min_length,
        max_length=options.max_length,
        prompt=options.prompt,
        top_k=options.top_k,
    )


def _metrics(task: AmpTask, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sequence metrics of all samples and the top-k metrics of Jain et al. (Perf, Div, Novelty,
    Len against the shipped training peptides)."""
    top = amp_metrics(
        [r["text"] for r in rows],
        [float(r["score"]) for r in rows],
        [bool(r["valid"]) for r in rows],
        training_peptides(),
        k=task.top_k,
    )
    return {**sequence_metrics(rows, max_depth=task.max_length), **top}


SPEC = TaskSpec(
    name="amp",
    summary="antimicrobial peptides scored by an oracle (--oracle module:function)",
    options=AmpOptions,
    build=_build,
    metrics=_metrics,
    headline=("Perf", "Div", "Novelty", "Len", "TopK", "acc", "unique", "log_pterm"),
    subm=STRING_SUBM,
    defaults={
        "steps": 5000,
        "reward": {"kappa": 1.0, "reward_scale": 50.0},
        "objective": {"eta": 0.25, "alpha": 0.5, "beta": 5.0, "rho": 0.1, "k_min": [2, 2]},
        "optim": {"grad_accum": 4, "clip": 0.5},
        "sampling": {"low_temp_prob": 0.0},
        "replay": {"capacity": 200},
    },
    eval_samples=3200,
)
