"""SubM presets the task specs share, as ``[replay]`` options by name (SubM's options schema in
``raptb.core.replay``; ``TaskSpec.subm`` in adapters.tasks.registry).

A spec takes a preset as it is, or overrides the fields where its column differs::

    subm={**EVERY_TERM_SUBM, "similarity": "tanimoto"}      # SMILES

A plug-in task may use them too. The mappings are read-only, so that no spec changes another's.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

JACCARD_CHARACTER_BIGRAMS: Mapping[str, Any] = MappingProxyType(
    {"similarity": "jaccard", "shingle_k": 2, "shingle_on": "text"}
)
"""The paper's string similarity: Jaccard on the character 2-grams of the text."""

EVERY_TERM_SUBM: Mapping[str, Any] = MappingProxyType(
    {"subm_weights": (1.0, 1.0, 1.0, 1.0), "gating_ratio": 0.0, "length_bin_size": 1}
)
"""The paper's SMILES column without its similarity: reward, validity, diversity and length
terms all weighted 1, no validity gating, length bins of one token."""

STRING_SUBM: Mapping[str, Any] = MappingProxyType({**EVERY_TERM_SUBM, **JACCARD_CHARACTER_BIGRAMS})
"""Every term on with the string similarity: any task whose items are plain strings (AMP, a
custom reward)."""
