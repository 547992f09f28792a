"""The trainer of any run: ``make_trainer`` picks the class that trains ``config.loss``.

``Trainer`` (app.train) trains the GFlowNet objectives (with logZ, replay and the behaviour
mix); ``RLTrainer`` (app.rl_train) the reward-maximising baselines grpo and ppo on the same
loop. ``raptb train`` and ``raptb.make_trainer`` go through here.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from raptb.app.config import RL_LOSSES, TrainConfig
from raptb.app.distributed import DistContext
from raptb.app.rl_train import RLTrainer
from raptb.app.train import Trainer


def make_trainer(
    config: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    console: Console | None = None,
    dist: DistContext | None = None,
) -> Trainer:
    """The trainer of ``config.loss``: ``RLTrainer`` for grpo and ppo, else ``Trainer``."""
    cls = RLTrainer if config.loss in RL_LOSSES else Trainer
    return cls(config, run_dir, resume=resume, progress=progress, console=console, dist=dist)
