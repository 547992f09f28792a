"""Every name a benchmark script imports from raptb exists.

The scripts under benchmarks/ import the package lazily, inside the functions that measure, so a
module moved or renamed in the package breaks them only when someone next runs them (a move of
app/training/ once left step_speed.py importing a module that no longer existed). This reads
each script's imports without running it and resolves them against the installed package."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").rglob("*.py"))


def raptb_imports(source: str) -> list[tuple[str, str | None]]:
    """(module, name) of each ``from raptb... import name`` and (module, None) of each
    ``import raptb...`` in ``source``, wherever it stands (functions included)."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "raptb":
                found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "raptb"]
    return found


def _names_missing(error: ModuleNotFoundError, module: str) -> bool:
    """Whether ``error`` says ``module`` itself (or a package above it) is missing, rather than
    a library it imports (an optional extra, say TRL for raptb.integrations.trl)."""
    return error.name is not None and (module == error.name or module.startswith(f"{error.name}."))


def resolves(module: str, name: str | None) -> bool:
    """Whether ``from module import name`` (or ``import module``) would find what it names."""
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as error:
        return not _names_missing(error, module)
    except ImportError:
        return True  # the module exists but refuses without an optional extra
    if name is None or name == "*" or hasattr(imported, name):
        return True
    submodule = f"{module}.{name}"
    try:
        importlib.import_module(submodule)
    except ModuleNotFoundError as error:
        return not _names_missing(error, submodule)
    except ImportError:
        return True
    return True


def test_scripts_are_found() -> None:
    assert len(SCRIPTS) > 10
    assert any(raptb_imports(path.read_text()) for path in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_benchmark_imports_resolve(path: Path) -> None:
    missing = [
        f"{module}:{name}"
        for module, name in raptb_imports(path.read_text())
        if not resolves(module, name)
    ]
    assert not missing, f"{path.name} imports what the package lacks: {missing}"


def test_a_moved_module_is_caught() -> None:
    source = "def f():\n    from raptb.app.training.algorithms import gflownet\n"
    assert raptb_imports(source) == [("raptb.app.training.algorithms", "gflownet")]
    assert not resolves("raptb.app.training.algorithms", "gflownet")
    assert not resolves("raptb.app.training.gflownet", "no_such_name")
    assert resolves("raptb.app.training.gflownet", "algorithm")


def test_a_missing_library_is_not_a_missing_module() -> None:
    def error(name: str) -> ModuleNotFoundError:
        return ModuleNotFoundError(f"No module named '{name}'", name=name)

    assert _names_missing(error("raptb.app.training.algorithms"), "raptb.app.training.algorithms")
    assert _names_missing(error("raptb.app.nowhere"), "raptb.app.nowhere.deeper")
    assert not _names_missing(error("trl"), "raptb.integrations.trl")
    assert not _names_missing(error("raptb.app.train"), "raptb.app.training")
