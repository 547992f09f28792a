"""Time one training micro-batch of the default Expr24 run, stage by stage.

Usage (from the repository root):

    python benchmarks/train_step.py [--micro-batches 60] [--threads 1] [--replay subm]

Builds the default ``raptb train`` configuration (embedded tiny model, Expr24, RapTB, SubM),
warms the replay buffer up, then runs on-policy micro-batches of 32 trajectories through the
trainer's own stages (``raptb.app.training.step``) and times each: collect (the rollout, split into
model forwards, grammar masking and the rest), reward (per-prefix task scores, u as a tensor, the
reference prior when kappa > 0), loss (teacher-forced rescoring forward, objective, backward) and
the buffer update (new items and ``buffer.add``). Prints medians and each stage's share.

Whole optimizer steps on any model (e.g. a GPU with a Llama-3.2-1B-shaped model):

    python benchmarks/train_step.py --optimizer-steps 5 --model-config llama-1b --tokenizer DIR \
        --task fixed --length 10 --batch-size 32 --grad-accum 4 --kappa 1 [--decode eager] \
        [--json FILE]

times ``--optimizer-steps`` steps after ``--warmup`` untimed ones (``--compare-rollouts``: the
step's rows rolled out in one call, as the trainer does, against one call per micro-batch, the
layout before one rollout per step, alternating step by step). Every micro-batch is sampled
on-policy (p_replay 0, so each step rolls out ``batch-size x grad-accum`` trajectories) and goes
through the same ``raptb.app.training.step`` stages: collect (the rollout; its grammar time from the
rollout's own timings), reward (task scores, then the reference pass: kappa > 0, the frozen base
with the LoRA adapter disabled), loss_step (teacher-forced rescoring forward, objective, backward),
new_items + ``buffer.add`` (replay refresh), then gradient clipping and the optimizer step as
``Trainer._optimizer_step`` does them. The reference pass and the rescoring forward are timed
inside their stages by wrapping the policy's ``reference_score`` and ``score`` for the duration
of the measurement. Each timed span is closed by a device synchronisation, so on a GPU every time
is wall time of finished work. ``--model-config llama-1b`` writes a Llama-3.2-1B-shaped model with
random weights over the tokenizer in ``--tokenizer DIR`` (16 layers, width 2048, 32 heads, 8 KV
heads, MLP 8192, tied embeddings) to a temporary folder and trains it like any local model (LoRA
r16, bf16 on CUDA); ``llama-tiny`` is a 2-layer, width-64 model of the same family for trying the
script on a CPU. ``--task fixed`` is a custom task with no grammar and every non-special token
legal, whose rows all have exactly ``--length`` tokens (min_length = max_length), so that the
number of generated tokens is fixed (the TRL anchor, ``benchmarks/trl_anchor.py``, uses it);
``expr24`` and ``smiles`` are the paper's tasks with their grammars (lengths then vary).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from raptb.adapters.lm.policy import HFPolicy
from raptb.app.configuration.config import build_config
from raptb.app.training.gflownet.mix_schedule import Mix
from raptb.app.training.gflownet.replay_items import new_items
from raptb.app.training.gflownet.row_plan import plan_rows
from raptb.app.training.micro_batch import run_micro_batches
from raptb.app.training.step import loss_step, reward, sample_trajectories
from raptb.app.training.step_batch import collect_step, micro_batches
from raptb.app.training.train import Trainer

# Every micro-batch on-policy at temperature 1, no oracle: the path every sampled batch takes.
ON_POLICY = Mix(
    p_replay=0.0, low_temp_prob=0.0, temp_lo=1.0, temp_hi=1.0, p_oracle=0.0, oracle_fraction=0.0
)


# Llama-3.2-1B's shape (random weights) and a tiny model of the same family for CPU checks
MODEL_CONFIGS: dict[str, dict[str, int]] = {
    "llama-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "smollm2-135m-shape": {  # SmolLM2-135M's blocks: 30 layers x 576, 9 heads, 3 KV heads
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
    },
    "llama-3b": {  # Llama-3.2-3B's blocks
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
    },
    "llama-8b": {  # Llama-3.1-8B's blocks
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "qwen3-32b-shape": {  # Qwen3-32B's sizes in Llama blocks (no q/k norm)
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
    "llama-tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}
FIXED_PROMPT = "Write a sequence of numbers:"
STEP_PARTS = (
    "rollout: model + sampling",
    "rollout: grammar",
    "task scoring",
    "reference pass",
    "rescoring forward",
    "loss + backward",
    "replay refresh",
    "optimizer step",
)


def digit_reward(prompt: str, text: str) -> float:
    """Reward of the ``fixed`` task: the fraction of digits in the text (cheap, always valid)."""
    return sum(c.isdigit() for c in text) / max(1, len(text))


def random_llama(name: str, tokenizer: Any, seed: int = 0) -> Any:
    """A ``MODEL_CONFIGS[name]`` Llama over ``tokenizer``'s vocabulary (tied embeddings) with
    random weights (seed), initialised on the GPU when there is one, directly in its preferred
    dtype (bf16 where supported: no float32 copy, so 32B shapes fit), float32 otherwise."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from raptb.adapters.lm.lora import preferred_dtype

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_CONFIGS[name],
    )
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.device(device):
            return LlamaForCausalLM._from_config(config, dtype=preferred_dtype(device))


