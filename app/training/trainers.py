"""The trainer of any run: ``make_trainer`` (``raptb train`` and ``raptb.make_trainer``).

``Trainer`` (app.training.train) trains every ``loss``: its loop runs the algorithm the loss names
(the GFlowNet objectives, GRPO, PPO; app.training.algorithms). ``RLTrainer`` is kept as a
deprecated name for it (it was the RL baselines' subclass).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from raptb.app.configuration.config import TrainConfig
from raptb.app.training.train import Trainer


def make_trainer(config: TrainConfig, run_dir: Path, **options: Any) -> Trainer:
    """The trainer of ``config``, whatever its ``loss``: ``Trainer(config, run_dir, **options)``
    (``resume``, ``progress``, ``console``, ``dist`` as ``Trainer`` takes them)."""
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
