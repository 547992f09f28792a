"""The wheel's package list: every package folder of the source tree is listed in pyproject.toml
(an editable install finds an unlisted one anyway, so only an installed wheel would miss it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_in_the_wheel() -> None:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    found = set()
    for name, folder in setup["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    data_only = set(setup["package-data"])  # data folders, declared as packages with their files
    assert found - listed == set(), "packages missing from pyproject.toml"
    assert listed - found == data_only - found, "listed packages with no folder"
    for package in data_only - found:
        assert _folder(setup["package-dir"], package).is_dir(), package


def _folder(package_dir: dict[str, str], package: str) -> Path:
    """The source folder of ``package`` under the longest mapped prefix of ``package_dir``."""
    prefix = max((p for p in package_dir if package.startswith(f"{p}.")), key=len)
    return ROOT / package_dir[prefix] / Path(*package[len(prefix) + 1 :].split("."))
