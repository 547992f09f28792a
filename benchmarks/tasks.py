"""Per task: reward evaluation time per sample and training micro-batch time, by stage.

Usage (from the repository root):

    python benchmarks/tasks.py [--models tiny smollm2-135m] [--tasks expr24 smiles commongen amp]
        [--batch-size 8] [--steps 3] [--rounds 2] [--threads 1] [--json FILE]

For each model, builds one ``raptb train`` trainer per task (the task's preset; a pretrained model
gets the pretrained preset: LoRA r16, kappa 1) with every micro-batch on-policy and one micro-batch
per optimizer step (``grad_accum`` 1), then alternates the tasks for ``--rounds`` rounds so that a
change of machine load falls on every task alike. Each round per task:

- micro-batch: one untimed then ``--steps`` timed optimizer steps through the trainer's own stages
  (``benchmarks/train_step.py``'s ``timed_optimizer_step``: rollout, task scoring, reference
  pass, rescoring forward, loss + backward, replay refresh, optimizer step);
- reward: the finished texts of one fresh on-policy rollout per prompt (up to ``--reward-prompts``
  prompts), scored by a new ``PrefixScorer`` over a newly built task (cold score cache, and for
  AMP a cold oracle cache: the classifier itself stays loaded) through its ``RewardCaller``, the
  trainer's path for a row's terminal score. Reported per distinct text.

Prints one table (row per task x model, medians over every timed step and round) and the stage
split of each; ``--json`` writes every measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_step import STEP_PARTS, timed_optimizer_step

from raptb.app.configuration.config import build_config
from raptb.app.reward.prefix import PrefixScorer
from raptb.app.task_and_policy import build_task
from raptb.app.training.step import sample_trajectories
from raptb.app.training.train import Trainer

TASKS = ("expr24", "smiles", "commongen", "amp")


def make_trainer(task: str, model: str, args: argparse.Namespace) -> Trainer:
    """A trainer of ``task`` on ``model`` (its presets) whose micro-batches are all on-policy."""
    cfg = build_config(
        overrides={
            "task": task,
            "model": model,
            "threads": args.threads,
            "optim.batch_size": args.batch_size,
            "optim.grad_accum": 1,
            "replay.p_replay": [0.0, 0.0],
        }
    )
    return Trainer(cfg, Path(tempfile.mkdtemp()), progress=False)


def reward_seconds_per_text(trainer: Trainer, prompts: int) -> tuple[float, int]:
    """Cold-cache scoring time of the distinct finished texts of one rollout per prompt (seconds
    per text, summed over prompts) and the number of texts scored."""
    cfg, policy = trainer.cfg, trainer.policy
    total, count = 0.0, 0
    fresh = build_task(cfg)  # a cold oracle cache (AMP) and no state carried over from training
    scorer = PrefixScorer(fresh, policy, cfg.reward.reward_scale)
    for prompt in trainer.task.prompts()[:prompts]:
        with torch.no_grad():
            batch = sample_trajectories(
                policy, trainer.task, prompt, cfg.optim.batch_size, 1.0, trainer.generator
            )
        texts = list(dict.fromkeys(batch.texts))
        start = time.perf_counter()
        scorer.scores(prompt, texts, finished=True)
        total += time.perf_counter() - start
        count += len(texts)
    return total / max(count, 1), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reward-prompts", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, dict[str, Any]] = {}
    for model in args.models:
        trainers = {task: make_trainer(task, model, args) for task in args.tasks}
        runs: dict[str, list[dict[str, float]]] = {task: [] for task in args.tasks}
        reward: dict[str, list[tuple[float, int]]] = {task: [] for task in args.tasks}
        for round_ in range(args.rounds):
            for task, trainer in trainers.items():
                timed_optimizer_step(trainer)  # warm-up: the task's first shapes and caches
                for _ in range(args.steps):
                    runs[task].append(timed_optimizer_step(trainer)[0])
                reward[task].append(reward_seconds_per_text(trainer, args.reward_prompts))
                print(
                    f"{model} {task} round {round_}: micro-batch "
                    f"{statistics.median(r['total'] for r in runs[task]) * 1e3:.0f} ms",
                    flush=True,
                )
        for task, trainer in trainers.items():
            median = {k: statistics.median(r[k] for r in runs[task]) for k in runs[task][0]}
            results[f"{task} / {model}"] = {
                "task": task,
                "model": model,
                "max_length": trainer.task.max_length,
                "lora_rank": trainer.cfg.lora.rank,
                "kappa": trainer.cfg.reward.kappa,
                "replay": trainer.cfg.replay.kind,
                "median_s": median,
                "reward_s_per_text": statistics.median(s for s, _ in reward[task]),
                "reward_texts": sum(n for _, n in reward[task]),
                "runs": runs[task],
            }
        del trainers
    print(
        f"\n| task | model | T max | reward ms / sample | micro-batch ms "
        f"({args.batch_size} rows) |\n|---|---|--:|--:|--:|"
    )
    for r in results.values():
        print(
            f"| {r['task']} | {r['model']} | {r['max_length']} | "
            f"{r['reward_s_per_text'] * 1e3:.3f} | {r['median_s']['total'] * 1e3:.0f} |"
        )
    header = " | ".join(results)
    print(f"\n| stage (median ms) | {header} |\n|---|{'--:|' * len(results)}")
    for part in (*STEP_PARTS, "total"):
        cells = " | ".join(f"{r['median_s'][part] * 1e3:.1f}" for r in results.values())
        print(f"| {part} | {cells} |")
    print(f"\ntorch {torch.__version__}, {args.threads} thread(s); reward texts per cell: ", end="")
    print(", ".join(f"{k} {r['reward_texts']}" for k, r in results.items()))
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}} | results))


if __name__ == "__main__":
    main()
