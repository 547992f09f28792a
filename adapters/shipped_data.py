"""Data files shipped inside the package (``adapters/data``, provenance in its README.md).

They are read through :mod:`importlib.resources`, which works for an editable checkout and an
installed wheel alike; ``pyproject.toml`` lists them as package data.
"""

from __future__ import annotations

from importlib import resources


def shipped_text(*parts: str) -> str:
    """The UTF-8 text of ``adapters/data/<parts...>`` (e.g. ``shipped_text("amp", "amp.ebnf")``).

    Raises:
        FileNotFoundError: naming the file when the installation lacks it.
    """
    resource = resources.files("raptb.adapters").joinpath("data", *parts)
    try:
        return resource.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shipped data file data/{'/'.join(parts)} is missing from the raptb installation"
        ) from None
