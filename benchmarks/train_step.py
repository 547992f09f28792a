"""Time one training micro-batch of the default Expr24 run, split by component.

Usage (from the repository root):

    python benchmarks/train_step.py [--micro-batches 60] [--threads 1] [--replay subm]

Builds the default ``raptb train`` configuration (embedded tiny model, Expr24, RapTB, SubM),
warms the replay buffer up, then for each on-policy micro-batch of 32 trajectories times:
rollout (split into model forwards, grammar masking and the rest), per-prefix task scoring,
teacher-forced rescoring forward, loss + backward, and the replay refresh (``buffer.add``). Prints
medians and each component's share of the micro-batch.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from raptb.adapters.policy import to_prefix_batch
from raptb.app.config import build_config
from raptb.app.runtime import pad_rows
from raptb.app.train import Trainer
from raptb.core.replay import ReplayItem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--replay", default="subm")
    args = parser.parse_args()
    cfg = build_config(overrides={"threads": args.threads, "replay.kind": args.replay})
    trainer = Trainer(cfg, Path(tempfile.mkdtemp()), progress=False)
    trainer.train(stop_at=20)  # a warm, full buffer and a model that is no longer uniform
    policy, task, scorer = trainer.policy, trainer.task, trainer.scorer
    prompt = task.prompts()[0]
    n, big_t = cfg.optim.batch_size, task.max_length
    parts: dict[str, list[float]] = {
        k: []
        for k in (
            "rollout: model",
            "rollout: grammar",
            "rollout: other",
            "task scoring",
            "rescoring forward",
            "loss + backward",
            "replay refresh",
            "micro-batch total",
        )
    }
    for _ in range(args.micro_batches):
        start = time.perf_counter()
        rollout = policy.sample(
            prompt, n, min_length=task.min_length, max_length=big_t, generator=trainer.generator
        )
        t_rollout = time.perf_counter()
        lengths = rollout.length.tolist()
        rows = [tuple(rollout.tokens[b, : lengths[b]].tolist()) for b in range(n)]
        scored = scorer.score_rows(prompt, rows, big_t)
        t_score = time.perf_counter()
        tokens = pad_rows(rows, big_t, policy.pad_id)
        length = torch.tensor(lengths)
        log_pf, log_pterm = policy.score(prompt, tokens, length)
        t_fwd = time.perf_counter()
        u = torch.as_tensor(scored.u, dtype=torch.float32)
        batch = to_prefix_batch(log_pf, log_pterm, u, u, length)
        loss, _ = trainer.objective(batch, trainer.log_z, trainer.step)
        loss.backward()
        t_bwd = time.perf_counter()
        items = [
            ReplayItem(
                prompt=prompt,
                tokens=rows[b],
                text=rollout.texts[b],
                log_r=scored.u[b, : lengths[b] + 1],
                u=scored.u[b, : lengths[b] + 1],
                valid=scored.scores[b].valid,
            )
            for b in range(n)
        ]
        if trainer.buffer is not None:
            trainer.buffer.add(items)
        end = time.perf_counter()
        timings = rollout.timings
        parts["rollout: model"].append(timings.model_s)
        parts["rollout: grammar"].append(timings.grammar_s)
        parts["rollout: other"].append(t_rollout - start - timings.model_s - timings.grammar_s)
        parts["task scoring"].append(t_score - t_rollout)
        parts["rescoring forward"].append(t_fwd - t_score)
        parts["loss + backward"].append(t_bwd - t_fwd)
        parts["replay refresh"].append(end - t_bwd)
        parts["micro-batch total"].append(end - start)
        trainer.optimizer.zero_grad(set_to_none=True)
    total = statistics.median(parts["micro-batch total"])
    rollout_total = sum(statistics.median(parts[k]) for k in parts if k.startswith("rollout"))
    print(f"| component ({n} trajectories, T={big_t}, {args.threads} thread) | median ms | share |")
    print("|---|---|---|")
    for key, values in parts.items():
        med = statistics.median(values)
        print(f"| {key} | {med * 1e3:.2f} | {med / total:.1%} |")
    grammar = statistics.median(parts["rollout: grammar"])
    print(f"\ngrammar masking share of rollout time: {grammar / rollout_total:.1%}")
    print(f"micro-batches timed: {args.micro_batches}; torch {torch.__version__}")


if __name__ == "__main__":
    main()
