"""The loss registry (app.configuration.losses): one entry per ``loss``, which the configuration
reads for the section, the replay rule and the presets, and which refuses an inconsistent entry."""

from __future__ import annotations

import pytest

from raptb.app.configuration.config import ConfigError, build_config
from raptb.app.configuration.losses import GFLOWNET_ALGORITHM, LOSSES, Loss, loss_entry
from raptb.core.gfn.objectives import TB, VarGrad
from raptb.core.rl.grpo import GRPO
from raptb.core.rl.ppo import PPO


def test_each_loss_reads_its_section_and_presets():
    assert loss_entry("vargrad") == Loss("vargrad", VarGrad, GFLOWNET_ALGORITHM)
    assert VarGrad.holds_log_z and not TB.holds_log_z
    assert GRPO.grouped and not PPO.grouped
    assert (GRPO(beta=0.04).uses_reference, GRPO().uses_reference) == (True, False)
    ppo = build_config(overrides={"loss": "ppo"})
    assert (ppo.replay.kind, ppo.rl.temperature) == ("none", 0.7)  # its entry's presets
    assert ppo.build_objective() == PPO(**ppo.objective_kwargs())
    with pytest.raises(ConfigError, match="rows_per_prompt 6 must each be a multiple"):
        build_config(overrides={"loss": "grpo", "optim.rows_per_prompt": 6})  # grouped
    assert build_config(overrides={"loss": "ppo", "optim.rows_per_prompt": 6})  # not grouped
    assert list(LOSSES)[-9:] == [
        *("grpo", "ppo", "dapo", "passk", "ucpo", "g2rpo", "ips_grpo", "rover", "flowrl")
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("tb", GRPO, GFLOWNET_ALGORITHM), "the objective's name 'grpo' differs from the loss's"),
        (("grpo", GRPO, GFLOWNET_ALGORITHM), "section 'objective' needs a subclass of"),
        (("tb", TB, "no_class_here"), "algorithm must be 'module:Class'"),
    ],
)
def test_an_inconsistent_entry_is_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        Loss(*arguments)


def test_grpo_variants_read_the_rl_section_and_presets():
    from raptb.core.rl.dapo import DAPO
    from raptb.core.rl.g2rpo import G2RPO
    from raptb.core.rl.passk import PassK
    from raptb.core.rl.ucpo import UCPO

    dapo = build_config(overrides={"loss": "dapo"})
    assert (dapo.replay.kind, dapo.rl.epsilon_high, dapo.rl.filter_groups) == ("none", 0.28, True)
    assert dapo.build_objective() == DAPO(epsilon_high=0.28)
    passk = build_config(overrides={"loss": "passk", "rl.pass_k": 2})
    assert passk.build_objective() == PassK(pass_k=2)
    ucpo = build_config(overrides={"loss": "ucpo", "rl.ucpo_tau": 0.5})
    assert ucpo.build_objective() == UCPO(ucpo_tau=0.5)
    assert UCPO.reads_sequence_log_probs and not PassK.reads_sequence_log_probs
    with pytest.raises(ConfigError, match="ucpo_tau"):
        build_config(overrides={"loss": "ucpo", "rl.ucpo_tau": 1.5})
    g2rpo = build_config(overrides={"loss": "g2rpo", "rl.g2rpo_lambda": 0.5})
    assert g2rpo.replay.kind == "none" and G2RPO.reads_sequence_log_probs
    assert g2rpo.build_objective() == G2RPO(g2rpo_lambda=0.5, g2rpo_cap=1000.0)
    with pytest.raises(ConfigError, match="g2rpo_cap"):
        build_config(overrides={"loss": "g2rpo", "rl.g2rpo_cap": 0})


def test_ips_grpo_and_flowrl_read_the_rl_section():
    from raptb.core.rl.flowrl import FlowRL
    from raptb.core.rl.ips_grpo import IPSGRPO

    ips = build_config(overrides={"loss": "ips_grpo", "rl.ips_epsilon": 0.2})
    assert ips.replay.kind == "none" and IPSGRPO.reads_outcomes
    assert ips.build_objective() == IPSGRPO(ips_epsilon=0.2)
    assert build_config(overrides={"loss": "ips_grpo"}).build_objective().ips_epsilon == 0.01
    with pytest.raises(ConfigError, match="ips_epsilon"):
        build_config(overrides={"loss": "ips_grpo", "rl.ips_epsilon": 1.5})
    flowrl = build_config(overrides={"loss": "flowrl", "rl.num_generations": 4})
    assert flowrl.replay.kind == "none"
    assert flowrl.build_objective() == FlowRL(num_generations=4, flowrl_beta_coef=15.0)
    with pytest.raises(ConfigError, match="flowrl_beta_coef"):
        build_config(overrides={"loss": "flowrl", "rl.flowrl_beta_coef": 0})
    with pytest.raises(ConfigError, match="replay 'none' only"):
        build_config(overrides={"loss": "flowrl", "replay.kind": "rp"})
