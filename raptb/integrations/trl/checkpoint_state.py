"""What a GFlowNetTrainer checkpoint adds to TRL's: logZ, the replay buffer and its sampler.

Each process writes ``gflownet_state_{rank}.pt`` into TRL's checkpoint folder (``_save_checkpoint``)
and reads it back on resume (``_load_optimizer_and_scheduler``): logZ, the buffer's
``state_dict``, the replay generator's state and the token ids of the prompts the buffer holds.
"""

from __future__ import annotations

import os
from typing import Any

import torch

STATE_FILE = "gflownet_state_{rank}.pt"
"""The per-process file a checkpoint folder gets."""


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
