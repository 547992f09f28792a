"""Time the compiled rollout (``decode = "compiled"``, adapters/lm/embedded/compiled_rollout.py)
against the rollout it replaced, the ONNX Runtime path of an earlier commit, in one process.

Usage (from the repository root):

    OMP_NUM_THREADS=1 python benchmarks/compiled_rollout.py --task smiles --rows 32,128 \
        --old onnx-columns [--against b9cd778] [--repeats 20] [--threads 1]
    OMP_NUM_THREADS=1 python benchmarks/compiled_rollout.py --task expr24 --old compiled-loop

``--against COMMIT`` (default b9cd778, the last with the ONNX path) is read with ``git show``: its
adapters/lm/embedded/ modules that this tree changed or removed (``OLD_MODULES``) are written to a
temporary package, their imports of each other pointed there, and imported beside the current
ones. ``--old`` picks that commit's engine: ``onnx-columns`` its ONNX Runtime call per column
(``decode = "onnx"`` with xgrammar's matchers, the default for SMILES), ``compiled-loop`` its
whole-rollout Numba loop over the ONNX graph's feeds (``decode = "onnx"`` without a grammar or
with an automaton, the default for Expr24), ``onnx-graph`` its ONNX Runtime ``rollout`` graph.

The policy is the one ``raptb train`` builds for ``--task`` with the embedded model
(``rollout.build``). For each number of rows the two sides alternate (the first of the two
swapping each repeat), one rollout each per repeat from the same generator seed, each side's
function called as ``sample_rollout`` calls it (under ``torch.no_grad``), so both see the same
machine load; the first ``WARMUP`` repeats (compilation, ONNX Runtime's sessions) are not timed.
Printed: the median ms per rollout of each, the ratio old / new, and whether the two drew the
same rows (the largest log-probability difference).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rollout import build

from raptb.adapters.lm.embedded.compiled_rollout import compiled_rollout
from raptb.adapters.lm.rollout import Rollout

OLD_MODULES = ("onnx_builder", "onnx_graph", "compiled_gpt2", "compiled_rollout", "onnx_rollout")
WARMUP = 2
ENGINES = {
    "onnx-columns": {"one_call": False, "compiled_rollout": False},
    "compiled-loop": {"one_call": True, "compiled_rollout": True},
    "onnx-graph": {"one_call": True, "compiled_rollout": False},
}
"""The old policy's switches (its ``HFPolicy.one_call``, ``compiled_rollout``) per engine."""


def old_rollout(commit: str):
    """The ``onnx_rollout`` function of ``commit``'s adapters/lm/embedded (module docstring)."""
    root = Path(tempfile.mkdtemp()) / "old_embedded"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name in OLD_MODULES:
        path = f"adapters/lm/embedded/{name}.py"
        text = subprocess.run(
            ["git", "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
        ).stdout
        for other in OLD_MODULES:
            text = text.replace(f"raptb.adapters.lm.embedded.{other}", f"old_embedded.{other}")
        text = text.replace(
            "from raptb.adapters.lm.embedded import compiled_rollout, lean_gpt2",
            "from old_embedded import compiled_rollout\n"
            "from raptb.adapters.lm.embedded import lean_gpt2",
        )
        text = text.replace(
            "from raptb.adapters.lm.embedded import compiled_gpt2",
            "from old_embedded import compiled_gpt2",
        )
        (root / f"{name}.py").write_text(text)
    sys.path.insert(0, str(root.parent))
    return importlib.import_module("old_embedded.onnx_rollout").onnx_rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="smiles")
    parser.add_argument("--rows", default="32,128")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--old", choices=sorted(ENGINES), default="onnx-columns")
    parser.add_argument("--against", default="b9cd778")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    old = old_rollout(args.against)
    policy, task = build(argparse.Namespace(task=args.task), "tiny", None)
    policy.decode = "compiled"
    for switch, value in ENGINES[args.old].items():
        setattr(policy, switch, value)
    prompt = task.prompts()[0]
    lengths = (task.min_length, task.max_length)
    sides = {
        "new": lambda n, g: compiled_rollout(policy, prompt, n, *lengths, 1.0, g),
        "old": lambda n, g: old(policy, prompt, n, *lengths, 1.0, g),
    }
    grammar = type(policy.grammar_batch(1)).__name__ if policy.grammar else "none"
    print(
        f"tiny, {args.task} (grammar: {grammar}), lengths {lengths}, {args.repeats} repeats, "
        f"{torch.get_num_threads()} thread(s); new: compiled, old: {args.old} at {args.against}"
    )
    print("| rows | old ms | new ms | old / new | same rows | max log-prob diff |")
    print("|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        seconds: dict[str, list[float]] = {"new": [], "old": []}
        same, worst = 0, 0.0
        for repeat in range(args.repeats + WARMUP):
            last: dict[str, Rollout] = {}
            order = list(sides.items())
            for name, side in order if repeat % 2 else order[::-1]:
                generator = torch.Generator().manual_seed(repeat)
                start = time.perf_counter()
                with torch.no_grad():
                    last[name] = side(rows, generator)
                if repeat >= WARMUP:
                    seconds[name].append(time.perf_counter() - start)
            if repeat >= WARMUP:
                new, was = last["new"], last["old"]
                if torch.equal(new.tokens, was.tokens):
                    same += 1
                    diff = max(
                        float((new.log_pf - was.log_pf).abs().max()),
                        float((new.log_pterm - was.log_pterm).abs().max()),
                    )
                    worst = max(worst, diff)
        old_ms, new_ms = (statistics.median(seconds[s]) * 1e3 for s in ("old", "new"))
        print(
            f"| {rows} | {old_ms:.2f} | {new_ms:.2f} | {old_ms / new_ms:.2f} | "
            f"{same}/{args.repeats} | {worst:.1e} |"
        )


if __name__ == "__main__":
    main()
