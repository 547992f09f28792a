"""What pyproject.toml cannot say statically, found from the source folders at build time:

- the packages: every folder under the four roots that ``[tool.setuptools] package-dir`` maps
  (``raptb``, ``core``, ``adapters``, ``app``), data-only folders (no ``__init__.py``, such as a
  task's ``files/``) included with all their files;
- the built-in tasks: each folder ``adapters/tasks/NAME/`` with a ``spec.py`` is the entry point
  ``NAME = raptb.adapters.tasks.NAME.spec:SPEC`` of the ``raptb.tasks`` group, declared as a
  plug-in package declares its tasks.

So a new built-in task is its own folder (and its line in the docs' table); an editable install
sees it after ``pip install -e .`` again, which writes the entry points anew.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent
TASKS = Path("adapters") / "tasks"


def package_dir() -> dict[str, str]:
    """``[tool.setuptools] package-dir`` of pyproject.toml: package prefix -> source folder."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-dir"]


def packages() -> list[str]:
    """Every package under the mapped folders (namespace folders, i.e. data folders, too)."""
    found = []
    for name, folder in package_dir().items():
        found.append(name)
        subs = find_namespace_packages(ROOT / folder, exclude=["*__pycache__*", ".*", "*..*"])
        found += [f"{name}.{sub}" for sub in subs]
    return sorted(found)


def data_packages() -> dict[str, list[str]]:
    """The data-only packages (folders without ``__init__.py``), each with all its files."""
    roots = package_dir()
    data = {}
    for package in packages():
        prefix = max((p for p in roots if package == p or package.startswith(f"{p}.")), key=len)
        folder = ROOT / roots[prefix] / Path(*package[len(prefix) + 1 :].split("."))
        if package != prefix and not (folder / "__init__.py").exists():
            data[package] = ["*"]
    return data


def builtin_tasks() -> list[str]:
    """The ``raptb.tasks`` entry points of the task folders that have a ``spec.py``, by name."""
    names = sorted(path.parent.name for path in (ROOT / TASKS).glob("*/spec.py"))
    return [f"{name} = raptb.adapters.tasks.{name}.spec:SPEC" for name in names]


if __name__ == "__main__":
    setup(
        packages=packages(),
        package_data=data_packages(),
        entry_points={
            "console_scripts": ["raptb = raptb.app.entry:main"],
            "raptb.tasks": builtin_tasks(),
        },
    )
