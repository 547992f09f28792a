"""A GFlowNetTrainer step's loss is the mean over all the rows the step keeps, whatever its
gradient accumulation and number of processes.

A step's rows are split into micro-batches (``gradient_accumulation_steps``) on each process, and
unscorable rows (every reward None or NaN) are left out, so micro-batches keep different numbers
of rows. Each micro-batch's objective is the mean over its own kept rows; it is multiplied by its
row count and divided by :func:`rows_per_micro_batch`, so that the gradients summed over the
micro-batches and averaged over processes are those of the mean over the step's kept rows (rather
than of the mean of the micro-batches' means).
"""

from __future__ import annotations

from typing import Any

import torch


def rows_per_micro_batch(trainer: Any, num_kept: torch.Tensor) -> torch.Tensor:
    """What the sum of a training micro-batch's per-row losses is divided by, for ``trainer`` (a
    GFlowNetTrainer: its process count, ``current_gradient_accumulation_steps`` and
    ``args.steps_per_generation``).

    ``num_kept``: the rows the generation batch keeps, over every process. As TRL 1.16.0
    normalises its ``dapo`` loss (trl/trainer/grpo_trainer.py, ``GRPOTrainer._compute_loss``:
    ``normalizer = inputs["num_items_in_batch"].clamp(min=1.0) /
    self.accelerator.num_processes``, then ``normalizer * self.current_gradient_accumulation_steps
    / self.args.steps_per_generation`` in training), counting kept rows instead of completion
    tokens. A generation batch is one optimizer step when ``steps_per_generation`` equals the
    accumulation (TRL's default); otherwise its kept rows are spread evenly over its steps.
    """
    normalizer = num_kept.clamp(min=1.0) / trainer.accelerator.num_processes
    accumulation = trainer.current_gradient_accumulation_steps
    return normalizer * accumulation / trainer.args.steps_per_generation
