"""A loss's own defaults hold unless the file or a flag sets them: a plug-in GRPO with its own
``epsilon`` and ``loss_type``, and a RapTB subclass with its own ``eta`` and ``k_min``, are built
with those, not with the ``[rl]`` or ``[objective]`` section's (which are raptb's classes'); the
built-in losses are unchanged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from raptb.app.configuration.config import build_config
from raptb.app.configuration.losses import GFLOWNET_ALGORITHM, LOSSES, Loss
from raptb.core.gfn.objectives import RapTB
from raptb.core.rl.grpo import GRPO


@dataclass(frozen=True)
class TightGRPO(GRPO):
    """A plug-in's GRPO with a tighter clip and the sample-level loss."""

    name: ClassVar[str] = "tight_grpo"
    epsilon: float = 0.05
    loss_type: str = "grpo"


@dataclass(frozen=True)
class EagerRapTB(RapTB):
    """A plug-in's RapTB weighting its prefixes more, from the second prefix on."""

    name: ClassVar[str] = "eager_raptb"
    eta: float = 0.5
    k_min: int = 2


@pytest.fixture
def plug_in_losses(monkeypatch: pytest.MonkeyPatch) -> None:
    LOSSES.lookup("grpo")  # load the built-in entries first
    monkeypatch.setattr(LOSSES, "_entries", dict(LOSSES._entries))
    LOSSES.register(
        Loss(
            "tight_grpo",
            TightGRPO,
            "raptb.app.training.rl.grpo:GRPOAlgorithm",
            section="rl",
            replay=False,
            presets={"replay": {"kind": "none"}},
        )
    )
    LOSSES.register(Loss("eager_raptb", EagerRapTB, GFLOWNET_ALGORITHM))


def test_a_plug_in_rl_loss_keeps_its_own_defaults(plug_in_losses: None) -> None:
    config = build_config(overrides={"loss": "tight_grpo"})
    assert (config.rl.epsilon, config.rl.loss_type) == (0.05, "grpo")
    objective = config.build_objective()
    assert (objective.epsilon, objective.loss_type) == (0.05, "grpo")
    assert objective.beta == GRPO.beta  # a default it does not change stays GRPO's
    # a flag still wins
    flagged = build_config(overrides={"loss": "tight_grpo", "rl.epsilon": 0.3})
    assert flagged.build_objective().epsilon == 0.3
    assert flagged.build_objective().loss_type == "grpo"


def test_a_plug_in_gflownet_objective_keeps_its_own_defaults(plug_in_losses: None) -> None:
    config = build_config(overrides={"loss": "eager_raptb"})
    assert config.objective.eta == 0.5 and tuple(config.objective.k_min) == (2, 2)
    objective = config.build_objective()
    assert objective.eta == 0.5 and objective.k_min(0) == 2 and objective.k_min(10**6) == 2
    assert objective.gamma == RapTB.gamma  # inherited, not its own: the section's (RapTB's)
    assert (
        build_config(overrides={"loss": "eager_raptb", "objective.eta": 0.1}).objective.eta == 0.1
    )


def test_the_built_in_losses_take_their_sections_defaults() -> None:
    grpo = build_config(overrides={"loss": "grpo"})
    assert (grpo.rl.epsilon, grpo.rl.loss_type) == (GRPO.epsilon, GRPO.loss_type)
    raptb = build_config(overrides={"loss": "raptb"})
    assert raptb.objective.eta == RapTB.eta and tuple(raptb.objective.k_min) == (7, 3)