def write_random_model(name: str, tokenizer_dir: str, out: Path, seed: int = 0) -> Path:
    """Save a ``random_llama(name, ...)`` and the tokenizer in ``tokenizer_dir`` to ``out``;
    returns ``out``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = random_llama(name, tokenizer, seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    return out


def step_overrides(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """TrainConfig overrides of an optimizer-step measurement (every micro-batch on-policy)."""
    overrides: dict[str, Any] = {
        "model": model,
        "optim.batch_size": args.batch_size,
        "optim.grad_accum": args.grad_accum,
        "replay.p_replay": [0.0, 0.0],
        "replay.kind": args.replay,
    }
    if args.task == "fixed":
        overrides |= {
            "task": "custom",
            "custom.reward": "train_step:digit_reward",
            "custom.prompts": [FIXED_PROMPT],
            "custom.min_length": args.length,
            "custom.max_length": args.length,
        }
    else:
        overrides["task"] = args.task
    if args.kappa is not None:
        overrides["reward.kappa"] = args.kappa
    return overrides


def preset_trainer(task: str, model: str) -> Trainer:
    """A trainer of ``task``'s preset for ``model`` as ``step_overrides`` sets it (32-row
    micro-batches, four a step, SubM, every row on-policy), in a temporary run directory."""
    ns = argparse.Namespace(
        batch_size=32, grad_accum=4, replay="subm", task=task, kappa=None, length=10
    )
    config = build_config(overrides=step_overrides(ns, model))
    return Trainer(config, Path(tempfile.mkdtemp()) / "run", progress=False)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class _Timed:
    """A callable that adds its synchronised wall time to the calling thread's seconds;
    ``seconds`` is the largest thread's (calls from lanes side by side: their share of the wall
    time, not the lanes' sum)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.by_thread: dict[int, float] = {}

    @property
    def seconds(self) -> float:
        return max(self.by_thread.values(), default=0.0)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _sync()
        start = time.perf_counter()
        out = self.fn(*args, **kwargs)
        _sync()
        thread = threading.get_ident()
        self.by_thread[thread] = self.by_thread.get(thread, 0.0) + time.perf_counter() - start
        return out


@contextmanager
def timed_policy(policy: HFPolicy) -> Iterator[tuple[_Timed, _Timed]]:
    """Time ``policy.score`` (the rescoring forward) and ``policy.reference_score`` (the reference
    pass) while the block runs; the instance's own methods are restored after it."""
    score, ref = _Timed(policy.score), _Timed(policy.reference_score)
    policy.score, policy.reference_score = score, ref
    try:
        yield score, ref
    finally:
        del policy.score, policy.reference_score


