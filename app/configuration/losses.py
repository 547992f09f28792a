"""The loss registry: one entry per ``loss`` name, carrying its objective and its algorithm.

A run's ``loss`` is read here once. Its :class:`Loss` entry says which objective class to build
(a ``core.gfn.objectives.Objective`` or a ``core.rl.base.RLObjective``) from which config section
(``[objective]`` or ``[rl]``), which training algorithm trains it (the loop imports the class the
entry names and builds it, app.training.algorithm declares its shape), whether it takes a replay
buffer, and the config values it sets under the file and the flags. The objective class itself
declares what the algorithm asks of it (``holds_log_z``, ``uses_reference``, ``grouped``).

Entries come from three places, read once per process on the first lookup:

- the built-in losses: every GFlowNet objective of ``core.gfn.objectives`` with the GFlowNet
  algorithm, then GRPO and PPO with theirs, then DAPO, Pass@k, UCPO, G²RPO and IPS-GRPO (GRPO's
  algorithm), ROVER and FlowRL;
- the ``raptb.objectives`` entry points (core.plugins loads them): a GFlowNet objective class,
  trained by the GFlowNet algorithm;
- the ``raptb.losses`` entry points: a :class:`Loss`, e.g. an RL loss with its own algorithm::

      [project.entry-points."raptb.losses"]
      my_rl = "mypkg.loss:LOSS"     # Loss("my_rl", MyObjective, "mypkg.algorithm:MyAlgorithm",
                                    #      section="rl", replay=False)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from typing import Any, Literal

from raptb.app.configuration.rl import PPO_TEMPERATURE
from raptb.core.gfn.objectives import OBJECTIVES, Objective, register_objective
from raptb.core.plugins import check_class, check_named, load_group_once
from raptb.core.registry import Registry
from raptb.core.replay import NO_REPLAY
from raptb.core.rl.base import RLObjective
from raptb.core.rl.dapo import DAPO, DAPO_EPSILON_HIGH
from raptb.core.rl.flowrl import FlowRL
from raptb.core.rl.g2rpo import G2RPO
from raptb.core.rl.grpo import GRPO
from raptb.core.rl.ips_grpo import IPSGRPO
from raptb.core.rl.passk import PassK
from raptb.core.rl.ppo import PPO
from raptb.core.rl.rover import ROVER
from raptb.core.rl.ucpo import UCPO

LOSS_GROUP = "raptb.losses"
OBJECTIVE_GROUP = "raptb.objectives"
GFLOWNET_ALGORITHM = "raptb.app.training.gflownet.algorithm:GFlowNetAlgorithm"
GRPO_ALGORITHM = "raptb.app.training.rl.grpo:GRPOAlgorithm"
ON_POLICY: dict[str, Any] = {"replay": {"kind": NO_REPLAY}}
"""What an RL loss sets under the file and the flags (an explicit replay other than none is an
error)."""


@dataclass(frozen=True)
class Loss:
    """One ``loss``.

    Attributes:
        name: the ``loss`` value (equal to the objective class's ``name``).
        objective: the objective class, built with the hyperparameters of ``section``.
        algorithm: ``"module:Class"`` of the algorithm that trains it (imported when a run
            starts, so that configuration never imports the training stack).
        section: the config section its hyperparameters come from, ``[objective]`` or ``[rl]``.
        replay: whether it trains on a replay buffer; without, only replay ``none`` is valid.
        presets: config values it sets under the file and the flags (nested, as a TOML file).

    Example: a plug-in's RL loss, GRPO with a tighter clip (its own default holds unless the file
    or a flag sets ``rl.epsilon``), trained by GRPO's algorithm; a package declares it as
    ``[project.entry-points."raptb.losses"] tight_grpo = "mypkg.loss:LOSS"``::

        from dataclasses import dataclass
        from typing import ClassVar

        import raptb
        from raptb.core.rl.grpo import GRPO

        @dataclass(frozen=True)
        class TightGRPO(GRPO):
            name: ClassVar[str] = "tight_grpo"
            epsilon: float = 0.05

        LOSS = raptb.Loss("tight_grpo", TightGRPO, "raptb.app.training.rl.grpo:GRPOAlgorithm",
                          section="rl", replay=False, presets={"replay": {"kind": "none"}})
    """

    name: str
    objective: type[Objective] | type[RLObjective]
    algorithm: str
    section: Literal["objective", "rl"] = "objective"
    replay: bool = True
    presets: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if getattr(self.objective, "name", None) != self.name:
            raise ValueError(
                f"the objective's name {getattr(self.objective, 'name', None)!r} differs from "
                f"the loss's {self.name!r}"
            )
        base = Objective if self.section == "objective" else RLObjective
        if not (isinstance(self.objective, type) and issubclass(self.objective, base)):
            raise ValueError(
                f"a loss of section {self.section!r} needs a subclass of "
                f"{base.__module__}.{base.__qualname__}"
            )
        module, _, attribute = self.algorithm.partition(":")
        if not (module and attribute):
            raise ValueError(f"algorithm must be 'module:Class', got {self.algorithm!r}")

    def algorithm_class(self) -> Any:
        """The algorithm class ``algorithm`` names (imported now)."""
        module, _, attribute = self.algorithm.partition(":")
        return getattr(importlib.import_module(module), attribute)


def _gflownet(cls: type[Objective]) -> Loss:
    return Loss(cls.name, cls, GFLOWNET_ALGORITHM)


_RL_BASELINES = (
    Loss("grpo", GRPO, GRPO_ALGORITHM, section="rl", replay=False, presets=ON_POLICY),
    Loss(
        "ppo",
        PPO,
        "raptb.app.training.rl.ppo:PPOAlgorithm",
        section="rl",
        replay=False,
        presets={**ON_POLICY, "rl": {"temperature": PPO_TEMPERATURE}},
    ),
    # GRPO with DAPO's clip-higher and dynamic sampling (core.rl.dapo)
    Loss(
        "dapo",
        DAPO,
        GRPO_ALGORITHM,
        section="rl",
        replay=False,
        presets={**ON_POLICY, "rl": {"epsilon_high": DAPO_EPSILON_HIGH, "filter_groups": True}},
    ),
    # GRPO's algorithm and loss with other advantages (core.rl.passk, .ucpo, .g2rpo, .ips_grpo)
    Loss("passk", PassK, GRPO_ALGORITHM, section="rl", replay=False, presets=ON_POLICY),
    Loss("ucpo", UCPO, GRPO_ALGORITHM, section="rl", replay=False, presets=ON_POLICY),
    Loss("g2rpo", G2RPO, GRPO_ALGORITHM, section="rl", replay=False, presets=ON_POLICY),
    Loss("ips_grpo", IPSGRPO, GRPO_ALGORITHM, section="rl", replay=False, presets=ON_POLICY),
    # the authors' schedule, one pass of four mini-batch updates per rollout; the centred reward
    # divided by the group's std, so that the task reward's scale (lambda S) drops out as it
    # does for the authors' 0/1 reward (core.rl.rover)
    Loss(
        "rover",
        ROVER,
        "raptb.app.training.rl.rover:ROVERAlgorithm",
        section="rl",
        replay=False,
        presets={
            **ON_POLICY,
            "rl": {"num_ppo_epochs": 1, "num_mini_batches": 4, "norm_adv_by_std_in_grpo": True},
        },
    ),
    # trajectory balance on length-normalised log-probs with a learned logZ (core.rl.flowrl)
    Loss(
        "flowrl",
        FlowRL,
        "raptb.app.training.rl.flowrl:FlowRLAlgorithm",
        section="rl",
        replay=False,
        presets=ON_POLICY,
    ),
)


def _register_objective(point: EntryPoint, cls: Any) -> None:
    check_class(point, cls, Objective, "raptb.Objective")
    if point.name in {loss.name for loss in _RL_BASELINES}:
        raise ValueError(f"{point.name!r} is an RL loss's name")
    register_objective(cls)


def load_objective_plugins() -> None:
    """Register the objectives of the ``raptb.objectives`` entry points (once per process)."""
    load_group_once(OBJECTIVE_GROUP, _register_objective)


def _load() -> None:
    """Enter the GFlowNet objectives (built-in, then the ``raptb.objectives`` plug-ins') not yet
    entered, the RL baselines, then the ``raptb.losses`` entry points (read once per process)."""
    load_objective_plugins()
    for name, cls in OBJECTIVES.items():
        if name not in LOSSES:  # inside the load hook, a lookup does not load again
            LOSSES.register(Loss(name, cls, GFLOWNET_ALGORITHM))
    for loss in _RL_BASELINES:
        LOSSES.register(loss)
    load_group_once(LOSS_GROUP, _register_plugin_loss)


def _register_plugin_loss(point: EntryPoint, loss: Any) -> None:
    check_named(point, loss, Loss, "Loss")
    LOSSES.register(loss)


LOSSES: Registry[Loss] = Registry("loss", lambda loss: loss.name, load=_load)


def loss_entry(name: str) -> Loss:
    """The entry of ``name``; a one-line ValueError lists the valid losses otherwise."""
    return LOSSES.lookup(name)


def loss_names() -> tuple[str, ...]:
    """Every valid ``loss``: the GFlowNet objectives (built-in, then the plug-ins' of the
    ``raptb.objectives`` entry points), the RL baselines, then the ``raptb.losses`` plug-ins."""
    return LOSSES.names()
