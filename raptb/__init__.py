"""raptb: fine-tune language models as GFlowNets (RapTB objective, SubM replay).

The stable names are re-exported here and imported on first use (PEP 562), so that
``import raptb.core...`` stays free of torch and the other frameworks:

    from raptb import objective_by_name, PrefixBatch, subm_select, Trainer

``Trainer(config, run_dir)`` trains any ``loss`` (the GFlowNet objectives, grpo, ppo, a
plug-in's); ``make_trainer`` and ``RLTrainer`` are deprecated names for it, which warn.

A plug-in writes against the names exported here: ``Objective`` and ``register_objective`` (a
GFlowNet objective), ``RLObjective``, ``Loss`` and ``Algorithm`` (an RL loss and the shape of its
training algorithm), ``GRPO``, ``GRPOAlgorithm`` and ``GRPO_ALGORITHM`` (a loss that changes
GRPO's advantages, trained by GRPO's algorithm), ``ON_POLICY`` (the presets of a loss without
replay), ``ReplayBuffer``, ``BufferOption`` and ``register_buffer`` (a replay buffer and its
``[replay]`` options), ``TaskSpec`` and ``register_task`` (a task).
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# The subpackages live in core/, adapters/, app/ beside this folder and are mapped in at install.
# From a source checkout with a regular (non-editable) install, this folder shadows the installed
# package; extending the path lets ``raptb.core`` resolve to the installed one.
__path__ = pkgutil.extend_path(__path__, __name__)

try:
    __version__ = version("raptb")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

# public name -> module that defines it
_EXPORTS = {
    "PrefixBatch": "raptb.core.gfn.batch",
    "objective_by_name": "raptb.core.gfn.objectives",
    "objective_hyperparameters": "raptb.core.gfn.objectives",
    "Objective": "raptb.core.gfn.objectives",
    "register_objective": "raptb.core.gfn.objectives",
    "absorbed_targets": "raptb.core.gfn.targets",
    "subm_select": "raptb.core.subm.select",
    "make_buffer": "raptb.core.replay",
    "register_buffer": "raptb.core.replay",
    "ReplayBuffer": "raptb.core.replay",
    "BufferOption": "raptb.core.replay",
    "RLObjective": "raptb.core.rl.base",
    "GRPO": "raptb.core.rl.grpo",
    "ReplayItem": "raptb.core.replay",
    "Score": "raptb.core.ports",
    "Task": "raptb.core.ports",
    "TaskSpec": "raptb.adapters.tasks.registry",
    "register_task": "raptb.adapters.tasks.registry",
    "task_spec": "raptb.adapters.tasks.registry",
    "task_names": "raptb.adapters.tasks.registry",
    "TrainConfig": "raptb.app.configuration.config",
    "build_config": "raptb.app.configuration.config",
    "Trainer": "raptb.app.training.train",
    "Loss": "raptb.app.configuration.losses",
    "ON_POLICY": "raptb.app.configuration.losses",
    "GRPO_ALGORITHM": "raptb.app.configuration.losses",
    "Algorithm": "raptb.app.training.algorithm",
    "GRPOAlgorithm": "raptb.app.training.rl.grpo",
    "RLTrainer": "raptb.deprecated",
    "make_trainer": "raptb.deprecated",
    "evaluate": "raptb.app.evaluation.evaluate",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raptb' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
