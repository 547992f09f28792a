"""Import a callable named ``module:function`` (a user's reward, an AMP oracle).

The module is looked up as uvicorn and gunicorn look up ``module:app``: the current directory
first, then PYTHONPATH and the installed packages, so ``--reward vowels:score`` finds
``vowels.py`` beside the command. Processes started from this one (the reward workers, which
receive this ``sys.path``; a study's children, which run in the study's directory) find it too.

:data:`CallablePath` is the config field type: a path is imported when the configuration is
validated, so a typo is a one-line configuration error in every command, before any work starts.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator


def _import_module(name: str) -> object:
    """Module ``name``, the current directory searched first (ValueError when it fails)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
        importlib.invalidate_caches()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
            raise ValueError(
                f"cannot import module {name!r}: no {exc.name!r} in the current directory "
                f"({here}) nor on PYTHONPATH"
            ) from None
        raise ValueError(f"cannot import module {name!r}: {exc}") from None
    except Exception as exc:  # the user's module failed while importing: one line naming it
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ValueError(f"cannot import module {name!r}: {detail}") from None


def resolve_dotted(path: str) -> Callable[..., Any]:
    """The callable at ``path`` (``package.module:attr.attr``).

    Raises:
        ValueError: the path is malformed, its module cannot be imported, or it names
            nothing callable; the message says which.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'module:function', got {path!r}")
    target = _import_module(module_name)
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"module {module_name!r} has no {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{path!r} is not callable")
    return target


def load_dotted(path: str, field: str) -> Callable[..., Any]:
    """:func:`resolve_dotted`, its ValueError starting with the config ``field`` it came from."""
    try:
        return resolve_dotted(path)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


def _importable(path: str) -> str:
    resolve_dotted(path)
    return path


CallablePath = Annotated[str, AfterValidator(_importable)]
"""A config field holding ``module:function``, checked to import when validated."""
