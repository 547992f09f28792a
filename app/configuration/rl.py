"""The ``[rl]`` section of a run's configuration: the reward-maximising baselines PPO and GRPO
(``--loss ppo|grpo``, app.training.rl.grpo and .ppo), GRPO's variants (``--loss
dapo|passk|ucpo|g2rpo|ips_grpo``), ROVER (``--loss rover``) and FlowRL (``--loss flowrl``) with
TRL's names (or the authors' where TRL has none), their defaults read from core's dataclasses so
that each is written once. What each RL loss sets under the file and the flags is its entry's in
app.configuration.losses.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal

from pydantic import Field

from raptb.app.configuration.sections import Section, core_default
from raptb.core.rl.flowrl import FlowRL
from raptb.core.rl.g2rpo import G2RPO
from raptb.core.rl.grpo import GRPO
from raptb.core.rl.ips_grpo import IPSGRPO
from raptb.core.rl.passk import PassK
from raptb.core.rl.ppo import PPO
from raptb.core.rl.rover import ROVER
from raptb.core.rl.ucpo import UCPO

# The sampling temperature's default per method, TRL's: GRPOConfig.temperature 1.0 (TRL 1.16,
# trl/trainer/grpo_config.py), PPOConfig.temperature 0.7 (TRL 1.12,
# trl/experimental/ppo/ppo_config.py); the field's default is GRPO's, PPO's is its preset
GRPO_TEMPERATURE = 1.0
PPO_TEMPERATURE = 0.7
# TRL's defaults as core writes them (the names the two share are not in the [rl] section)
_RL_CLASSES = (PPO, GRPO, PassK, UCPO, G2RPO, IPSGRPO, ROVER, FlowRL)
_RL_DEFAULTS = {f.name: f.default for cls in _RL_CLASSES for f in fields(cls)}


def _trl(name: str, description: str, **constraints: Any) -> Any:
    """A field whose default is core GRPO's or PPO's (TRL's)."""
    return core_default(_RL_DEFAULTS, name, description, **constraints)


class RLConfig(Section):
    """PPO and GRPO (``--loss ppo|grpo``): TRL's names and defaults (core.rl.grpo, core.rl.ppo)."""

    temperature: float = Field(
        GRPO_TEMPERATURE,
        description="Sampling temperature of the rollouts; log pi (old, current, reference) is "
        "scored at it, as TRL does (TRL's defaults: GRPO 1.0, PPO 0.7).",
        gt=0,
        allow_inf_nan=False,
    )
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
    entropy_coef: float = _trl(
        "entropy_coef",
        "GRPO: weight of the entropy bonus (mean per-action entropy of the policy at "
        "rl.temperature, whatever the loss_type); the initial one with use_adaptive_entropy.",
        ge=0,
    )
    use_adaptive_entropy: bool = _trl(
        "use_adaptive_entropy",
        "GRPO: adaptive entropy control (Skywork-OR1, TRL's): entropy_coef moves by "
        "entropy_coef_delta each step toward keeping the entropy above entropy_target, and "
        "applies only while the last step's entropy is at or below it.",
    )
    entropy_coef_min: float = _trl(
        "entropy_coef_min", "GRPO: lower bound of the adaptive entropy_coef.", ge=0
    )
    entropy_coef_max: float = _trl(
        "entropy_coef_max", "GRPO: upper bound of the adaptive entropy_coef.", ge=0
    )
    entropy_coef_delta: float = _trl(
        "entropy_coef_delta", "GRPO: step of the adaptive entropy_coef per optimizer step.", ge=0
    )
    entropy_target: float = _trl(
        "entropy_target",
        "GRPO: target mean per-action entropy (nats) of the adaptive control.",
        ge=0,
    )
    # DAPO's dynamic sampling, an option of GRPO's algorithm (app.training.rl
    # .dynamic_sampling); the DAPO authors' names (verl's algorithm.filter_groups), not core's
    filter_groups: bool = Field(
        False,
        description="GRPO: DAPO's dynamic sampling: refill each group whose rewards are all "
        "equal (zero advantages) with a fresh group of its prompt, round after round.",
    )
    max_num_gen_batches: int = Field(
        10,
        description="GRPO with filter_groups: the most generation rounds of a step, the first "
        "included (DAPO's cap; the groups still without variance then train as they are).",
        ge=1,
    )
    pass_k: int = _trl("pass_k", "Pass@k: the k of the pass@k reward (<= num_generations).", ge=1)
    ucpo_tau: float = _trl(
        "ucpo_tau",
        "UCPO: share of the inverse-q advantages over the correct set (0: GRPO; the authors' tau).",
        ge=0,
        le=1,
    )
    ucpo_alpha: float = _trl(
        "ucpo_alpha", "UCPO: sharpening of the incorrect set (the authors' alpha; 0: off).", ge=0
    )
    g2rpo_lambda: float = _trl(
        "g2rpo_lambda",
        "G2RPO: weight of the bonus on correct rows, inverse to their probability (0: GRPO).",
        ge=0,
    )
    g2rpo_cap: float = _trl(
        "g2rpo_cap", "G2RPO: bound of the bonus before its weight (of 1 / (n pi_old(y))).", gt=0
    )
    ips_epsilon: float = _trl(
        "ips_epsilon",
        "IPS-GRPO: floor of an outcome's estimated probability max(n / G, epsilon) before the "
        "reward is divided by it (the authors' clip epsilon; binds only above 1 / G).",
        gt=0,
        le=1,
    )
    flowrl_beta_coef: float = _trl(
        "flowrl_beta_coef",
        "FlowRL: weight beta of the GRPO advantage in the log reward of the trajectory-balance "
        "residual (the authors' flowrl_beta_coef).",
        gt=0,
    )
    norm_adv_by_std_in_grpo: bool = _trl(
        "norm_adv_by_std_in_grpo",
        "ROVER: divide the group-centred reward by the group's std (the authors' switch).",
    )
    rover_action_set: Literal["tree", "vocabulary"] = _trl(
        "rover_action_set",
        "ROVER: the actions the uniform policy averages over at a state: the prefix tree's "
        "children (tokens the grammar allows, the stop where allowed) or the model's whole "
        "vocabulary (the authors').",
    )
    cliprange: float = _trl("cliprange", "PPO: clip range of the policy ratio.", ge=0)
    cliprange_value: float = _trl("cliprange_value", "PPO: clip range of the value.", ge=0)
    vf_coef: float = _trl("vf_coef", "PPO: weight of the value loss.", ge=0)
    kl_coef: float = _trl("kl_coef", "PPO: per-token KL penalty in the rewards.", ge=0)
    kl_estimator: Literal["k1", "k3"] = _trl("kl_estimator", "PPO: KL estimator.")
    gamma: float = _trl("gamma", "PPO: discount.", ge=0, le=1)
    lam: float = _trl("lam", "PPO: GAE lambda.", ge=0, le=1)
    whiten_rewards: bool = _trl("whiten_rewards", "PPO: whiten the token rewards.")
    # TRL's PPOConfig defaults; the update schedule (app.training.rl.ppo_update), not the loss's, so
    # not core's
    num_ppo_epochs: int = Field(
        4,
        description="PPO, ROVER: passes over each step's rollout (TRL's num_ppo_epochs).",
        ge=1,
    )
    num_mini_batches: int = Field(
        1,
        description="PPO, ROVER: shuffled mini-batches per pass, one optimizer step each "
        "(grad_accum x batch_size rows per process must be a multiple).",
        ge=1,
    )
