"""``GFlowNetConfig``: TRL's ``GRPOConfig`` plus raptb's objective, reward and replay knobs.

Every new field is described once, in its ``help`` metadata (what ``HfArgumentParser`` shows on
the command line); the class docstring's parameter list is generated from the same text in TRL's
format. Defaults are those of raptb's core objectives and of ``raptb train`` (logZ learning rate
0.1, lambda 50, kappa 0, reward temperature 1, replay capacity 200, replay fraction 0.5 -> 0.25).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from trl import GRPOConfig

from raptb.core.gfn.objectives import (
    OBJECTIVES,
    Objective,
    RapTB,
    SubTB,
    objective_by_name,
    objective_hyperparameters,
)
from raptb.core.replay import (
    NO_REPLAY,
    buffer_class,
    option_default,
    replay_kinds,
    replay_kwargs,
)
from raptb.core.schedules import LinearSchedule
from raptb.integrations.trl.replay import REPLAY_SCOPES

SUBM_SHINGLES = ("text", "words")
_RAPTB = {f.name: f.default for f in fields(RapTB)}
_SUBTB = {f.name: f.default for f in fields(SubTB)}
# GFlowNetConfig field -> the buffer option it sets (the option names of each kind's schema,
# core/replay/options.py: what [replay] and the task presets name them); a kind reads the options
# its schema declares, so a plug-in buffer that declares ``capacity`` gets ``replay_capacity``
_BUFFER_FIELDS = {
    "replay_capacity": "capacity",
    "rp_tolerance": "rp_tolerance",
    "prt_alpha": "prt_alpha",
    "prt_beta": "prt_beta",
    "subm_weights": "subm_weights",
    "subm_gating_ratio": "gating_ratio",
    "subm_shingles": "shingle_on",
    "subm_shingle_k": "shingle_k",
}
# GFlowNetConfig field -> the core objective hyperparameter it sets (``beta`` is TRL's KL weight,
# so RapTB's soft-backup inverse temperature is ``soft_beta`` here)
_OBJECTIVE_FIELDS = {
    "eta": "eta",
    "gamma": "gamma",
    "alpha": "alpha",
    "soft_beta": "beta",
    "rho": "rho",
    "horizon": "horizon",
    "target": "target",
    "detach_pterm": "detach_pterm",
    "absorb": "absorb",
    "absorb_eps": "absorb_eps",
    "subtb_lambda": "subtb_lambda",
    "subtb_normalization": "normalization",
}


def _help(default: Any, text: str) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass
class GFlowNetConfig(GRPOConfig):
    r"""
    Configuration class for [`GFlowNetTrainer`]: [`~trl.GRPOConfig`] plus raptb's GFlowNet
    objective, reward and replay parameters. TRL's `beta` (KL weight), the advantage and clipping
    fields (`scale_rewards`, `loss_type`, `epsilon`, `epsilon_high`, `delta`,
    `importance_sampling_level`, `top_entropy_quantile`, `entropy_coef`, `off_policy_mask_threshold`
    and the `vllm_importance_sampling_*` fields) are not used by the GFlowNet loss.
    `num_iterations` is TRL's: each generation batch is trained on that many times (the later
    passes off-policy, which the GFlowNet objectives allow). With `loss="subtb"` or `"vargrad"`
    the learned logZ is not used (SubTB's cancels, VarGrad estimates it from the batch), so
    `log_z_init` and `log_z_lr` have no effect.

    Parameters:
    """

    loss: str = _help(
        "raptb",
        "GFlowNet objective: 'tb', 'subtb', 'raptb', 'avg_prefix_tb', 'root_subtb_logz' or "
        "'vargrad' (raptb.core.gfn.objectives).",
    )
    eta: float = _help(_RAPTB["eta"], "RapTB: weight of the auxiliary prefix loss.")
    gamma: float = _help(_RAPTB["gamma"], "RapTB: decay gamma^(h-k) of the absorbed correction.")
    alpha: float = _help(_RAPTB["alpha"], "RapTB: weight of the max backup in the target mix.")
    soft_beta: float = _help(
        _RAPTB["beta"],
        "RapTB: inverse temperature of the soft backup (raptb's `beta`; TRL's `beta` is the KL "
        "weight, unused here).",
    )
    rho: float = _help(_RAPTB["rho"], "RapTB: per-step length penalty of the soft backup.")
    k_min: int = _help(_RAPTB["k_min"], "RapTB: shallowest prefix depth of the auxiliary loss.")
    k_min_end: int | None = _help(
        None,
        "RapTB: k_min at the end of training, reached linearly over `max_steps` and truncated "
        "to an integer. If `None`, k_min is constant.",
    )
    horizon: int | None = _help(
        _RAPTB["horizon"], "RapTB: backup horizon cap K. If `None`, the completion's length."
    )
    target: str = _help(
        _RAPTB["target"], "RapTB: absorbed target, 'max', 'soft' or 'mix' (their alpha mix)."
    )
    detach_pterm: bool = _help(
        _RAPTB["detach_pterm"], "RapTB: stop the gradient of p_term in the auxiliary branch."
    )
    absorb: bool = _help(
        _RAPTB["absorb"], "RapTB: reward absorption (`False`: the 'w/o reward absorb' ablation)."
    )
    absorb_eps: float = _help(
        _RAPTB["absorb_eps"], "RapTB: prefixes with |u_k| <= absorb_eps take the future target."
    )
    subtb_lambda: float | None = _help(
        None,
        "Window or prefix weight base of subtb, root_subtb_logz and raptb. If `None`, each "
        "objective's own default (0.9 for the SubTB family, 1 = uniform for RapTB).",
    )
    subtb_normalization: str = _help(
        _SUBTB["normalization"],
        "SubTB: 'trajectory' (mean within each completion, then over the batch) or 'batch' "
        "(total weight of the batch, as the paper's reference code).",
    )
    kappa: float = _help(
        0.0,
        "Weight of the reference model's log-probability in the log-reward: log R = (kappa log "
        "P_ref + reward_scale * reward) / reward_temperature. The reference is the initial model "
        "(the adapter disabled with PEFT).",
    )
    reward_scale: float = _help(
        50.0, "lambda: the task reward's weight in the log-reward (u = lambda * reward / T_R)."
    )
    reward_temperature: float = _help(
        1.0, "Reward temperature T_R: the whole log-reward is divided by it."
    )
    log_z_init: float = _help(
        0.0,
        "Initial value of the learned log-partition logZ (unless log_z_from_model finds one).",
    )
    log_z_from_model: bool = _help(
        True,
        "Start logZ from the model folder's gflownet_log_z.json (what save_model writes beside "
        "the weights) when it has one, instead of log_z_init.",
    )
    log_z_lr: float = _help(
        0.1, "Learning rate of logZ, a float32 scalar in its own optimizer group (no decay)."
    )
    replay: str = _help(
        "none",
        "Replay buffer, one store per prompt: 'none', 'rp' (reward-prioritised), 'prt' (two-tier "
        "prioritised), 'subm' (submodular: reward, validity, diversity, length) or a kind added "
        "with `raptb.register_buffer` (not 'oracle', whose items come from a task's solution "
        "set).",
    )
    replay_options: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "More options of the replay buffer, by the names `raptb train`'s [replay] "
            "section uses (e.g. {'bin_weight_power': 1.0} for SubM, or a plug-in buffer's own); "
            "a name the kind does not take is refused. They override the fields above."
        },
    )
    replay_scope: str = _help(
        "across_prompts",
        "Which stored items a replaced row may take. 'across_prompts': an item of any stored "
        "prompt, trained under its own prompt (the row's prompt is replaced too), so replay fires "
        "on a dataset whose prompts are each seen once (TRL's usual single pass). 'per_prompt': "
        "only items of the row's own prompt, so replay fires only when a prompt comes back "
        "(several epochs or repeated prompts).",
    )
    replay_fraction: float = _help(
        0.5,
        "Fraction of each generation batch replaced by buffer items (see `replay_scope`), at the "
        "start of training.",
    )
    replay_fraction_end: float | None = _help(
        0.25,
        "Replay fraction at the end of training, reached linearly over `max_steps`. If `None`, "
        "`replay_fraction` throughout.",
    )
    replay_capacity: int | None = _help(
        None,
        "Replay items kept per prompt. If `None`, the buffer kind's own (200 for rp, prt and "
        "subm; a plug-in buffer's own default).",
    )
    replay_valid_min_reward: float | None = _help(
        None,
        "A completion whose reward is at least this counts as valid for SubM's validity term and "
        "gating. If `None`, every completion is valid.",
    )
    subm_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "SubM's [w_rew, w_val, w_div, w_len] (reward, validity, diversity, length). "
            "If `None`, [1, 1, 1, 1]."
        },
    )
    subm_gating_ratio: float = _help(
        option_default("subm", "gating_ratio"),
        "SubM validity gating: least fraction of valid items among the candidates (1: valid "
        "items only).",
    )
    subm_shingles: str = _help(
        option_default("subm", "shingle_on"),
        "SubM similarity: Jaccard on k-gram shingles of the completion's characters ('text') or "
        "words ('words'); a `replay_similarity` callable given to the trainer replaces it.",
    )
    subm_shingle_k: int = _help(option_default("subm", "shingle_k"), "SubM: shingle size k.")
    rp_tolerance: float = _help(
        option_default("rp", "rp_tolerance"),
        "RP/PRT near-duplicate filter: an item within token edit distance tolerance * (len_a + "
        "len_b) of a stored item with no lower reward is not added.",
    )
    prt_alpha: float = _help(
        option_default("prt", "prt_alpha"),
        "PRT: fraction of replayed items drawn from the top tier.",
    )
    prt_beta: float = _help(
        option_default("prt", "prt_beta"),
        "PRT: the top tier is the best ceil(prt_beta * size) items.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta != 0.0:
            raise ValueError(
                "GFlowNetConfig: TRL's `beta` (KL weight) is not used; the reference model enters "
                "the log-reward through `kappa`"
            )
        if self.mask_truncated_completions:
            raise ValueError(
                "GFlowNetConfig: mask_truncated_completions is not supported; a completion cut at "
                "max_completion_length is a trajectory whose stop is forced there"
            )
        if self.loss not in OBJECTIVES:
            raise ValueError(f"loss: must be one of {', '.join(OBJECTIVES)}, got {self.loss!r}")
        kinds = [kind for kind in replay_kinds() if kind == NO_REPLAY or not _oracle(kind)]
        if _oracle(self.replay):
            raise ValueError(
                f"replay: {self.replay!r} is not available here, since its items come from a "
                f"task's solution set; use one of {kinds}"
            )
        if self.replay not in kinds:
            raise ValueError(f"replay: must be one of {kinds}, got {self.replay!r}")
        if self.replay_scope not in REPLAY_SCOPES:
            raise ValueError(
                f"replay_scope: must be one of {REPLAY_SCOPES}, got {self.replay_scope!r}"
            )
        if self.subm_shingles not in SUBM_SHINGLES:
            raise ValueError(
                f"subm_shingles: must be one of {SUBM_SHINGLES}, got {self.subm_shingles!r}"
            )
        for name in ("replay_fraction", "replay_fraction_end", "subm_gating_ratio"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}: must lie in [0, 1], got {value}")
        for name in ("kappa", "reward_scale"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name}: must be finite and >= 0, got {getattr(self, name)}")
        for name in ("reward_temperature", "log_z_lr"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name}: must be finite and > 0, got {getattr(self, name)}")
        if self.subm_weights is not None and len(self.subm_weights) != 4:
            raise ValueError(f"subm_weights: expected 4 values, got {self.subm_weights}")
        self.objective(horizon=1)  # out-of-range hyperparameters fail here, not mid-training
        if self.replay != NO_REPLAY:
            self.buffer_kwargs()  # and so do the buffer's

    def objective(self, horizon: int) -> Objective:
        """The configured core objective, its k_min schedule running over ``horizon`` steps."""
        names = set(objective_hyperparameters(self.loss))
        kwargs = {
            core: getattr(self, mine)
            for mine, core in _OBJECTIVE_FIELDS.items()
            if core in names and not (mine == "subtb_lambda" and self.subtb_lambda is None)
        }
        if "k_min" in names:
            end = self.k_min if self.k_min_end is None else self.k_min_end
            kwargs["k_min"] = LinearSchedule(self.k_min, end, horizon, integer=True)
        return objective_by_name(self.loss, **kwargs)

    def replay_fraction_at(self, step: int, horizon: int) -> float:
        """The fraction of a generation batch replayed at optimizer step ``step`` of ``horizon``."""
        end = self.replay_fraction if self.replay_fraction_end is None else self.replay_fraction_end
        return LinearSchedule(self.replay_fraction, end, max(horizon, 0))(step)

    def buffer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``make_buffer(self.replay, ...)``: the buffer fields and
        ``replay_options`` by option name, read through the kind's options schema (the fields
        the kind does not declare are left out; a ``replay_options`` name it does not declare,
        or a value it refuses, is a ValueError naming it)."""
        fields_ = {option: getattr(self, name) for name, option in _BUFFER_FIELDS.items()}
        extra = dict(self.replay_options or {})
        try:
            replay_kwargs(self.replay, extra)  # strict: a name the kind does not take
        except ValueError as exc:
            raise ValueError(f"replay_options: {_named(exc, self.replay, extra, True)}") from None
        try:
            return replay_kwargs(self.replay, {**fields_, **extra}, strict=False)
        except ValueError as exc:
            # name the field the user set: check them one at a time
            for name, option in _BUFFER_FIELDS.items():
                if option not in extra:
                    mine = {option: fields_[option]}
                    try:
                        replay_kwargs(self.replay, mine, strict=False)
                    except ValueError as alone:
                        raise ValueError(
                            f"{name}: {_named(alone, self.replay, mine, False)}"
                        ) from None
            raise ValueError(f"replay: {exc}") from None


def _named(exc: ValueError, kind: str, options: dict[str, Any], as_option: bool) -> str:
    """``exc``'s message with a buffer constructor keyword it opens with (``alpha must be ...``)
    said as the option of ``options`` that set it (``prt_alpha: must be ...``), or without a name
    (``must be ...``) when not ``as_option``: the caller names the field that set it."""
    message = str(exc)
    for option in buffer_class(kind).options:
        if option.name in options:
            for argument in option.arguments:
                if message.startswith(f"{argument} "):
                    rest = message.removeprefix(f"{argument} ")
                    return f"{option.name}: {rest}" if as_option else rest
    return message


def _oracle(kind: str) -> bool:
    """Whether ``kind`` is a registered buffer kind whose items come from the task (Oracle)."""
    return kind in replay_kinds() and kind != NO_REPLAY and buffer_class(kind).oracle


def _parameter_doc(f: Field[Any]) -> str:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    default = f.default if f.default is not MISSING else None
    shown = f"defaults to `{default!r}`" if default is not None else "defaults to `None`"
    text = textwrap.fill(
        f.metadata["help"], 100, initial_indent=" " * 12, subsequent_indent=" " * 12
    )
    return f"        {f.name} (`{kind}`, *optional*, {shown}):\n{text}"


_NEW_FIELDS = [f for f in fields(GFlowNetConfig) if f.name in GFlowNetConfig.__annotations__]
GFlowNetConfig.__doc__ = (
    (GFlowNetConfig.__doc__ or "").rstrip()
    + "\n"
    + "\n".join(_parameter_doc(f) for f in _NEW_FIELDS)
)
