"""Plug-ins from installed packages: one loader for every entry-point group of raptb.

A package adds a task, a loss or a replay buffer to ``raptb train``, ``raptb eval`` and ``raptb
study`` (whose runs are child processes: each reads the entry points again) by declaring, in its
``pyproject.toml``::

    [project.entry-points."raptb.tasks"]
    vowels = "mypkg.vowels:SPEC"          # a raptb.TaskSpec (adapters.tasks.registry)

    [project.entry-points."raptb.objectives"]
    scaled_tb = "mypkg.losses:ScaledTB"   # a raptb.Objective subclass (a GFlowNet objective)

    [project.entry-points."raptb.losses"]
    my_rl = "mypkg.loss:LOSS"             # a raptb.Loss (an RL loss with its algorithm)

    [project.entry-points."raptb.buffers"]
    newest = "mypkg.replay:Newest"        # a raptb.ReplayBuffer subclass (its ``kind``)

The entry point's name must equal the name of what it loads, so that a run's configuration names
what was loaded. Each group is read once per process, on the first lookup of its registry (the
tasks' in adapters.tasks.registry, the objectives' and losses' in app.configuration.losses, the
buffers' in core.replay.factory). raptb declares its own built-in tasks the same way (its
``setup.py`` names each task folder's ``spec:SPEC``); its entry points are read first, by name.
One that cannot be imported, is of the wrong type, or clashes with a name already registered
raises :class:`PluginError`, a one-line message naming the entry point (``raptb`` exits with 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

OWN_DISTRIBUTION = "raptb"
"""The distribution whose entry points are the built-in ones (loaded before any plug-in's)."""


class PluginError(ValueError):
    """An entry point of a raptb group cannot be used; the message is one line naming it."""


def _describe(group: str, point: EntryPoint) -> str:
    return f"plug-in {point.name!r} of {group} ({point.value})"


_loaded_groups: dict[str, PluginError | None] = {}
"""The groups read in this process, each with the error its reading raised (None: it loaded)."""


def load_group_once(
    group: str, check: Callable[[EntryPoint, Any], None], *, builtin: bool = False
) -> None:
    """:func:`load_group` on the first call for ``group``; later calls do nothing, or raise the
    first call's :class:`PluginError` again, so a broken plug-in fails every lookup, not only the
    first (which may come from ``--help`` text built while the command line is imported)."""
    if group not in _loaded_groups:
        _loaded_groups[group] = None
        try:
            load_group(group, check, builtin=builtin)
        except PluginError as exc:
            _loaded_groups[group] = exc
    error = _loaded_groups[group]
    if error is not None:
        raise PluginError(str(error))


def is_builtin(point: EntryPoint) -> bool:
    """Whether raptb itself declares ``point`` (its ``setup.py``: the built-in tasks)."""
    dist = getattr(point, "dist", None)
    return dist is not None and dist.name == OWN_DISTRIBUTION


def _ordered(points: Iterable[EntryPoint]) -> list[EntryPoint]:
    """raptb's own entry points by name (installers write them in any order; setuptools sorts
    them), then the plug-ins' in the order they are found."""
    own = sorted((p for p in points if is_builtin(p)), key=lambda point: point.name)
    return own + [p for p in points if not is_builtin(p)]


def load_group(
    group: str, check: Callable[[EntryPoint, Any], None], *, builtin: bool = False
) -> None:
    """Load every entry point of ``group`` and hand it to ``check`` (which registers it or raises
    ValueError); any failure is a one-line :class:`PluginError` naming the entry point.

    raptb's own entry points come first, by name (a plug-in's that reuses a built-in name is
    then the one refused). ``builtin``: raptb itself declares entry points in ``group``, so their
    absence means an installation older than them (an editable install keeps the entry points of
    the day it was made): PluginError saying so.
    """
    points = _ordered(list(entry_points(group=group)))
    if builtin and not any(map(is_builtin, points)):
        raise PluginError(
            f"the installed raptb declares none of its {group} entry points (an editable install "
            "made before they existed keeps the old list): reinstall it, pip install -e ."
        )
    for point in points:
        try:
            loaded = point.load()
        except Exception as exc:  # a plug-in's import may fail in any way
            raise PluginError(
                f"{_describe(group, point)} cannot be loaded: {type(exc).__name__}: {exc}"
            ) from None
        try:
            check(point, loaded)
        except ValueError as exc:
            raise PluginError(f"{_describe(group, point)}: {exc}") from None


def check_named(point: EntryPoint, loaded: Any, expected: type, label: str) -> None:
    """ValueError unless ``loaded`` is an instance of ``expected`` (a ``label``, e.g. "TaskSpec")
    whose ``name`` is the entry point's."""
    if not isinstance(loaded, expected):
        raise ValueError(f"must name a {label}, found {type(loaded).__name__}")
    if loaded.name != point.name:
        raise ValueError(f"the {label}'s name {loaded.name!r} differs from the entry point's")


def check_class(point: EntryPoint, loaded: Any, base: type, label: str, key: str = "name") -> None:
    """ValueError unless ``loaded`` is a subclass of ``base`` (a ``label``, e.g.
    "raptb.ReplayBuffer") whose ``key`` attribute is the entry point's name."""
    if not (isinstance(loaded, type) and issubclass(loaded, base)):
        raise ValueError(f"must name a subclass of {label}")
    if getattr(loaded, key, None) != point.name:
        raise ValueError(
            f"the class's {key} {getattr(loaded, key, None)!r} differs from the entry point's"
        )
