"""The ceiling of the embedded model on Expr24: maximum likelihood on uniform draws from Y*.

Usage (from the repository root):

    python benchmarks/ceiling.py [--shapes 2x64,4x128] [--seconds 180] [--lr 1e-3,3e-3]
        [--subsets 0,1500] [--batch 128] [--threads 1] [--seed 0] [--eval-every 30]
        [--out FILE.json]

No GFlowNet objective can beat the sampler this script trains: every step it draws ``--batch``
texts uniformly from Expr24's 75,445 solutions (the target distribution itself, which a perfect
sampler matches) and takes one Adam step on their mean negative log-probability under the
sampler's own constrained distribution (the grammar-allowed actions of ``HFPolicy.sample`` at
each position, stop included). It runs each model shape x learning rate for the same CPU
time (this process's, so that other load on the machine does not shorten a run) and, every
``--eval-every`` CPU seconds of training, measures the policy exactly with
``raptb.adapters.lm.exact.exact_log_probs`` (the evaluator behind ``raptb eval --exact``):
exact Acc = pi(Y*), E[distinct correct in N = 6400 draws] and KL(p* || pi | Y*).

``--subsets K``: the draws come from a fixed random subset of K solutions instead (0: all of
Y*). A sampler need not match the uniform target to score well on the paper's metrics: one
uniform over 1,500 solutions has E[distinct] 1,479 at N = 6400. Fitting a K-subset measures
whether the model can put high accuracy on that many solutions at all in the budget.

What it answers: how much of its mass the model can move onto the solutions, and how spread over
them, in the CPU time the README's main job has; if that is below a goal, no objective or replay
scheme reaches the goal on this model and the default's size or budget must change.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from raptb.adapters.lm.exact import exact_log_probs
from raptb.adapters.tasks.expr24.task import Expr24Task, enumerate_solutions
from raptb.app.configuration.sections import TinyConfig
from raptb.app.task_and_policy import build_policy

EVAL_N = 6400


def parse_shapes(spec: str) -> list[tuple[int, int]]:
    """'2x64,4x128' -> [(2, 64), (4, 128)] (layers x width)."""
    shapes = []
    for part in spec.split(","):
        layers, width = part.lower().split("x")
        shapes.append((int(layers), int(width)))
    return shapes


def exact_report(policy, task: Expr24Task, solutions: list[str]) -> dict[str, float]:
    """Exact Acc, E[distinct correct at N = 6400] and KL(uniform over Y* || pi | Y*)."""
    with torch.no_grad():
        log_pi = exact_log_probs(
            policy, task.prompt, solutions, min_length=task.min_length, max_length=task.max_length
        ).log_prob
    pi = np.exp(log_pi)
    acc = float(pi.sum())
    distinct = float(np.sum(-np.expm1(EVAL_N * np.log1p(-np.minimum(pi, 1 - 1e-16)))))
    log_cond = log_pi - math.log(acc)
    kl = float(np.mean(-math.log(len(solutions)) - log_cond))
    return {"exact_acc": acc, "expected_distinct": distinct, "kl_target_pi": kl}


class TeacherForcing:
    """Batched teacher-forced log pi(text) of the constrained sampler for Expr24 texts.

    Expr24's grammar fixes the allowed actions by position alone: a digit at even positions, an
    operator at odd ones, stop also allowed after a digit once the text has min_length
    characters, stop only at max_length. ``masks[k]`` is the allowed-token set after k generated
    characters; the log-probability of a text sums the log-softmax over that set at each position,
    the stop included (0 at max_length, where stop is forced).
    """

    def __init__(self, policy, task: Expr24Task) -> None:
        self.policy = policy
        self.prompt = torch.tensor(policy.prompt_ids(task.prompt))
        self.sub = {text: policy.legal_ids[j] for j, text in enumerate(policy.texts)}
        vocab = policy.model.config.vocab_size
        digits = [self.sub[c] for c in "123456789"]
        ops = [self.sub[c] for c in "+-*/"]
        self.max_length = task.max_length
        masks = torch.zeros(task.max_length + 1, vocab, dtype=torch.bool)
        for k in range(task.max_length + 1):
            if k == task.max_length:
                masks[k, policy.stop_id] = True
            elif k % 2 == 0:
                masks[k, digits] = True
            else:
                masks[k, ops] = True
                if k >= task.min_length:
                    masks[k, policy.stop_id] = True
        self.masks = masks

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [B, max_length + 1], stop-padded; lengths [B]) of ``texts``."""
        tokens = torch.full((len(texts), self.max_length + 1), self.policy.stop_id)
        for row, text in enumerate(texts):
            tokens[row, : len(text)] = torch.tensor([self.sub[c] for c in text])
        return tokens, torch.tensor([len(t) for t in texts])

    def log_prob(self, tokens: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """log pi(text) [B] of encoded texts under the current weights (with gradients)."""
        b, width = tokens.shape[0], len(self.prompt)
        big_t = self.max_length
        ids = torch.cat([self.prompt.expand(b, -1), tokens[:, :big_t]], dim=1)
        logits = self.policy.model(input_ids=ids, use_cache=False).logits[:, width - 1 :, :]
        logits = logits.masked_fill(~self.masks[None], float("-inf"))
        log_p = torch.log_softmax(logits.float(), dim=-1)
        chosen = log_p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, T + 1]
        cols = torch.arange(big_t + 1)[None, :]
        used = (cols <= length[:, None]) & (cols < big_t)  # tokens, then the stop (if not forced)
        return torch.where(used, chosen, 0.0).sum(dim=1)


