"""What a run records of its configuration: the values of its ``TrainConfig`` that the run reads
(``recorded_data``), as TOML (``config_toml``; a run's ``config.toml``, app.run_dir.run_config,
and what ``raptb config`` prints).

Two configurations make the same run when their records are equal, once what one leaves to the
machine is resolved as the other's run resolved it (``resolved_as``): ``--resume``
(app.run_dir.resume) and a study's run states (app.study.state) judge by it.
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
    configurations make the same run when their records are equal (see :func:`resolved_as`)."""
    data = config.model_dump(mode="json", exclude_none=True)
    data["replay"] = buffer_defaults.recorded(data["replay"])
    if config.loss_entry.section != "rl":
        data.pop("rl", None)
    if config.model != "tiny":
        data.pop("tiny", None)
    return data


def resolved_as(planned: TrainConfig, recorded: TrainConfig) -> TrainConfig:
    """``planned`` with what it leaves to the machine resolved as the run that recorded
    ``recorded`` resolved it, so that their :func:`recorded_data` compare as runs: a planned
    ``model_dtype = "auto"`` is the dtype that run recorded (a run records the dtype "auto"
    resolved to on its device, and a resumed run continues in it). An explicit value is kept, so
    a real difference still shows."""
    if planned.model_dtype != "auto":
        return planned
    return planned.model_copy(update={"model_dtype": recorded.model_dtype})


def config_toml(config: TrainConfig) -> str:
    """``config`` as TOML: :func:`recorded_data`."""
    return tomli_w.dumps(recorded_data(config))
