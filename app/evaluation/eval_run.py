"""The run an evaluation reads and the folder it writes: its configuration, its latest usable
checkpoint, that checkpoint's policy, ``eval/`` and its metrics file. Shared by the sampled
evaluation (app.evaluation.evaluate) and the exact one (app.evaluation.exact_eval); every failure
is a one-line ``EvalError``."""

from __future__ import annotations

from pathlib import Path

import torch

from raptb.adapters.lm.lora import is_adapter_folder
from raptb.adapters.lm.policy import HFPolicy
from raptb.app.configuration.config import TrainConfig
from raptb.app.run_dir.checkpoint import MODEL_DIR, CheckpointError, newest_usable
from raptb.app.run_dir.run_config import CONFIG_FILE, load_config
from raptb.app.task_and_policy import build_policy
from raptb.core.ports import Task

METRICS_FILE = "metrics.json"
"""The sampled evaluation's metrics, in the run's ``eval/`` (app.run_dir.eval_folder)."""


class EvalError(ValueError):
    """Evaluation cannot start (bad run directory or argument); the message is one line."""


def training_temperature(config: TrainConfig) -> float:
    """The temperature the run's policy samples at when trained: ``rl.temperature`` for the
    reward-maximising baselines (``--loss grpo|ppo``: TRL's defaults 1.0 and 0.7), 1 for the
    GFlowNet objectives (their sampler is the policy itself; the tempered behaviour mix is
    exploration)."""
    return config.rl.temperature if config.loss_entry.section == "rl" else 1.0


def load_run(run_dir: Path) -> tuple[TrainConfig, Path]:
    """The run's configuration and its latest checkpoint folder, or a one-line EvalError."""
    if not run_dir.is_dir():
        raise EvalError(f"run_dir: {run_dir} is not a directory")
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise EvalError(f"run_dir: {run_dir} has no config.toml (not a run directory)")
    config = load_config(config_path)
    try:  # verified; falls back past a bad newest one
        checkpoint = newest_usable(run_dir, needs=(MODEL_DIR,))
    except CheckpointError as exc:
        raise EvalError(f"checkpoint: {exc}") from None
    if checkpoint is None:
        raise EvalError(f"run_dir: {run_dir} has no checkpoint under checkpoints/ (train first)")
    return config, checkpoint


def checkpoint_policy(
    config: TrainConfig, checkpoint: Path, task: Task, *, device: torch.device | None = None
) -> HFPolicy:
    """The policy saved in ``checkpoint`` on ``device`` (default: as ``build_policy``); a LoRA
    checkpoint holds the adapter only, so the base model is rebuilt and the adapter loaded."""
    model = checkpoint / MODEL_DIR
    try:
        decode = config.sampling.decode
        if is_adapter_folder(model):
            return build_policy(
                config.model,
                task,
                config.seed,
                lora=config.lora,
                adapter=model,
                device=device,
                decode=decode,
                tiny=config.tiny,
                dtype=config.model_dtype,
            )
        return build_policy(
            str(model), task, config.seed, device=device, decode=decode, dtype=config.model_dtype
        )
    except ValueError as exc:
        raise EvalError(f"checkpoint: {checkpoint}: {exc}") from exc