def timed_optimizer_step(trainer: Trainer, rollouts: int = 1) -> tuple[dict[str, float], int]:
    """One optimizer step of on-policy rows through the trainer's stages, timed by component;
    returns (times, generated tokens). The step's batch_size x grad_accum rows are planned
    (``app.training.step_batch``), rolled out in ``rollouts`` calls (1: the trainer's one rollout
    per step; grad_accum: one per micro-batch, the layout before), scored, and their loss runs over
    micro-batches of batch_size rows; the buffer is refreshed once."""
    cfg, policy, task = trainer.cfg, trainer.policy, trainer.task
    parts = dict.fromkeys(STEP_PARTS, 0.0)
    policy.model.train()
    trainer.optimizer.zero_grad(set_to_none=True)
    _sync()
    step_start = time.perf_counter()
    own, prompts = trainer.step_rows()
    plan = plan_rows(prompts, ON_POLICY, buffer=None, oracle=None, rng=trainer.rng)
    chunk = len(own) // rollouts
    with timed_policy(policy) as (score, ref):
        start = time.perf_counter()
        steps = [
            collect_step(policy, task, plan, own[i : i + chunk], generator=trainer.generator)
            for i in range(0, len(own), chunk)
        ]
        pieces = [piece for step in steps for piece in step.pieces]
        _sync()
        t_collect = time.perf_counter()
        scored = [
            (piece, reward(trainer.scorer, policy, piece, cfg.reward.kappa)) for piece in pieces
        ]
        _sync()
        t_reward = time.perf_counter()
        batches = [
            [(scored[i][0].take(rows), scored[i][1].take(rows)) for i, rows in batch_parts]
            for batch_parts in micro_batches([len(p.rows) for p in pieces], trainer.rank_batch)
        ]

        def loss(parts: Any, _rows: slice) -> Any:
            return loss_step(
                policy,
                trainer.algorithm.objective,
                trainer.algorithm.log_z,
                parts,
                trainer.step,
                1 / len(batches),
            )

        # in the policy's lanes, as the trainer's GFlowNet step runs them (Trainer.accumulate)
        params = [p for g in trainer.optimizer.param_groups for p in g["params"] if p.requires_grad]
        if len(run_micro_batches(batches, loss, policy.lanes, params)) < len(batches):
            raise RuntimeError("non-finite loss")
        _sync()
        t_loss = time.perf_counter()
        if trainer.algorithm.buffer is not None:
            trainer.algorithm.buffer.add(
                [item for p, r in scored for item in new_items(task, p, r)]
            )
        end = time.perf_counter()
    grammar = sum(step.timings.grammar_s for step in steps if step.timings is not None)
    generated = sum(len(row) for piece in pieces for row in piece.rows)
    parts["rollout: model + sampling"] = t_collect - start - grammar
    parts["rollout: grammar"] = grammar
    parts["task scoring"] = t_reward - t_collect - ref.seconds
    parts["reference pass"] = ref.seconds
    parts["rescoring forward"] = score.seconds
    parts["loss + backward"] = t_loss - t_reward - score.seconds
    parts["replay refresh"] = end - t_loss
    start = time.perf_counter()
    if cfg.optim.clip is not None:
        params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, cfg.optim.clip)
    trainer.optimizer.step()
    _sync()
    end = time.perf_counter()
    parts["optimizer step"] = end - start
    parts["total"] = end - step_start
    trainer.step += 1
    return parts, generated


def measure_steps(
    trainer: Trainer,
    steps: int,
    warmup: int,
    log: Callable[[str], None] = print,
    rollouts: int = 1,
) -> dict[str, Any]:
    """``warmup`` untimed then ``steps`` timed optimizer steps (their rows rolled out in
    ``rollouts`` calls); medians, shares, tokens/s, peak memory over the timed steps."""
    for _ in range(warmup):
        timed_optimizer_step(trainer, rollouts)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    runs, tokens = [], []
    for i in range(steps):
        parts, generated = timed_optimizer_step(trainer, rollouts)
        runs.append(parts)
        tokens.append(generated)
        log(f"raptb step {i}: {parts['total']:.3f} s, {generated} tokens")
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    total = median["total"]
    return {
        "median_s": median,
        "share": {k: v / total for k, v in median.items()},
        "steps_s": [r["total"] for r in runs],
        "tokens_per_step": statistics.median(tokens),
        "tokens_per_s": statistics.median(tokens) / total,
        "max_memory_allocated_mib": (
            torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
        ),
        "runs": runs,
    }


def markdown(result: dict[str, Any], title: str) -> str:
    lines = [f"| {title} | median ms | share |", "|---|---|---|"]
    for key, value in result["median_s"].items():
        lines.append(f"| {key} | {value * 1e3:.1f} | {result['share'][key]:.1%} |")
    lines.append(
        f"\ngenerated tokens per step {result['tokens_per_step']:.0f}, "
        f"{result['tokens_per_s']:.0f} tokens/s; peak memory "
        f"{result['max_memory_allocated_mib'] or float('nan'):.0f} MiB"
    )
    return "\n".join(lines)


