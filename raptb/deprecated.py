"""Deprecated names of the one trainer, ``Trainer`` (app.training.train), which trains every
``loss`` (its loop runs the algorithm the loss's registry entry names): ``make_trainer`` (a
function that built it) and ``RLTrainer`` (the RL baselines' former subclass). Both warn.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from raptb.app.configuration.config import TrainConfig
from raptb.app.training.train import Trainer


def make_trainer(config: TrainConfig, run_dir: Path, **options: Any) -> Trainer:
    """Deprecated: ``Trainer(config, run_dir, **options)``."""
    warnings.warn(
        "make_trainer is deprecated: Trainer(config, run_dir, ...) trains every loss",
        DeprecationWarning,
        stacklevel=2,
    )
    return Trainer(config, run_dir, **options)


class RLTrainer(Trainer):
    """Deprecated: ``Trainer`` trains grpo and ppo itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        warnings.warn(
            "RLTrainer is deprecated: Trainer trains every loss, grpo and ppo included",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(*args, **kwargs)
