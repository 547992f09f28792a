"""The sections of a run's configuration (``[objective]``, ``[optim]``, ``[sampling]``,
``[replay]``, ``[reward]``, ``[lora]``): pydantic models, one field per knob of the paper's tables,
each described once (the CLI help and the docs' reference table are generated from these
descriptions, app.configuration.reference). ``TrainConfig`` (app.configuration.config) assembles
them with the task's presets; a field left None takes the run's task preset.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from raptb.adapters.lm.decode_mode import DecodeMode, current_mode
from raptb.core.did_you_mean import unknown_choice
from raptb.core.gfn.objectives import RapTB
from raptb.core.replay import BUFFERS, buffer_class, option_default, replay_kinds, replay_kwargs

Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0, le=1)]
ProbabilityPair = tuple[Probability, Probability]
"""A linear schedule (start, end) of probabilities."""
TemperaturePair = tuple[Positive, Positive]
"""A linear schedule (start, end) of sampling temperatures."""
_RAPTB_DEFAULTS = {f.name: f.default for f in fields(RapTB)}


def core_default(defaults: dict[str, Any], name: str, description: str, **constraints: Any) -> Any:
    """A field whose default is ``defaults[name]``, a core dataclass's own default, so that it is
    written once; float defaults also refuse NaN and infinities."""
    default = defaults[name]
    if isinstance(default, float):
        constraints.setdefault("allow_inf_nan", False)
    return Field(default, description=description, **constraints)


def _raptb(name: str, description: str, **constraints: Any) -> Any:
    """A field whose default is core RapTB's (the paper's Expr24 column)."""
    return core_default(_RAPTB_DEFAULTS, name, description, **constraints)


class Section(BaseModel):
    """A config section: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectiveConfig(Section):
    """Objective hyperparameters, passed to each objective that takes them (core.gfn.objectives)."""

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
    absorb: bool = _raptb(
        "absorb",
        "RapTB: reward absorption; false is the paper's 'w/o reward absorb' ablation (u_tgt = u, "
        "no correction term).",
    )
    absorb_eps: float = _raptb(
        "absorb_eps", "RapTB: absorb gate; prefixes with |u_k| <= it take the future target.", ge=0
    )
    subtb_lambda: Positive | None = Field(
        None,
        description="Window/prefix weight base; None keeps each objective's own default "
        "(SubTB family 0.9, RapTB 1 = uniform).",
    )

    mode_bonus: NonNegative | tuple[NonNegative, NonNegative] = Field(
        0.0,
        description="Weight lambda of G²RPO's mode bonus added to a GFlowNet objective's loss: "
        "-lambda mean b log pi(y), b = min(1 / (n pi(y)), mode_bonus_cap) on the correct "
        "on-policy rows (core.gfn.mode_bonus); a pair (start, end) moves linearly over the "
        "schedule; 0: the objective alone.",
    )
    mode_bonus_cap: Positive = Field(
        1000.0, description="Cap c of the mode bonus's inverse probability (as rl.g2rpo_cap)."
    )

    @model_validator(mode="after")
    def _k_min_positive(self) -> ObjectiveConfig:
        if min(self.k_min) < 1:
            raise ValueError("k_min values must be >= 1")
        return self


class OptimConfig(Section):
    """AdamW for the policy, and for logZ in its own float32 parameter group."""

    lr: Positive = Field(1e-3, description="Policy learning rate.")
    log_z_lr: NonNegative = Field(
        0.1,
        description="logZ learning rate; 0 holds logZ at log_z_init (the regime of the paper's "
        "released runs, whose bf16 logZ stalled near 0).",
    )
    log_z_init: Finite = Field(0.0, description="Initial logZ (with log_z_start = 'init').")
    log_z_start: Literal["init", "batch"] = Field(
        "init",
        description="Where logZ starts: 'init' at log_z_init; 'batch' at the first step's "
        "batch estimate (VarGrad's: minus the mean over the step's rows of log P_F(x) - "
        "log R(x) under the initial policy), a start any task can use; then trained at "
        "log_z_lr, or held there when it is 0. A resumed run keeps its saved logZ.",
    )
    weight_decay: NonNegative = Field(0.0, description="Policy weight decay (logZ has none).")
    batch_size: Annotated[int, Field(ge=1)] = Field(
        32,
        description="Trajectories per micro-batch: a step's batch_size x grad_accum rows are "
        "rolled out together, and the loss runs over micro-batches of batch_size (memory only). "
        "On the embedded tiny model a GFlowNet step is one micro-batch of batch_size x "
        "grad_accum rows (grad_accum 1; faster on a CPU, the same update) unless either is set.",
    )
    grad_accum: Annotated[int, Field(ge=1)] = Field(
        4, description="Micro-batches per optimizer step."
    )
    rows_per_prompt: Annotated[int, Field(ge=1)] = Field(
        32,
        description="Consecutive rows of a step that share a prompt; a step's rows take "
        "ceil(rows / rows_per_prompt) prompts in turn (independent of the micro-batch split).",
    )
    clip: Positive | None = Field(0.5, description="Gradient-norm clip; None: no clipping.")
    gradient_checkpointing: bool = Field(
        False,
        description="Activation checkpointing (TRL's name) of the teacher-forced rescoring pass: "
        "each transformer block keeps its input instead of its activations and runs again in "
        "backward, less memory for about one more forward (benchmarks/activation_checkpointing"
        ".md); the rollout is unaffected. Also on when the accelerate FSDP config sets "
        "fsdp_activation_checkpointing.",
    )


