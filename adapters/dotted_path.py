"""Import a callable named ``package.module:function`` (a user's reward, an AMP oracle)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def load_dotted(path: str, field: str) -> Callable[..., Any]:
    """The callable at ``path`` (``package.module:attr.attr``; the module must be importable,
    e.g. on PYTHONPATH). A ValueError starting with the config ``field`` it came from says what
    is wrong."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{field}: expected 'module:function', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{field}: cannot import module {module_name!r}: {exc}") from None
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{field}: module {module_name!r} has no {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{field}: {path!r} is not callable")
    return target
