"""The GPU plans, ordered by value: what one slot of about 9 minutes of work measures.

A plan is a list of stages; each stage is a function of ``stages_*`` run in its own process
(``stage.py``) under ``limit_s`` seconds at most (less when the driver's deadline leaves less).
``first`` is what the next GPU slot runs; each later plan is the next slot's. This module
imports nothing heavy: the driver reads it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    """The function's name in its module, and the stage's key in the plan's JSON."""
    module: str
    """``stages_speed``, ``stages_train`` or ``stages_scale`` (beside this file)."""
    limit_s: float
    """Most seconds the stage may take on a GPU."""
    min_s: float = 20.0
    """Fewest seconds worth starting it with; with less left, it is skipped (recorded)."""


PLANS: dict[str, tuple[Stage, ...]] = {
    # issue 18's goals first (decode, 135M steps/s), then the headline pair of issue 20
    "first": (
        Stage("environment", "stages_speed", 30, min_s=5),
        Stage("decode_1b", "stages_speed", 150),
        Stage("decode_135m", "stages_speed", 90),
        Stage("expr24_steps_135m", "stages_speed", 60),
        # issue 55: vLLM against raptb's decoders (recorded as skipped where the image lacks vllm)
        Stage("decode_vllm", "stages_speed", 90, min_s=5),
        Stage("headline_pair", "stages_train", 240, min_s=90),
    ),
    "trl_anchor": (
        Stage("environment", "stages_speed", 30, min_s=5),
        Stage("trl_anchor", "stages_speed", 420, min_s=120),
    ),
    "smiles": (
        Stage("environment", "stages_speed", 30, min_s=5),
        Stage("smiles_step", "stages_speed", 240, min_s=60),
        Stage("decode_smiles", "stages_speed", 150),
    ),
    "scales": (
        Stage("environment", "stages_speed", 30, min_s=5),
        Stage("scale_3b", "stages_scale", 150, min_s=60),
        Stage("scale_8b", "stages_scale", 240, min_s=90),
        Stage("scale_32b", "stages_scale", 300, min_s=120),
    ),
    "smollm2_tables": (
        Stage("environment", "stages_speed", 30, min_s=5),
        Stage("next_cells", "stages_train", 480, min_s=120),
    ),
    # issue 41: RapTB + SubM against the field's best RL method of the Expr24 comparison
    "field_pair": (
        Stage("environment", "stages_speed", 30, min_s=5),
        Stage("field_pair", "stages_train", 480, min_s=120),
    ),
}
