"""Data files shipped inside the package, each task's in its folder
(``adapters/tasks/<task>/files``, provenance and licence in its README.md and LICENSE).

They are read through :mod:`importlib.resources`, which works for an editable checkout and an
installed wheel alike; ``setup.py`` ships every such folder as package data.
"""

from __future__ import annotations

from importlib import resources


def shipped_text(task: str, *parts: str) -> str:
    """The UTF-8 text of ``adapters/tasks/<task>/files/<parts...>`` (e.g.
    ``shipped_text("amp", "amp.ebnf")``).

    Raises:
        FileNotFoundError: naming the file when the installation lacks it.
    """
    resource = resources.files(f"raptb.adapters.tasks.{task}").joinpath("files", *parts)
    try:
        return resource.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shipped data file tasks/{task}/files/{'/'.join(parts)} is missing from the raptb "
            "installation"
        ) from None
