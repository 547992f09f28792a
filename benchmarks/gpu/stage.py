"""One stage of a GPU plan, in its own process (``driver.py`` starts it).

    python benchmarks/gpu/stage.py MODULE NAME --result FILE --work DIR --budget S [--dry-run]

Calls ``NAME(ctx)`` of ``MODULE`` (``stages_speed``, ``stages_train``, ``stages_scale``) and
writes the dict it returns to FILE as JSON. ``ctx`` holds the work folder, the seconds the driver
gave the stage, ``dry_run`` (tiny shapes on the CPU) and the tokenizer folder of the random-weight
shapes (``context.tokenizer_dir``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the stages, and the benchmark scripts they reuse

from context import StageContext  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module")
    parser.add_argument("name")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        import torch

        torch.set_num_threads(1)  # a dry run shares a small CI machine
    stage = getattr(importlib.import_module(args.module), args.name)
    result = stage(StageContext(args.work, args.budget, args.dry_run))
    args.result.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
