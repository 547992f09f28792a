"""Time the constrained rollout against a baseline version of ``raptb.adapters.rollout``.

Usage (from the repository root):

    git show main:adapters/rollout.py > /tmp/rollout_main.py
    python benchmarks/rollout.py --baseline /tmp/rollout_main.py [--model tiny] [--rows 32] \
        [--repeats 20] [--threads 1]

Builds an Expr24-style policy (digits and the four operators, the ``num (op num)*`` grammar, stop
at EOS), then alternates the baseline's ``sample_rollout`` and the current one on the same
policy, one rollout each per repeat, with the same generator seed per repeat, so both see the same
machine load. Checks that both return the same tokens, lengths and log-probs bit for bit and
prints the median milliseconds per rollout of each and their ratio.

One rollout per optimizer step against several (the trainer's layout before and after):

    python benchmarks/rollout.py --split 4 [--rows 128] [--repeats 20] [--threads 1]

alternates one ``sample_rollout`` of ``--rows`` rows and ``--split`` rollouts of rows / split
each (the current module both times) and prints the median milliseconds per step's rows of each,
with generated tokens per second.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from raptb.adapters.models import load_model_and_tokenizer
from raptb.adapters.policy import HFPolicy
from raptb.adapters.rollout import Rollout, sample_rollout
from raptb.adapters.tokens import legal_token_ids, stop_token_id

GRAMMAR = 'root ::= num (op num)*\nnum ::= [1-9]\nop ::= "+" | "-" | "*" | "/"'
ALPHABET = "123456789+-*/"
PROMPT = "Make 24:"


def load_baseline(path: Path) -> Callable[..., Rollout]:
    """``sample_rollout`` of the rollout module stored at ``path``."""
    spec = importlib.util.spec_from_file_location("rollout_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module.sample_rollout


def same(a: Rollout, b: Rollout) -> bool:
    return (
        torch.equal(a.tokens, b.tokens)
        and torch.equal(a.length, b.length)
        and torch.equal(a.log_pf.view(torch.int32), b.log_pf.view(torch.int32))
        and torch.equal(a.log_pterm.view(torch.int32), b.log_pterm.view(torch.int32))
        and a.texts == b.texts
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--split", type=int, default=None)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--min-length", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model, seed=0)
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, ALPHABET, stop_id=stop)
    policy = HFPolicy(model, tokenizer, legal_ids=legal, stop_id=stop, grammar=GRAMMAR)
    if args.split is not None:
        split_main(args, policy)
        return
    if args.baseline is None:
        raise SystemExit("--baseline FILE or --split N is required")
    versions = {"baseline": load_baseline(args.baseline), "current": sample_rollout}
    times: dict[str, list[float]] = {name: [] for name in versions}
    tokens = 0
    for repeat in range(args.repeats + 1):  # repeat 0 warms up and is not timed
        results = {}
        for name, sample in versions.items():
            start = time.perf_counter()
            results[name] = sample(
                policy,
                PROMPT,
                args.rows,
                min_length=args.min_length,
                max_length=args.max_length,
                generator=torch.Generator().manual_seed(repeat),
            )
            if repeat:
                times[name].append(time.perf_counter() - start)
        if not same(results["baseline"], results["current"]):
            raise SystemExit(f"repeat {repeat}: the two versions' rollouts differ")
        tokens += int(results["current"].length.sum()) if repeat else 0
    base, cur = (statistics.median(times[name]) * 1e3 for name in versions)
    print(
        f"{args.model}, {args.rows} rows, lengths {args.min_length}-{args.max_length}, "
        f"{args.repeats} repeats, {tokens / args.repeats:.1f} generated tokens per rollout; "
        "all rollouts identical"
    )
    print("| baseline ms | current ms | current / baseline |")
    print(f"| {base:.1f} | {cur:.1f} | {cur / base:.3f} |")


def split_main(args: argparse.Namespace, policy: HFPolicy) -> None:
    """One rollout of ``args.rows`` rows against ``args.split`` rollouts of rows / split."""
    if args.rows % args.split:
        raise SystemExit("--rows must be a multiple of --split")
    layouts = {f"1 x {args.rows}": 1, f"{args.split} x {args.rows // args.split}": args.split}
    times: dict[str, list[float]] = {name: [] for name in layouts}
    tokens: dict[str, int] = dict.fromkeys(layouts, 0)
    for repeat in range(args.repeats + 1):  # repeat 0 warms up and is not timed
        for name, calls in layouts.items():
            generator = torch.Generator().manual_seed(repeat)
            start = time.perf_counter()
            done = [
                sample_rollout(
                    policy,
                    PROMPT,
                    args.rows // calls,
                    min_length=args.min_length,
                    max_length=args.max_length,
                    generator=generator,
                )
                for _ in range(calls)
            ]
            if repeat:
                times[name].append(time.perf_counter() - start)
                tokens[name] += sum(int(r.length.sum()) for r in done)
    print(
        f"{args.model}, {args.rows} rows per step, lengths {args.min_length}-{args.max_length}, "
        f"{args.repeats} repeats, {torch.get_num_threads()} thread(s)"
    )
    print("| rollouts x rows | median ms per step | generated tokens/s |")
    print("|---|---|---|")
    for name in layouts:
        median = statistics.median(times[name])
        rate = tokens[name] / sum(times[name])
        print(f"| {name} | {median * 1e3:.1f} | {rate:.0f} |")


if __name__ == "__main__":
    main()
