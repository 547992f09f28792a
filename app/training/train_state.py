"""The trainer's state on disk: what a checkpoint holds and how a run picks it up again.

A checkpoint folder (written through ``app.run_dir.checkpoint.save_atomically``) holds

- ``model/``: the weights (the LoRA adapter only, with LoRA) and the tokenizer;
- ``trainer.pt``: the optimizer state and ``ranks_rng``, every rank's RNG streams
  (app.distribution.distributed.rank_rng_state; one entry for a 1-process run), and the algorithm's
  tensors (the GFlowNet's logZ, PPO's value head);
- ``state``: step, non-finite counters, the successful texts seen, the shared numpy RNG and the
  algorithm's entries (the GFlowNet's replay buffer).

Only rank 0 writes; the other ranks wait for it and return the same folder. A sharded policy
(app.distribution.sharding) is gathered whole first, so the files are those of an unsharded run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from raptb.adapters.lm.lora import ADAPTER_SAVE_OPTIONS, is_peft_model, load_adapter_weights
from raptb.adapters.lm.policy import HFPolicy
from raptb.app.configuration.config import TrainConfig
from raptb.app.distribution.distributed import DistContext, rank_rng_state, restore_rank_rng
from raptb.app.distribution.sharding import (
    full_model_state,
    full_optimizer_state,
    load_optimizer_state,
)
from raptb.app.run_dir.checkpoint import read_state, save_atomically, write_state
from raptb.app.training.algorithm import Algorithm


class Checkpointed(Protocol):
    """What a checkpoint saves and restores of a trainer (app.training.train.Trainer): its run,
    weights,
    optimizer, counters and RNG streams, plus what its algorithm adds (app.training.algorithm:
    ``extra_state`` into ``trainer.pt``, e.g. the GFlowNet's logZ or PPO's value head;
    ``run_state`` into ``state``, e.g. the GFlowNet's replay buffer)."""

    cfg: TrainConfig
    run_dir: Path
    dist: DistContext
    policy: HFPolicy
    optimizer: torch.optim.Optimizer
    algorithm: Algorithm
    generator: torch.Generator
    rng: np.random.Generator
    step: int
    nonfinite_in_row: int
    nonfinite_total: int
    correct_seen: set[str]

    def warn(self, line: str) -> None:
        """Print a warning line (rank 0)."""
        ...


def save_trainer_state(trainer: Checkpointed) -> Path:
    """Checkpoint ``trainer`` at its current step (rank 0 writes); the folder, on every rank."""
    ranks_rng = trainer.dist.all_gather_object(rank_rng_state(trainer.generator))
    sharded = trainer.dist.sharding is not None
    # gathering the shards is a collective: every rank takes part, rank 0 writes
    main = trainer.dist.is_main
    weights = full_model_state(trainer.policy.model, keep=main) if sharded else None
    optimizer = full_optimizer_state(trainer.optimizer, keep=main) if sharded else None

    def write(folder: Path) -> None:
        model_dir = folder / "model"
        model = trainer.policy.model
        options = ADAPTER_SAVE_OPTIONS if is_peft_model(model) else {}
        model.save_pretrained(model_dir, safe_serialization=True, state_dict=weights, **options)
        trainer.policy.tokenizer.save_pretrained(model_dir)
        torch.save(
            {
                "optimizer": trainer.optimizer.state_dict() if optimizer is None else optimizer,
                "ranks_rng": ranks_rng,
                **trainer.algorithm.extra_state(),
            },
            folder / "trainer.pt",
        )
        write_state(
            folder,
            {
                "step": trainer.step,
                "nonfinite_in_row": trainer.nonfinite_in_row,
                "nonfinite_total": trainer.nonfinite_total,
                "correct_seen": sorted(trainer.correct_seen),
                "numpy_rng": trainer.rng.bit_generator.state,
                **trainer.algorithm.run_state(),
            },
        )

    def save() -> Path:
        return save_atomically(trainer.run_dir, trainer.step, write, trainer.cfg.keep_checkpoints)

    return trainer.dist.on_main(save)  # also holds the other ranks until the folder exists


def load_model_weights(model: torch.nn.Module, folder: Path) -> None:
    """The trained weights of checkpoint ``folder`` into ``model`` (the LoRA adapter only, with
    LoRA); before the model is sharded, if it will be."""
    if is_peft_model(model):
        load_adapter_weights(model, folder / "model")
    else:
        trained = AutoModelForCausalLM.from_pretrained(folder / "model")
        model.load_state_dict(trained.state_dict())


def load_trainer_state(trainer: Checkpointed, folder: Path) -> None:
    """Restore the rest of ``trainer`` from checkpoint ``folder``, after
    :func:`load_model_weights` (on every rank: each takes its own RNG streams and, with a sharded
    policy, its shards of the optimizer states; another world size than the writer's continues
    with one warning)."""
    saved = torch.load(folder / "trainer.pt", weights_only=True)
    optimizer = _without_unused_log_z(saved, trainer)
    if trainer.dist.sharding is None:
        trainer.optimizer.load_state_dict(optimizer)
    else:
        load_optimizer_state(trainer.optimizer, optimizer)
    trainer.algorithm.load_extra_state(saved)
    state = read_state(folder)
    trainer.step = int(state["step"])
    restore_rank_rng(
        trainer.dist,
        saved["ranks_rng"],
        trainer.generator,
        seed=trainer.cfg.seed,
        step=trainer.step,
        warn=trainer.warn,
    )
    trainer.nonfinite_in_row = int(state["nonfinite_in_row"])
    trainer.nonfinite_total = int(state["nonfinite_total"])
    trainer.correct_seen = set(state["correct_seen"])
    trainer.rng.bit_generator.state = state["numpy_rng"]
    trainer.algorithm.load_run_state(state)


def _without_unused_log_z(saved: dict[str, Any], trainer: Checkpointed) -> dict[str, Any]:
    """The optimizer state of ``saved`` as ``trainer``'s optimizer takes it. A GRPO or PPO run
    checkpointed before the algorithms had their own classes kept an untrained logZ as the second
    parameter group (and ``log_z`` in ``trainer.pt``); for an algorithm without logZ that group is
    dropped and the later parameters renumbered, so such a run resumes exactly."""
    state = saved["optimizer"]
    groups = state["param_groups"]
    if "log_z" in trainer.algorithm.extra_state() or "log_z" not in saved:
        return state
    if len(groups) != len(trainer.optimizer.param_groups) + 1 or len(groups[1]["params"]) != 1:
        return state  # not that layout: load_state_dict names the mismatch
    kept = [group for i, group in enumerate(groups) if i != 1]
    order = [index for group in kept for index in group["params"]]
    renumber = {old: new for new, old in enumerate(order)}
    return {
        "state": {renumber[k]: v for k, v in state["state"].items() if k in renumber},
        "param_groups": [
            {**group, "params": [renumber[i] for i in group["params"]]} for group in kept
        ],
    }