class DistributedConfig(Section):
    """Multi-process launches (accelerate launch, torchrun); no effect on one process."""

    timeout: Positive = Field(
        600.0,
        description="Seconds a collective (gradient all-reduce, gathers, the stop flag) waits for "
        "every process; past it the run ends with one error line naming the rank that did not "
        "answer, exit 2 (continue with --resume).",
    )


class SamplingConfig(Section):
    """Behaviour policy of on-policy rows."""

    temp_hi: TemperaturePair = Field((1.5, 1.0), description="T_hi schedule (start, end).")
    temp_lo: TemperaturePair = Field((0.8, 1.0), description="T_lo schedule (start, end).")
    low_temp_prob: Probability = Field(
        0.666,
        description="Probability that an on-policy row is sampled at a temperature drawn from "
        "[T_lo, T_hi] (otherwise 1).",
    )
    decode: DecodeMode = Field(
        "auto",
        description="Rollout decoding: static (preallocated KV cache, fixed batch buckets, the "
        "token step replayed as CUDA graphs on a GPU; the same rollouts as eager), compiled "
        "(GPT-2 in float32 on the CPU, compiled by Numba: each token step, forward and draw, in "
        "one compiled call, the whole rollout in one where no xgrammar matcher runs between "
        "steps; the same rollouts as eager up to float rounding), eager (a growing cache, step by "
        "step, torch's operations), vllm (the rows drawn by a vLLM engine in this process, the "
        "weights synced after each optimizer step, the record vLLM's log-probabilities; the vllm "
        "extra, a pretrained model on one process), or auto: static on CUDA, compiled on the CPU "
        "where it applies to a model of at most 2M parameters (above, its products cost more "
        "than eager's), else eager. onnx, compiled's former name, is read as compiled with a "
        "warning.",
    )

    @field_validator("decode", mode="before")
    @classmethod
    def _renamed(cls, value: object) -> object:
        return current_mode(value) if isinstance(value, str) else value


SubmWeights = tuple[NonNegative, NonNegative, NonNegative, NonNegative]
"""SubM's (w_rew, w_val, w_div, w_len)."""


