"""Run configuration: pydantic models, read from a TOML file and/or CLI flags, validated once.

A run is described by one ``TrainConfig``. Defaults follow the paper's Expr24 setting (tables
"Core training and decoding hyperparameters", "RapTB-specific hyperparameters", "Factor
schedulers") with two deliberate changes for the embedded from-scratch model: a larger policy
learning rate (1e-3 instead of LoRA's 1e-4) and logZ in its own parameter group (lr 0.1, float32),
see objectives.md "logZ". Schedules run over ``schedule_steps`` optimizer steps (default: the
run's ``steps``), so a shorter run keeps the paper's schedule shape. ``task = "smiles"`` switches
the defaults to the paper's SMILES column (``TASK_PRESETS``; SubM's weights follow
``core.replay.SUBM_PRESETS``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from raptb.app.durable import write_atomically

TaskName = Literal["expr24", "smiles", "custom"]
LossName = Literal["tb", "subtb", "raptb", "avg_prefix_tb", "root_subtb_logz", "vargrad"]
ReplayName = Literal["none", "rp", "prt", "subm", "oracle"]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0, le=1)]
ProbabilityPair = tuple[Probability, Probability]
"""A linear schedule (start, end) of probabilities."""
TemperaturePair = tuple[Positive, Positive]
"""A linear schedule (start, end) of sampling temperatures."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectiveConfig(_Section):
    """Objective hyperparameters; ``None`` keeps the objective's own default (core.objectives)."""

    eta: NonNegative = 0.25
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.99
    alpha: Annotated[float, Field(ge=0, le=1)] = 0.8
    beta: Positive = 3.0
    rho: NonNegative = 0.5
    k_min: tuple[int, int] = (7, 3)
    """k_min schedule (start, end), linear over the schedule, integer-truncated."""
    horizon: Annotated[int, Field(ge=1)] | None = None
    target: Literal["max", "soft", "mix"] = "mix"
    detach_pterm: bool = True
    absorb_eps: NonNegative = 1e-6
    subtb_lambda: Positive | None = None
    """Window/prefix weight base; None keeps each objective's default (SubTB family 0.9,
    RapTB 1 = uniform)."""

    @model_validator(mode="after")
    def _k_min_positive(self) -> ObjectiveConfig:
        if min(self.k_min) < 1:
            raise ValueError("k_min values must be >= 1")
        return self


class OptimConfig(_Section):
    lr: Positive = 1e-3
    log_z_lr: Positive = 0.1
    log_z_init: Finite = 0.0
    weight_decay: NonNegative = 0.0
    batch_size: Annotated[int, Field(ge=1)] = 32
    """Trajectories per micro-batch."""
    grad_accum: Annotated[int, Field(ge=1)] = 4
    clip: Positive | None = 0.5


class SamplingConfig(_Section):
    temp_hi: TemperaturePair = (1.5, 1.0)
    temp_lo: TemperaturePair = (0.8, 1.0)
    low_temp_prob: Probability = 0.666
    """Probability that an on-policy batch uses a temperature drawn from [T_lo, T_hi]."""


class ReplayConfig(_Section):
    kind: ReplayName = "subm"
    capacity: Annotated[int, Field(ge=1)] = 200
    p_replay: ProbabilityPair = (0.5, 0.25)
    p_oracle: ProbabilityPair = (0.75, 0.25)
    """Oracle replay: probability that an on-policy batch has rows spliced from the oracle."""
    oracle_fraction: Probability = 0.7
    subm_diversity: Literal["facility", "dispersion"] = "facility"
    """SubM's diversity term: the paper's facility location, or the released reference code's
    dispersion rule w_div (1 - max_{s in S} sim(x, s)) for comparison runs."""


class RewardConfig(_Section):
    reward_scale: NonNegative = 50.0
    """lambda: u_k = lambda * S(prefix_k)."""
    kappa: NonNegative = 0.0
    """Weight of the frozen reference model's log-probability in log R."""
    workers: Annotated[int, Field(ge=0)] = 0
    """Processes that score distinct prefixes in parallel (0: in the trainer); for slow rewards.
    The task must be picklable (a custom reward defined at module level is)."""
    max_failed_steps: Annotated[int, Field(ge=1)] = 10
    """Stop after this many consecutive steps in which every reward call raised or was
    non-finite."""


class LoraConfig(_Section):
    """LoRA adapters on the attention and MLP projections; ``rank`` None or 0 trains every weight.

    Pretrained models (any ``model`` but "tiny") default to the paper's rank 16 with lr 1e-4
    (``PRETRAINED_PRESET``); pass rank 0 for full fine-tuning.
    """

    rank: Annotated[int, Field(ge=0)] | None = None
    alpha: Positive = 16.0
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1


