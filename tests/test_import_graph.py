"""The package's module import graph has no cycle (docs/layout.md: each concept in a module
named for it, dependencies pointing one way).

Every import counts, wherever it is: module level, inside a function, under ``if
TYPE_CHECKING:``. An ``import raptb.a.b`` or ``from raptb.a import b`` is an edge to the deepest
module of the package it names; the facade ``raptb/__init__.py`` is left out (it re-exports
the public names and imports everything by design). Cycles are found by the standard library's
``graphlib`` (a topological order exists iff there is none).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "raptb.core": ROOT / "core",
    "raptb.adapters": ROOT / "adapters",
    "raptb.app": ROOT / "app",
    "raptb.integrations": ROOT / "raptb" / "integrations",
}


def package_modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Dotted name -> file of every module of ``packages`` (``__init__`` as the package)."""
    modules = {}
    for package, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def _deepest(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (itself excluded)."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        anchor = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*parent, *([base] if base else [])])
                targets += [f"{base}.{alias.name}" for alias in node.names]
        graph[module] = {t for t in map(lambda n: _deepest(n, modules), targets) if t} - {module}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules, the first repeated at the end), or None."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_the_package_has_no_import_cycle():
    modules = package_modules(PACKAGES)
    assert len(modules) > 100  # the walk found the package
    graph = import_graph(modules)
    assert "raptb.app.training.train_state" in graph["raptb.app.training.train"]  # edges are read
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])


@pytest.mark.parametrize("guard", ["", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    "])
def test_a_cycle_is_found_also_under_type_checking_and_relative(tmp_path, guard):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(f"{guard}from .. import a\n")
    graph = import_graph(package_modules({"pkg": pkg}))
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    found = cycle(graph)
    assert found is not None and set(found) == {"pkg.a", "pkg.sub.b"}
    (pkg / "sub" / "b.py").write_text("import json\n")
    assert cycle(import_graph(package_modules({"pkg": pkg}))) is None
