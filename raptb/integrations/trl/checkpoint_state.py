"""What a GFlowNetTrainer checkpoint adds to TRL's: logZ, the replay buffer and its sampler; and
what a saved model adds to the model's folder: logZ.

Each process writes ``gflownet_state_{rank}.pt`` into TRL's checkpoint folder (``_save_checkpoint``)
and reads it back on resume (``_load_optimizer_and_scheduler``): logZ, the buffer's
``state_dict``, the replay generator's state and the token ids of the prompts the buffer holds.

``save_model`` (and so every checkpoint, and ``push_to_hub``) also writes ``gflownet_log_z.json``
beside the weights: a trainer built on that folder starts logZ there, not at ``log_z_init``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

import torch

logger = logging.getLogger(__name__)

STATE_FILE = "gflownet_state_{rank}.pt"
"""The per-process file a checkpoint folder gets."""

LOG_Z_FILE = "gflownet_log_z.json"
"""The file ``save_model`` writes beside the model: ``{"log_z": float, "loss": objective}``."""


def save_log_z(trainer: Any, folder: str) -> None:
    """Write ``trainer``'s logZ (and its objective's name, for the reader) into model ``folder``."""
    os.makedirs(folder, exist_ok=True)
    record = {"log_z": float(trainer.log_z.detach()), "loss": trainer.gfn_args.loss}
    with open(os.path.join(folder, LOG_Z_FILE), "w", encoding="utf-8") as out:
        json.dump(record, out)
        out.write("\n")


def model_folder(model: Any) -> str | None:
    """The local folder a trainer's ``model`` argument was (or was loaded from): the path given,
    or a model instance's ``name_or_path``; None for a hub id or a model made in memory."""
    path = model if isinstance(model, str) else getattr(model, "name_or_path", None)
    return path if isinstance(path, str) and os.path.isdir(path) else None


def saved_log_z(folder: str | None) -> float | None:
    """The logZ ``save_model`` wrote into ``folder``; None when there is none. ValueError (one
    line) for a file that does not hold a finite number."""
    if folder is None or not os.path.isfile(path := os.path.join(folder, LOG_Z_FILE)):
        return None
    try:
        with open(path, encoding="utf-8") as src:
            value = float(json.load(src)["log_z"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"GFlowNetTrainer: {path} does not hold a logZ ({err}); delete it to start logZ at "
            "log_z_init, or pass log_z_from_model=False"
        ) from None
    if not math.isfinite(value):
        raise ValueError(
            f"GFlowNetTrainer: {path} holds logZ {value}; delete it to start logZ at log_z_init, "
            "or pass log_z_from_model=False"
        )
    return value


def save_gflownet_state(trainer: Any, folder: str) -> None:
    """Write ``trainer``'s GFlowNet state into checkpoint ``folder``."""
    buffer = trainer.buffer
    if buffer is not None:  # forget the ids of prompts the buffer no longer holds
        ids = trainer.replay_prompt_ids
        trainer.replay_prompt_ids = {p: ids[p] for p in buffer.prompts() if p in ids}
    state = {
        "log_z": trainer.log_z.detach().cpu().clone(),
        "buffer": None if buffer is None else buffer.state_dict(),
        "replay_rng": trainer.replay_rng.bit_generator.state,
        "replay_prompt_ids": dict(trainer.replay_prompt_ids),
    }
    rank = trainer.accelerator.process_index
    torch.save(state, os.path.join(folder, STATE_FILE.format(rank=rank)))


def load_gflownet_state(trainer: Any, checkpoint: str) -> None:
    """Restore ``trainer``'s GFlowNet state from ``checkpoint`` (a folder save_gflownet_state
    wrote into)."""
    path = os.path.join(checkpoint, STATE_FILE.format(rank=trainer.accelerator.process_index))
    # our own file, written by save_gflownet_state: numpy arrays and plain values
    state = torch.load(path, weights_only=False)
    with torch.no_grad():
        trainer.log_z.copy_(state["log_z"])
    if trainer.buffer is not None and state["buffer"] is not None:
        trainer.buffer.load_state_dict(state["buffer"])
    trainer.replay_rng.bit_generator.state = state["replay_rng"]
    trainer.replay_prompt_ids = dict(state.get("replay_prompt_ids", {}))


def initial_log_z(config: Any, folder: str | None) -> float:
    """Where a trainer's logZ starts: the logZ saved in model ``folder`` when ``config`` (a
    GFlowNetConfig) has ``log_z_from_model`` and the folder has one, else ``log_z_init``."""
    saved = saved_log_z(folder) if config.log_z_from_model else None
    if saved is None:
        return float(config.log_z_init)
    logger.info(
        "GFlowNetTrainer: logZ starts at %s, saved with the model in %s (not log_z_init %s; "
        "log_z_from_model=False keeps log_z_init)",
        saved,
        folder,
        config.log_z_init,
    )
    return saved
