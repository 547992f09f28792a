"""The run's configuration file: ``config.toml`` in the run directory, the resolved
``TrainConfig`` as the run records it (app.configuration.record's ``config_toml``), written
atomically so a crash leaves the old file or the complete new one, and read back."""

from __future__ import annotations

from pathlib import Path

from raptb.app.configuration.config import TrainConfig, build_config
from raptb.app.configuration.record import config_toml
from raptb.app.run_dir.durable import write_atomically

CONFIG_FILE = "config.toml"


def save_config(config: TrainConfig, path: Path) -> None:
    """Write ``config`` as TOML (see :func:`config_toml`), atomically."""
    write_atomically(path, config_toml(config))


def load_config(path: Path) -> TrainConfig:
    """The configuration a run recorded in ``path`` (its config.toml)."""
    return build_config(path, recorded=True)
