"""app/'s folders as floors (docs/layout.md, "app/'s floors"), held as tests/test_layering.py
holds the layers: a part of app/ (a folder, or a module at app/'s root) imports only parts of a
lower floor.

- 0 the bottom, importing nothing of app: ``configuration`` and ``parent_death.py``;
- 1 what the use cases share: ``run_dir``, ``distribution``, ``reward`` (the per-prefix reward of
  training and evaluation) and ``task_and_policy.py`` (the run's task and policy);
- 2 the use cases: ``training``, ``evaluation``, ``study``;
- 3 the command line: ``cli.py``, ``entry.py``, ``errors.py``, one part.

Parts of one floor are independent: neither imports the other (an import between two of them
would be a floor inside a floor, not written down). Every import counts, wherever it stands
(module level, inside a function, under ``if TYPE_CHECKING:``), as tests/test_import_graph.py
reads them. A ``"module:Class"`` string is not an import: the loss registry (configuration) names
the built-in training algorithms as a plug-in's entry point names its own, and training imports
them.
"""

from __future__ import annotations

from tests.test_import_graph import PACKAGES, import_graph, package_modules

APP = "raptb.app"
FLOORS: dict[str, int] = {
    "configuration": 0,
    "parent_death": 0,
    "run_dir": 1,
    "distribution": 1,
    "reward": 1,
    "task_and_policy": 1,
    "training": 2,
    "evaluation": 2,
    "study": 2,
    "cli": 3,
}
CLI_MODULES = {"cli", "entry", "errors"}
"""The modules at app/'s root that make up the command line, one part (``cli``)."""


def part(module: str) -> str | None:
    """The part of app/ that ``module`` (a dotted name) belongs to; None outside app/ and for the
    package ``raptb.app`` itself."""
    if not module.startswith(APP + "."):
        return None
    name = module.split(".")[2]
    return "cli" if name in CLI_MODULES else name


def floor_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` (module -> modules it imports) from a part of app/ to a part of
    the same or a higher floor, one line each."""
    bad = []
    for module, targets in sorted(graph.items()):
        source = part(module)
        if source is None:
            continue
        for target in sorted(targets):
            dest = part(target)
            if dest is None or dest == source:
                continue
            if FLOORS[dest] >= FLOORS[source]:
                where = "a higher floor" if FLOORS[dest] > FLOORS[source] else "the same floor"
                bad.append(
                    f"{module} ({source}, floor {FLOORS[source]}) imports {target} "
                    f"({dest}, floor {FLOORS[dest]}): {where}"
                )
    return bad


def app_graph() -> dict[str, set[str]]:
    return import_graph(package_modules(PACKAGES))


def test_every_part_of_app_has_a_floor():
    parts = {part(m) for m in package_modules(PACKAGES)} - {None}
    assert parts == set(FLOORS), "give a new folder or module of app/ its floor here and in docs"


def test_app_imports_only_lower_floors():
    graph = app_graph()
    assert "raptb.app.reward.prefix" in graph["raptb.app.evaluation.evaluate"]  # edges are read
    bad = floor_violations(graph)
    assert bad == [], "\n".join(bad)


def test_the_app_package_imports_nothing_of_app():
    # importing any part runs raptb/app/__init__.py first: an import there would sit below floor 0
    assert {t for t in app_graph()[APP] if part(t)} == set()


def test_the_floor_checker_lists_upward_and_sideways_imports():
    graph = {
        "raptb.app.configuration.config": {
            "raptb.app.training.train",  # up two floors
            "raptb.app.configuration.sections",  # within its part
            "raptb.core.registry",  # outside app
        },
        "raptb.app.reward.prefix": {"raptb.app.run_dir.durable"},  # sideways on floor 1
        "raptb.app.training.train": {"raptb.app.reward.prefix", "raptb.app.parent_death"},
        "raptb.app.entry": {"raptb.app.errors", "raptb.app.cli", "raptb.app.study.run"},
    }
    assert floor_violations(graph) == [
        "raptb.app.configuration.config (configuration, floor 0) imports raptb.app.training.train"
        " (training, floor 2): a higher floor",
        "raptb.app.reward.prefix (reward, floor 1) imports raptb.app.run_dir.durable"
        " (run_dir, floor 1): the same floor",
    ]


TRAINING = APP + ".training"
FAMILIES = (TRAINING + ".gflownet", TRAINING + ".rl")


def family_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a module at app/training/'s root (the loop and the shared step layer)
    of a module in one of its families' folders, or from one family of the other, one line
    each."""
    bad = []
    for module, targets in sorted(graph.items()):
        if not module.startswith(TRAINING + ".") or module == TRAINING:
            continue
        mine = next((f for f in FAMILIES if module.startswith(f + ".") or module == f), None)
        for target in sorted(targets):
            theirs = next((f for f in FAMILIES if target.startswith(f + ".") or target == f), None)
            if theirs is not None and theirs != mine:
                bad.append(f"{module} imports {target}")
    return bad


def test_the_shared_training_layer_imports_no_family_and_stays_small():
    graph = app_graph()
    assert "raptb.app.training.gflownet.mix_schedule" in graph[TRAINING + ".gflownet.row_plan"]
    bad = family_imports(graph)
    assert bad == [], "\n".join(bad)
    root = [m for m in graph if m.rpartition(".")[0] == TRAINING and m not in FAMILIES]
    assert len(root) <= 10, sorted(root)


def test_the_family_checker_lists_a_shared_module_reaching_into_a_family():
    graph = {
        TRAINING + ".step_batch": {TRAINING + ".gflownet.mix_schedule", TRAINING + ".step"},
        TRAINING + ".rl.grpo": {TRAINING + ".step", TRAINING + ".gflownet.replay_items"},
        TRAINING + ".gflownet.algorithm": {TRAINING + ".gflownet.row_plan"},
    }
    assert family_imports(graph) == [
        f"{TRAINING}.rl.grpo imports {TRAINING}.gflownet.replay_items",
        f"{TRAINING}.step_batch imports {TRAINING}.gflownet.mix_schedule",
    ]