class ReplayConfig(Section):
    """Replay buffer (core.replay). The SubM fields left None take the task's preset (its spec's
    SubM column of the paper), filled in when the configuration is built."""

    kind: str = Field(
        "subm",
        description="Replay: none, rp, prt, subm, oracle (enumerable tasks only); the kinds of "
        "core.replay's registry.",
    )
    capacity: Annotated[int, Field(ge=1)] = Field(
        option_default("subm", "capacity"), description="Items kept per prompt."
    )
    p_replay: ProbabilityPair = Field(
        (0.5, 0.25),
        description="Probability that a row is drawn from the buffer (start, end).",
    )
    p_oracle: ProbabilityPair = Field(
        (0.75, 0.25),
        description="Oracle replay: with oracle_fraction, an on-policy row is replaced by an "
        "oracle solution with probability p_oracle x oracle_fraction (start, end).",
    )
    oracle_fraction: Probability = Field(
        0.7,
        description="Oracle replay: the factor of p_oracle (the paper's fraction of a "
        "spliced batch's rows).",
    )
    subm_weights: SubmWeights | None = Field(
        None,
        description="SubM weights [w_rew, w_val, w_div, w_len] of s(x) = w_rew S + w_val "
        "1[valid], the facility term and the length term; None: the task's preset.",
    )
    gating_ratio: Probability | None = Field(
        None,
        description="SubM validity gating: least fraction of valid items in the candidate pool "
        "(1: valid items only); None: the task's preset.",
    )
    length_bin_size: Annotated[int, Field(ge=1)] | None = Field(
        None, description="SubM length-bin size in tokens; None: the task's preset."
    )
    bin_weight_power: NonNegative | None = Field(
        None,
        description="SubM length-bin weights alpha_b = ((b+1)/n_bins)^p; None: uniform "
        "alpha_b = 1 (the paper's setting).",
    )
    similarity: Literal["jaccard", "tanimoto"] | None = Field(
        None,
        description="SubM similarity: Jaccard on k-gram shingles, or Tanimoto on the task's "
        "fingerprints; None: the task's preset.",
    )
    shingle_k: Annotated[int, Field(ge=1)] | None = Field(
        None, description="SubM Jaccard shingle size k; None: the task's preset."
    )
    shingle_on: Literal["text", "words", "tokens"] | None = Field(
        None,
        description="SubM Jaccard shingles of the text's characters, its words, or the tokens; "
        "None: the task's preset.",
    )
    subm_method: Literal["lazy", "standard"] = Field(
        option_default("subm", "subm_method"),
        description="SubM greedy: lazy (Minoux) selects exactly what the paper's standard greedy "
        "does, faster.",
    )
    subm_diversity: Literal["facility", "dispersion"] = Field(
        option_default("subm", "subm_diversity"),
        description="SubM's diversity term: the paper's facility location, or the released "
        "reference code's dispersion rule for comparison runs.",
    )
    rp_tolerance: NonNegative = Field(
        0.25,
        description="RP/PRT near-duplicate filter: reject an item within token edit distance "
        "tolerance * (len_a + len_b) of a stored item with no lower reward.",
    )
    prt_alpha: Probability = Field(
        0.7, description="PRT: fraction of a replay batch drawn from the top tier."
    )
    prt_beta: Annotated[float, Field(gt=0, le=1)] = Field(
        0.2, description="PRT: the top tier is the best ceil(beta |B|) items."
    )

    def buffer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``make_buffer(self.kind, ...)``: the options its kind reads
        (the options schema of its class in core.replay)."""
        return buffer_class(self.kind).config_kwargs(self.model_dump())

    @field_validator("kind")
    @classmethod
    def _registered_kind(cls, kind: str) -> str:
        if kind not in replay_kinds():
            raise ValueError(unknown_choice("replay kind", kind, replay_kinds()))
        return kind

    @model_validator(mode="after")
    def _valid_for_its_kind(self) -> ReplayConfig:
        """The options the kind reads, validated against its schema (values it refuses)."""
        if self.kind in BUFFERS and not buffer_class(self.kind).oracle:
            names = {option.name for option in buffer_class(self.kind).options}
            if foreign := sorted(names - set(type(self).model_fields)):
                raise ValueError(
                    f"replay kind {self.kind!r} declares {', '.join(foreign)}, which [replay] "
                    "does not hold: a buffer's options take the names of [replay]'s fields"
                )
            replay_kwargs(self.kind, {k: v for k, v in self.model_dump().items() if k in names})
        return self


class RewardConfig(Section):
    """log R_k = (kappa log P_ref(prefix_k + stop) + lambda(t) S(prefix_k)) / T_R(t), with
    u_k = lambda(t) S(prefix_k) / T_R(t) the task-only part that RapTB absorbs."""

    reward_scale: NonNegative = Field(
        50.0, description="lambda: u_k = lambda S(prefix_k); the schedule's start."
    )
    reward_scale_end: NonNegative | None = Field(
        None,
        description="lambda at the schedule's end (linear over the schedule); None: constant.",
    )
    kappa: NonNegative = Field(
        0.0,
        description="Weight of the frozen reference model's log-probability in log R "
        "(the paper: 1; the from-scratch tiny model on Expr24: 0).",
    )
    temperature: Positive = Field(
        1.0, description="Reward temperature T_R (log R is divided by it); the schedule's start."
    )
    temperature_end: Positive | None = Field(
        None, description="T_R at the schedule's end (linear); None: constant."
    )
    rescore_replay: bool | None = Field(
        None,
        description="Score replayed rows again instead of reusing the u stored with them; "
        "None: exactly when lambda or T_R is scheduled.",
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


class LoraConfig(Section):
    """LoRA adapters on the attention and MLP projections (pretrained models: rank 16)."""

    rank: Annotated[int, Field(ge=0)] | None = Field(
        None, description="LoRA rank; None or 0 trains every weight."
    )
    alpha: Positive = Field(16.0, description="LoRA alpha.")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(0.1, description="LoRA dropout.")


class TinyConfig(Section):
    """Shape of the embedded model (``model = "tiny"`` only; adapters.lm.models): a GPT-2 trained
    from scratch with the character tokenizer."""

    layers: Annotated[int, Field(ge=1)] = Field(2, description="Transformer blocks.")
    width: Annotated[int, Field(ge=8)] = Field(64, description="Hidden size (a multiple of heads).")
    heads: Annotated[int, Field(ge=1)] = Field(4, description="Attention heads.")

    @model_validator(mode="after")
    def _divisible(self) -> TinyConfig:
        if self.width % self.heads:
            raise ValueError(f"width ({self.width}) must be a multiple of heads ({self.heads})")
        return self

    def shape(self) -> dict[str, int]:
        """Keyword arguments of ``adapters.lm.models.build_tiny_model``."""
        return {"n_layer": self.layers, "n_embd": self.width, "n_head": self.heads}
