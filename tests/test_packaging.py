"""The wheel's contents and entry points, as setup.py finds them from the source folders: every
package folder of the source tree is a package of the wheel, every data folder ships all its files,
and every task folder with a ``spec.py`` is one of raptb's ``raptb.tasks`` entry points (an
editable install finds an unlisted package anyway, so only an installed wheel would miss one)."""

from __future__ import annotations

import runpy
import tomllib
from importlib.metadata import distribution
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP = runpy.run_path(str(ROOT / "setup.py"), run_name="raptb_setup")  # setup() not called
ROOTS = {"raptb": "raptb", "raptb.core": "core", "raptb.adapters": "adapters", "raptb.app": "app"}


def _folders(folder: Path) -> list[Path]:
    """``folder`` and every folder under it but caches and hidden ones."""
    return [folder] + [
        path
        for path in sorted(folder.rglob("*"))
        if path.is_dir()
        and not any(part == "__pycache__" or part.startswith(".") for part in path.parts)
    ]


def test_every_folder_is_a_package_of_the_wheel() -> None:
    assert SETUP["package_dir"]() == ROOTS
    modules, data = set(), set()
    for name, folder in ROOTS.items():
        for path in _folders(ROOT / folder):
            package = ".".join((name, *path.relative_to(ROOT / folder).parts))
            (modules if (path / "__init__.py").exists() else data).add(package)
    assert data, "the task data folders (files/) are data-only packages"
    assert set(SETUP["packages"]()) == modules | data
    assert SETUP["data_packages"]() == {key: ["*"] for key in sorted(data)}


def test_the_installed_entry_points_are_the_task_folders() -> None:
    """What the installation declares (written by setup.py at install time): the command and one
    raptb.tasks entry point per task folder with a spec. An editable install made before a new
    task folder fails here until ``pip install -e .`` is run again."""
    points = distribution("raptb").entry_points
    folders = sorted(path.parent.name for path in (ROOT / "adapters" / "tasks").glob("*/spec.py"))
    assert {p.name: p.value for p in points if p.group == "raptb.tasks"} == {
        name: f"raptb.adapters.tasks.{name}.spec:SPEC" for name in folders
    }
    assert [p.value for p in points if p.group == "console_scripts"] == ["raptb.app.entry:main"]
    assert SETUP["builtin_tasks"]() == [
        f"{name} = raptb.adapters.tasks.{name}.spec:SPEC" for name in folders
    ]


# the MIT License's text after its copyright line, as SPDX publishes it (license id "MIT")
MIT_TERMS = """Permission is hereby granted, free of charge, to any person obtaining a copy of this
software and associated documentation files (the "Software"), to deal in the Software without
restriction, including without limitation the rights to use, copy, modify, merge, publish,
distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions: The above copyright notice
and this permission notice shall be included in all copies or substantial portions of the
Software. THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE
AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE."""


def test_the_license_file_is_the_mit_license_pyproject_declares() -> None:
    """pyproject's ``license = "MIT"`` and the LICENSE file the wheel ships (setuptools takes
    ``LICEN[CS]E*`` by default) say the same."""
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "MIT"
    title, blank, copyright_line, *terms = (ROOT / "LICENSE").read_text().splitlines()
    assert (title, blank, copyright_line) == (
        "MIT License",
        "",
        "Copyright (c) 2026 the raptb authors",
    )
    assert " ".join(" ".join(terms).split()) == " ".join(MIT_TERMS.split())
