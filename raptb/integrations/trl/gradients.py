"""Every parameter in the optimizer starts each optimizer step with no gradient.

transformers' training loop clears gradients with ``model.zero_grad()`` after each optimizer step.
Parameters the trainer adds outside the model (GFlowNetTrainer's logZ, in a parameter group of
its own) are not reached by it: their ``.grad`` would hold the running sum of every earlier step's
gradient, and Adam would step them on that sum (at step 5 of a short run, 5.3 times the step's own
gradient). The callback clears them at the end of each optimizer step, so that each step's update
uses that step's gradient only, and a run resumed from a checkpoint (which starts with no
gradient) continues as the uninterrupted run does.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback


def clear_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Set the gradient of every parameter in ``optimizer``'s groups to None."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None


class ClearGradients(TrainerCallback):
    """A ``TrainerCallback`` that clears every optimizer parameter's gradient after each step."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        optimizer = kwargs.get("optimizer")
        if optimizer is not None:
            clear_gradients(optimizer)
        return control
