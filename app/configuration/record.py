"""What a run records of its configuration: the values of its ``TrainConfig`` that the run reads
(``recorded_data``), as TOML (``config_toml``; a run's ``config.toml``, app.run_dir.run_config,
and what ``raptb config`` prints).
"""

from __future__ import annotations

from typing import Any

import tomli_w

from raptb.app.configuration import buffer_defaults
from raptb.app.configuration.config import TrainConfig


def recorded_data(config: TrainConfig) -> dict[str, Any]:
    """What a run records of ``config`` (None values are omitted: they mean "default"), what the
    run reads: its ``[replay]`` section the options its buffer kind reads
    (app.configuration.buffer_defaults), ``[rl]`` only for an RL loss, ``[tiny]`` only for the
    embedded model. Loaded back, it runs the same (what it leaves out is read by nothing); two
    configurations make the same run when their records are equal."""
    data = config.model_dump(mode="json", exclude_none=True)
    data["replay"] = buffer_defaults.recorded(data["replay"])
    if config.loss_entry.section != "rl":
        data.pop("rl", None)
    if config.model != "tiny":
        data.pop("tiny", None)
    return data


def config_toml(config: TrainConfig) -> str:
    """``config`` as TOML: :func:`recorded_data`."""
    return tomli_w.dumps(recorded_data(config))
