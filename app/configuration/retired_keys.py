"""Configuration keys raptb no longer reads (``RETIRED``): a run's own config.toml that records
one still loads, the key dropped (what it chose is what runs now), while a config file or a flag
that sets one is a one-line error saying what to do.
"""

from __future__ import annotations

from typing import Any

RETIRED = {
    ("optim", "compiled_rollout"): "the embedded model's rollout on the CPU is always the "
    'compiled one now (sampling.decode = "compiled")',
}
"""(section, key) -> why it went."""


def without_retired(data: dict[str, Any], *, recorded: bool) -> dict[str, Any]:
    """``data`` without the retired keys where ``recorded`` (a run's own config.toml); else
    ValueError naming the first one set, why it went and what to do."""
    for (section, key), why in RETIRED.items():
        values = data.get(section)
        if not isinstance(values, dict) or key not in values:
            continue
        if not recorded:
            raise ValueError(f"{section}.{key} was removed: {why}; delete it from the config")
        data = {**data, section: {k: v for k, v in values.items() if k != key}}
    return data