def compare_rollouts(trainer: Trainer, steps: int, warmup: int) -> str:
    """A table of median ms per step part, the step's rows rolled out in one call against one
    call per micro-batch, the two layouts alternating step by step (the same machine load)."""
    calls = trainer.cfg.optim.grad_accum
    rows = trainer.rank_batch * calls
    layouts = {f"1 rollout of {rows}": 1, f"{calls} rollouts of {rows // calls}": calls}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in layouts}
    tokens: dict[str, int] = dict.fromkeys(layouts, 0)
    for i in range(warmup + steps):
        for name, count in layouts.items():
            parts, generated = timed_optimizer_step(trainer, count)
            if i >= warmup:
                runs[name].append(parts)
                tokens[name] += generated
    names = list(layouts)
    lines = [f"| part | {names[0]}, median ms | {names[1]}, median ms |", "|---|---|---|"]
    for key in (*STEP_PARTS, "total"):
        values = [statistics.median(r[key] for r in runs[name]) * 1e3 for name in names]
        lines.append(f"| {key} | {values[0]:.1f} | {values[1]:.1f} |")
    rates = [tokens[n] / sum(r["total"] for r in runs[n]) for n in names]
    lines.append(f"| generated tokens/s | {rates[0]:.0f} | {rates[1]:.0f} |")
    return "\n".join(lines)


def optimizer_step_main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp())
    model = args.model
    if args.model_config is not None:
        if args.tokenizer is None:
            raise SystemExit("--model-config needs --tokenizer DIR")
        model = str(write_random_model(args.model_config, args.tokenizer, work / "model"))
    cfg = build_config(overrides=step_overrides(args, model) | {"sampling.decode": args.decode})
    trainer = Trainer(cfg, work / "run", progress=False)
    if args.compare_rollouts:
        print(compare_rollouts(trainer, args.optimizer_steps, args.warmup))
        return
    result = measure_steps(trainer, args.optimizer_steps, args.warmup)
    name = (
        torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    )  # the machine, for the table
    result["setting"] = {
        "device": name,
        "torch": str(torch.__version__),
        "model": args.model_config or args.model,
        "task": args.task,
        "length": trainer.task.max_length,
        "batch_size": args.batch_size,
        "grad_accum": args.grad_accum,
        "kappa": cfg.reward.kappa,
        "replay": cfg.replay.kind,
        "lora_rank": cfg.lora.rank,
        "decode": trainer.policy.decode_path,
        "warmup": args.warmup,
        "steps": args.optimizer_steps,
    }
    title = (
        f"{result['setting']['model']}, {args.task}, {args.batch_size} x {args.grad_accum} rows, "
        f"T={trainer.task.max_length}"
    )
    print(markdown(result, title))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def micro_batch_main(args: argparse.Namespace) -> None:
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
        batch = sample_trajectories(policy, task, prompt, n, 1.0, trainer.generator)
        t_collect = time.perf_counter()
        rewards = reward(trainer.scorer, policy, batch, cfg.reward.kappa)
        t_reward = time.perf_counter()
        result = loss_step(
            policy,
            trainer.algorithm.objective,
            trainer.algorithm.log_z,
            [(batch, rewards)],
            trainer.step,
            1.0,
        )
        assert result is not None, "non-finite loss"
        t_loss = time.perf_counter()
        if trainer.algorithm.buffer is not None:
            trainer.algorithm.buffer.add(new_items(task, batch, rewards))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--replay", default="subm")
    parser.add_argument("--optimizer-steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--model-config", choices=sorted(MODEL_CONFIGS), default=None)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--task", choices=["fixed", "expr24", "smiles"], default="expr24")
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--kappa", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--decode",
        choices=["auto", "eager", "static"],
        default="auto",
        help="sampling.decode of --optimizer-steps (auto: static on CUDA, eager on the CPU)",
    )
    parser.add_argument("--compare-rollouts", action="store_true")
    args = parser.parse_args()
    if args.optimizer_steps is not None:
        optimizer_step_main(args)
    else:
        micro_batch_main(args)


if __name__ == "__main__":
    main()
