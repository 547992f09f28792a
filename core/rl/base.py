"""``RLObjective``: what a reward-maximising loss (GRPO, PPO, a plug-in's) declares to the run
that trains it, so that no caller tests which class it is.

An RL objective is a frozen dataclass whose fields are its hyperparameters (TRL's names); calling
it on a ``core.rl.batch.RLBatch`` returns ``(loss, diagnostics)``. Its class declares:

- ``name``: the run's ``loss``;
- ``grouped``: its rows come in groups of ``num_generations`` rows of one prompt (GRPO's group
  advantages), which the configuration checks the step's rows against;
- ``uses_reference``: whether this instance reads the reference model's log-probs (a KL term);
- ``uses_entropy``: whether it reads the policy's per-state entropy (an entropy bonus);
- ``config_kwargs``: its hyperparameters from a run's ``[rl]`` values (the fields it shares with
  that section; a loss may fill in a default that depends on another value, as GRPO's CISPO).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

Array = Any
Diagnostics = dict[str, float]


@dataclass(frozen=True)
class RLObjective:
    """Base class of the RL objectives (see the module docstring)."""

    name: ClassVar[str] = ""
    grouped: ClassVar[bool] = False

    @property
    def uses_reference(self) -> bool:
        """Whether the loss reads reference log-probs; none by default."""
        return False

    @property
    def uses_entropy(self) -> bool:
        """Whether the loss reads the policy's per-state entropy; not by default."""
        return False

    @classmethod
    def config_kwargs(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The hyperparameters among a run's ``[rl]`` ``options`` (by field name) it takes."""
        taken = {f.name for f in fields(cls)}
        return {k: v for k, v in options.items() if k in taken}

    def __call__(self, batch: Any, **kwargs: Any) -> tuple[Array, Diagnostics]:
        raise NotImplementedError
