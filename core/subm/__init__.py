"""SubM, the paper's submodular replay selection: ``select`` (the API, ``subm_select``),
``kernels`` (its Numba greedy loops), ``fixed_point`` (the quantised similarity they work on),
``similarity`` (the kernels of the facility-location term), ``similarity_cache`` (a replay
store's incremental similarity matrix). The buffer that uses it is ``core.replay.subm``.

``subm_select`` and the names below stay importable from ``raptb.core.subm``, their module before
SubM had its folder.
"""

from raptb.core.subm.select import (
    DIVERSITY,
    METHODS,
    QuantisedSimilarity,
    power_bin_alpha,
    subm_select,
    subm_value,
    validity_pool,
)

__all__ = [
    "DIVERSITY",
    "METHODS",
    "QuantisedSimilarity",
    "power_bin_alpha",
    "subm_select",
    "subm_value",
    "validity_pool",
]
