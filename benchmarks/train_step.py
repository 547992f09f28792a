"""Time one training micro-batch of the default Expr24 run, stage by stage.

Usage (from the repository root):

    python benchmarks/train_step.py [--micro-batches 60] [--threads 1] [--replay subm]

Builds the default ``raptb train`` configuration (embedded tiny model, Expr24, RapTB, SubM),
warms the replay buffer up, then runs on-policy micro-batches of 32 trajectories through the
trainer's own stages (``raptb.app.step``) and times each: collect (the rollout, split into model
forwards, grammar masking and the rest), reward (per-prefix task scores, u as a tensor, the
reference prior when kappa > 0), loss (teacher-forced rescoring forward, objective, backward) and
the buffer update (new items and ``buffer.add``). Prints medians and each stage's share.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from raptb.app.config import build_config
from raptb.app.step import Mix, collect, loss_step, new_items, reward
from raptb.app.train import Trainer

# Every micro-batch on-policy at temperature 1, no oracle: the path every sampled batch takes.
ON_POLICY = Mix(
    p_replay=0.0, low_temp_prob=0.0, temp_lo=1.0, temp_hi=1.0, p_oracle=0.0, oracle_fraction=0.0
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--replay", default="subm")
    args = parser.parse_args()
    cfg = build_config(overrides={"threads": args.threads, "replay.kind": args.replay})
    trainer = Trainer(cfg, Path(tempfile.mkdtemp()), progress=False)
    trainer.train(stop_at=20)  # a warm, full buffer and a model that is no longer uniform
    policy, task = trainer.policy, trainer.task
    prompt = task.prompts()[0]
    n, big_t = cfg.optim.batch_size, task.max_length
    parts: dict[str, list[float]] = {
        k: []
        for k in (
            "collect: rollout model",
            "collect: rollout grammar",
            "collect: other",
            "reward",
            "loss (rescoring forward, objective, backward)",
            "buffer update",
            "micro-batch total",
        )
    }
    for _ in range(args.micro_batches):
        start = time.perf_counter()
        batch = collect(
            policy,
            task,
            prompt,
            n,
            ON_POLICY,
            buffer=trainer.buffer,
            oracle=None,
            rng=trainer.rng,
            generator=trainer.generator,
        )
        t_collect = time.perf_counter()
        rewards = reward(trainer.scorer, policy, batch, cfg.reward.kappa)
        t_reward = time.perf_counter()
        result = loss_step(
            policy, trainer.objective, trainer.log_z, batch, rewards, trainer.step, 1
        )
        assert result is not None, "non-finite loss"
        t_loss = time.perf_counter()
        if trainer.buffer is not None:
            trainer.buffer.add(new_items(task, batch, rewards))
        end = time.perf_counter()
        assert batch.timings is not None  # an on-policy batch is a rollout
        model_s, grammar_s = batch.timings.model_s, batch.timings.grammar_s
        parts["collect: rollout model"].append(model_s)
        parts["collect: rollout grammar"].append(grammar_s)
        parts["collect: other"].append(t_collect - start - model_s - grammar_s)
        parts["reward"].append(t_reward - t_collect)
        parts["loss (rescoring forward, objective, backward)"].append(t_loss - t_reward)
        parts["buffer update"].append(end - t_loss)
        parts["micro-batch total"].append(end - start)
        trainer.optimizer.zero_grad(set_to_none=True)
    total = statistics.median(parts["micro-batch total"])
    collect_total = sum(statistics.median(parts[k]) for k in parts if k.startswith("collect"))
    print(f"| stage ({n} trajectories, T={big_t}, {args.threads} thread) | median ms | share |")
    print("|---|---|---|")
    for key, values in parts.items():
        med = statistics.median(values)
        print(f"| {key} | {med * 1e3:.2f} | {med / total:.1%} |")
    grammar = statistics.median(parts["collect: rollout grammar"])
    print(f"\ngrammar masking share of collect time: {grammar / collect_total:.1%}")
    print(f"micro-batches timed: {args.micro_batches}; torch {torch.__version__}")


if __name__ == "__main__":
    main()
