"""The ``report_to`` field: the experiment trackers a run may name (TRL's name and values), and
its check. A tracker's package is an optional extra, checked when the configuration is validated,
so a missing one is a one-line error naming the extra; the trackers themselves (what they write
where) are app.run_dir.trackers'.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

TRACKERS = ("tensorboard", "wandb")
"""The ``report_to`` names; each is also the name of its pip extra and of its package."""
NO_TRACKER = "none"


def check_report_to(value: str | Sequence[str]) -> tuple[str, ...]:
    """The trackers ``value`` names (``"none"``, one name, or a list of names), in order.

    Raises:
        ValueError: an unknown name, or a tracker whose package is not installed; the message
            names the extra to install.
    """
    names = [value] if isinstance(value, str) else list(value)
    if names == [NO_TRACKER]:
        return ()
    for name in names:
        if name not in TRACKERS:
            raise ValueError(
                f"unknown tracker {name!r}; use {NO_TRACKER!r}, "
                f"{', '.join(repr(t) for t in TRACKERS)}, or a list of them"
            )
        if importlib.util.find_spec(name) is None:
            raise ValueError(f"{name!r} needs the {name} package: pip install 'raptb[{name}]'")
    return tuple(dict.fromkeys(names))
