"""Did-you-mean for a mistyped name: the valid name closest to it, when one is close.

"Close" is difflib's: a ``SequenceMatcher`` ratio of at least 0.6 (its default cutoff), so
``grop`` suggests ``grpo`` and ``expr42`` suggests ``expr24``, while a name like nothing valid
suggests nothing. Every one-line error that names the valid choices (registries, config keys)
takes its suggestion from here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_match(name: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``name``, or None when none is close."""
    matches = difflib.get_close_matches(name, list(choices), n=1)
    return matches[0] if matches else None


def unknown_choice(kind: str, name: object, choices: Iterable[str]) -> str:
    """The line for ``name``, not among ``choices`` (a ``kind`` such as "loss"):
    ``unknown loss 'grop'; did you mean 'grpo'? valid choices: tb, ...``."""
    choices = list(choices)
    match = close_match(name, choices) if isinstance(name, str) else None
    hint = f"; did you mean {match!r}?" if match is not None else ";"
    return f"unknown {kind} {name!r}{hint} valid choices: {', '.join(choices)}"
