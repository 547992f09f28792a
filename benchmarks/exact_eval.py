"""Time the exact evaluation of the embedded model over Expr24's 75,445 solutions.

Usage (from the repository root):

    python benchmarks/exact_eval.py [--repeats 3] [--threads 1] [--baseline]

Builds the default Expr24 policy on the embedded tiny model (as ``raptb eval --exact`` does for a
run of it), computes the exact log-probability of every solution ``--repeats`` times and prints
the trie/grammar, model and total seconds of each (and the median). ``--baseline`` also times the
plain alternative for the model part: one teacher-forced row per solution (prompt + text, the
rescoring forward of ``HFPolicy.score``) in batches of 4096 rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from raptb.adapters.lm.exact import exact_log_probs
from raptb.adapters.tasks.expr24.task import Expr24Task, enumerate_solutions
from raptb.app.task_and_policy import build_policy

BASELINE_ROWS = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--baseline", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = Expr24Task()
    policy = build_policy("tiny", task, seed=0)
    solutions = enumerate_solutions()
    totals = []
    for repeat in range(args.repeats):
        result = exact_log_probs(
            policy, task.prompt, solutions, min_length=task.min_length, max_length=task.max_length
        )
        t = result.timings
        totals.append(t.total_s)
        acc = float(np.exp(np.logaddexp.reduce(result.log_prob)))
        print(
            f"run {repeat + 1}: trie+grammar {t.trie_s:.2f} s, model {t.model_s:.2f} s, "
            f"total {t.total_s:.2f} s (pi(Y*) = {acc:.6g}, {len(solutions):,} solutions)"
        )
    print(f"median total: {statistics.median(totals):.2f} s")
    if args.baseline:
        print(f"baseline model part: {baseline_seconds(policy, task, solutions):.2f} s")


@torch.no_grad()
def baseline_seconds(policy, task: Expr24Task, solutions: list[str]) -> float:
    """Seconds of one teacher-forced forward row per solution (the model part only)."""
    sub = {text: policy.legal_ids[j] for j, text in enumerate(policy.texts)}
    tic = time.perf_counter()
    for start in range(0, len(solutions), BASELINE_ROWS):
        chunk = solutions[start : start + BASELINE_ROWS]
        tokens = torch.full((len(chunk), task.max_length), policy.stop_id, dtype=torch.long)
        for row, text in enumerate(chunk):
            tokens[row, : len(text)] = torch.tensor([sub[c] for c in text])
        policy.score(task.prompt, tokens, torch.tensor([len(t) for t in chunk]))
    return time.perf_counter() - tic


if __name__ == "__main__":
    main()
