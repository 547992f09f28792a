"""Configuration keys that switched a fast path off for comparison, and are gone.

One implementation of a thing per model and device (docs/layout.md, "Which path runs when"): a
key that chose between two paths computing the same function left with the slower path, and the
path it chose always runs (the measurements that settled it stay in benchmarks/step_speed.md
with their commits). A run's own config.toml written before records them: read back as a record
(``dropped``) they are left out, so ``raptb eval`` and ``--resume`` still work; in a file a user
passes (``refuse``) they are a one-line error that says what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REMOVED: dict[tuple[str, str], str] = {
    ("optim", "merge_copies"): "each distinct row is scored once where the forward is not random "
    "(adapters/lm/distinct_rows.py)",
    ("optim", "fused_update"): "on a CPU AdamW's fused update, unless the model is sharded",
    ("optim", "tanh_gelu"): "on a CPU the rescoring's GELU keeps its slope "
    "(adapters/lm/embedded/tanh_gelu.py)",
    ("optim", "prompt_attention"): "on a CPU the rescoring's attention over a shared prompt runs "
    "as loops over the tokens (adapters/lm/embedded/prompt_attention.py)",
    ("optim", "compiled_rescoring"): "on a CPU the embedded model's rescoring is compiled "
    "(adapters/lm/embedded/compiled_rescoring.py)",
    ("optim", "compiled_rollout"): "on a CPU the embedded model's rollout is compiled "
    '(adapters/lm/embedded/compiled_rollout.py, sampling.decode = "compiled")',
}
"""(section, key) -> the path that now always runs."""


def _found(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [
        (section, key)
        for section, key in REMOVED
        if isinstance(data.get(section), Mapping) and key in data[section]
    ]


def dropped(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a run's recorded configuration) without the removed keys."""
    found = _found(data)
    if not found:
        return data
    data = {
        name: dict(value) if isinstance(value, Mapping) else value for name, value in data.items()
    }
    for section, key in found:
        del data[section][key]
    return data


def refuse(data: Mapping[str, Any]) -> None:
    """ValueError in one line naming every removed key ``data`` sets (one key: the path that now
    always runs; several: docs/configuration.md lists each one's)."""
    found = _found(data)
    if len(found) == 1:
        ((section, key),) = found
        raise ValueError(
            f"{section}.{key}: removed; the path it chose always runs ({REMOVED[section, key]}); "
            "delete it from the file"
        )
    if found:
        names = ", ".join(f"{section}.{key}" for section, key in found)
        raise ValueError(
            f"{names}: removed; the paths they chose always run (docs/configuration.md, "
            '"Removed keys"); delete them from the file'
        )