class SmilesConfig(_Section):
    """SMILES task options (adapters.smiles); ``max_length = 15`` is the paper's stress setting."""

    scaffolds: Path | None = None
    """Text file of scaffolds (one SMILES with exactly one '*' per line); None: the paper's."""
    min_length: Annotated[int, Field(ge=1)] = 1
    max_length: Annotated[int, Field(ge=1)] = 10
    ring_closures: bool = False
    """Let fragments use ring-closure digits (off: they would clash with the scaffold's rings)."""


class CustomConfig(_Section):
    """A user task (``task = "custom"``, adapters.custom): reward function by dotted path."""

    reward: str | None = None
    """``module:function`` taking (prompt, text) and returning a score (see adapters.custom)."""
    alphabet: str | None = None
    """Characters generated tokens may use; None allows every token."""
    grammar_file: Path | None = None
    """EBNF (xgrammar dialect) the generated text must follow; None: no grammar."""
    min_length: Annotated[int, Field(ge=0)] = 1
    max_length: Annotated[int, Field(ge=1)] = 20
    prompts: list[str] = [""]


class TrainConfig(_Section):
    task: TaskName = "expr24"
    loss: LossName = "raptb"
    model: str = "tiny"
    seed: int = 0
    steps: Annotated[int, Field(ge=1)] = 1500
    """Optimizer steps (each of ``grad_accum`` micro-batches)."""
    schedule_steps: Annotated[int, Field(ge=1)] | None = None
    checkpoint_every: Annotated[int, Field(ge=1)] = 100
    keep_checkpoints: Annotated[int, Field(ge=1)] = 2
    max_nonfinite: Annotated[int, Field(ge=1)] = 10
    """Stop with an error after this many consecutive steps with a non-finite loss."""
    threads: Annotated[int, Field(ge=1)] | None = None
    eval_samples: Annotated[int, Field(ge=1)] = 6400
    objective: ObjectiveConfig = ObjectiveConfig()
    optim: OptimConfig = OptimConfig()
    sampling: SamplingConfig = SamplingConfig()
    replay: ReplayConfig = ReplayConfig()
    reward: RewardConfig = RewardConfig()
    lora: LoraConfig = LoraConfig()
    smiles: SmilesConfig = SmilesConfig()
    custom: CustomConfig = CustomConfig()

    @model_validator(mode="after")
    def _custom_needs_reward(self) -> TrainConfig:
        if self.task == "custom" and not self.custom.reward:
            raise ValueError("task 'custom' needs custom.reward = 'module:function'")
        return self

    @property
    def schedule_horizon(self) -> int:
        return self.schedule_steps or self.steps

    def objective_kwargs(self) -> dict[str, Any]:
        """Hyperparameters for ``objective_by_name(self.loss, ...)``: only those it takes."""
        from raptb.core.objectives import objective_hyperparameters
        from raptb.core.schedules import LinearSchedule

        values = self.objective.model_dump()
        start, end = values.pop("k_min")
        values["k_min"] = LinearSchedule(start, end, self.schedule_horizon, integer=True)
        taken = objective_hyperparameters(self.loss)
        return {k: v for k, v in values.items() if k in taken and v is not None}


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


# Per-task defaults (the paper's columns of its hyperparameter tables), applied under the file and
# the flags: a value the user sets always wins. Expr24's are the field defaults themselves.
TASK_PRESETS: dict[str, dict[str, Any]] = {
    "smiles": {
        "eval_samples": 3200,
        "reward": {"kappa": 1.0, "reward_scale": 50.0},
        "objective": {"alpha": 0.5, "beta": 5.0, "rho": 0.1, "k_min": [5, 2]},
    },
}


# The paper fine-tunes pretrained models with LoRA rank 16 at lr 1e-4; the embedded "tiny" model is
# trained from scratch, whole, at the larger default lr.
PRETRAINED_PRESET: dict[str, Any] = {"lora": {"rank": 16}, "optim": {"lr": 1e-4}}


def build_config(file: Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read ``file`` (TOML) if given, apply ``overrides`` (dotted keys allowed), validate once.

    The task's ``TASK_PRESETS`` fill in every value neither the file nor the overrides set.
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
    task = data.get("task", "expr24")
    if isinstance(task, str):
        data = _merge(TASK_PRESETS.get(task, {}), data)
    if data.get("model", "tiny") != "tiny":
        data = _merge(PRETRAINED_PRESET, data)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None


def save_config(config: TrainConfig, path: Path) -> None:
    """Write ``config`` as TOML, atomically (None values are omitted: they mean "default")."""
    data = config.model_dump(mode="json", exclude_none=True)
    write_atomically(path, tomli_w.dumps(data))


def load_config(path: Path) -> TrainConfig:
    return build_config(path)