def run(
    shape: tuple[int, int],
    lr: float,
    subset: int,
    args: argparse.Namespace,
    solutions: list[str],
) -> dict:
    task = Expr24Task()
    layers, width = shape
    policy = build_policy("tiny", task, seed=args.seed, tiny=TinyConfig(layers=layers, width=width))
    params = sum(p.numel() for p in policy.model.parameters())
    forcing = TeacherForcing(policy, task)
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=lr)
    rng = np.random.default_rng(args.seed)
    curve = []
    drawn = solutions
    if subset:
        picked = np.random.default_rng(args.seed).choice(len(solutions), subset, replace=False)
        drawn = [solutions[i] for i in sorted(picked)]
    all_tokens, all_length = forcing.encode(drawn)
    trained_s, steps, next_eval = 0.0, 0, args.eval_every
    while trained_s < args.seconds:
        tic = time.process_time()
        rows = torch.from_numpy(rng.integers(len(drawn), size=args.batch))
        loss = -forcing.log_prob(all_tokens[rows], all_length[rows]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trained_s += time.process_time() - tic
        steps += 1
        if trained_s >= next_eval or trained_s >= args.seconds:
            point = {"seconds": round(trained_s, 1), "steps": steps, "nll": float(loss.detach())}
            point.update(exact_report(policy, task, solutions))
            curve.append(point)
            print(
                f"{layers}x{width} lr {lr:g} subset {subset or 'all'}: "
                f"{point['seconds']:6.1f} s, {steps:5d} steps, "
                f"nll {point['nll']:.3f}, exact Acc {point['exact_acc']:.3f}, "
                f"E[distinct] {point['expected_distinct']:.0f}",
                flush=True,
            )
            next_eval += args.eval_every
    return {
        "layers": layers,
        "width": width,
        "params": params,
        "lr": lr,
        "subset": subset or len(solutions),
        "curve": curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2x64,4x128")
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--lr", default="1e-3,3e-3")
    parser.add_argument("--subsets", default="0")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    solutions = enumerate_solutions()
    record = {
        "date": time.strftime("%Y-%m-%d"),
        "threads": args.threads,
        "batch": args.batch,
        "seed": args.seed,
        "seconds": args.seconds,
        "runs": [],
    }
    for shape in parse_shapes(args.shapes):
        for lr in args.lr.split(","):
            for subset in args.subsets.split(","):
                record["runs"].append(run(shape, float(lr), int(subset), args, solutions))
                if args.out is not None:  # after every fit, so a stopped run keeps the others
                    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
