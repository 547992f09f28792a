"""Import rules of docs/layout.md: core/ never imports a framework or an outer layer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_CORE = {
    "trl",
    "raptb.integrations",
    "torch",
    "transformers",
    "peft",
    "rdkit",
    "xgrammar",
    "typer",
    "pydantic",
    "rich",
    "matplotlib",
    "raptb.adapters",
    "raptb.app",
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def violations(folder: str, forbidden: set[str]) -> list[str]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for name in imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_core_imports_no_framework_or_outer_layer():
    assert violations("core", FORBIDDEN_IN_CORE) == []


def test_adapters_never_import_app():
    assert violations("adapters", {"raptb.app", "raptb.integrations", "trl"}) == []


def test_app_never_imports_an_integration():
    # integrations are edges beside app (docs/layout.md); app stays free of their extras
    assert violations("app", {"raptb.integrations"}) == []


def test_integrations_import_core_and_adapters_never_app():
    assert violations("raptb/integrations", {"raptb.app"}) == []


def test_the_rule_checker_catches_a_violation(tmp_path):
    (tmp_path / "bad.py").write_text("import torch.nn\nfrom raptb.app import cli\n")
    assert imported_modules(tmp_path / "bad.py") == {"torch.nn", "raptb.app"}


def test_importing_core_loads_no_framework():
    # every module of core/ and its sub-packages, as a dotted name under raptb.core
    modules = [
        ".".join(p.relative_to(ROOT / "core").with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "core").rglob("*.py")
        if p.name != "__init__.py" or p.parent != ROOT / "core"
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module('raptb.core.' + m)\n"
        "heavy = {'torch', 'transformers', 'rdkit', 'typer', 'xgrammar', 'pydantic', 'peft'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_top_level_package_imports_only_the_standard_library():
    # raptb/__init__.py re-exports lazily; an eager import would pull torch into raptb.core
    assert imported_modules(ROOT / "raptb" / "__init__.py") <= {
        "__future__",
        "importlib",
        "importlib.metadata",
        "pkgutil",
        "typing",
    }
