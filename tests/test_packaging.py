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
    assert found - listed == set(), "packages missing from pyproject.toml"
    assert listed - found == set(), "listed packages with no folder"
