"""raptb's optimizer step against TRL's GRPOTrainer on the same model, batch, lengths and LoRA.

Usage (from the repository root; needs ``trl`` and ``datasets``):

    python benchmarks/trl_anchor.py --model-config llama-1b --tokenizer DIR --lengths 10,64 \
        --batch-size 32 --grad-accum 4 --warmup 2 --steps 5 --json FILE

One process, one model folder (``train_step.write_random_model``: a Llama-3.2-1B-shaped model
with random weights over the tokenizer in DIR, bf16 on CUDA), and for each completion length T:

- raptb: ``train_step.measure_steps`` on the ``fixed`` task (no grammar, every non-special token
  legal, min_length = max_length = T, so every row has exactly T tokens), LoRA r16 (alpha 16,
  dropout 0.1), RapTB with SubM replay, kappa = 1 (the reference pass with the adapter disabled),
  every micro-batch on-policy: ``batch-size x grad-accum`` trajectories per optimizer step, rolled
  out ``batch-size`` at a time. Also with the whole step in one micro-batch
  (``batch-size * grad-accum`` x 1), which rolls out as many rows at once as TRL does.
- TRL: ``GRPOTrainer`` with plain transformers generation (no vLLM), bf16, the same LoRA
  (``peft_config``), ``per_device_train_batch_size = batch-size``,
  ``gradient_accumulation_steps = grad-accum``, ``num_generations = batch-size`` (so a step is
  grad-accum prompts x batch-size completions, generated together as TRL does by default:
  ``steps_per_generation = grad-accum``), ``max_completion_length = T`` and
  ``generation_kwargs = {"min_new_tokens": T}`` (no EOS before T: every completion has exactly T
  tokens), ``beta = 0.04`` (TRL's reference pass, adapter disabled, like raptb's kappa > 0), no
  gradient checkpointing (raptb has none), lr 1e-4, the same prompt and a cheap reward.

Every step is closed by a device synchronisation; TRL's steps are timed by a callback from
``on_step_begin`` to ``on_step_end`` (generation, rewards, reference pass, the grad-accum
forward/backward passes and the optimizer step; logging is kept out with a large
``logging_steps``), its generation by wrapping ``_generate_single_turn`` and its whole
generate-and-score phase by wrapping ``_generate_and_score_completions``. Medians over ``--steps``
steps after ``--warmup`` untimed ones; peak ``torch.cuda.max_memory_allocated`` per side.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_step import (
    FIXED_PROMPT,
    digit_reward,
    measure_steps,
    step_overrides,
    write_random_model,
)

from raptb.adapters.lm.lora import lora_target_modules
from raptb.app.configuration.config import build_config
from raptb.app.training.train import Trainer

LORA = {"r": 16, "lora_alpha": 16.0, "lora_dropout": 0.1}
TRL_BETA = 0.04


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run_raptb(model_dir: Path, length: int, batch: int, accum: int, args: argparse.Namespace):
    ns = SimpleNamespace(
        batch_size=batch, grad_accum=accum, replay="subm", task="fixed", length=length, kappa=1.0
    )
    cfg = build_config(overrides=step_overrides(ns, str(model_dir)))
    trainer = Trainer(cfg, Path(tempfile.mkdtemp()) / "run", progress=False)
    result = measure_steps(trainer, args.steps, args.warmup)
    result.pop("runs")
    result["graphs"] = trainer.policy.decoders.graph_summary()  # CUDA graphs of the static path
    del trainer
    _free()
    return result


def run_trl(model_dir: Path, length: int, args: argparse.Namespace) -> dict[str, Any]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16 if cuda else torch.float32
    )
    total_steps = args.warmup + args.steps
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        num_generations=args.batch_size,
        max_completion_length=length,
        generation_kwargs={"min_new_tokens": length},
        temperature=1.0,
        beta=TRL_BETA,
        learning_rate=1e-4,
        max_steps=total_steps,
        bf16=cuda,
        use_cpu=not cuda,
        gradient_checkpointing=False,
        use_vllm=False,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        seed=0,
        dataloader_num_workers=0,
    )
    dataset = Dataset.from_dict({"prompt": [FIXED_PROMPT] * (args.grad_accum * total_steps * 2)})

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [digit_reward(FIXED_PROMPT, c) for c in completions]

    peft_config = LoraConfig(
        **LORA, bias="none", target_modules=lora_target_modules(model), task_type="CAUSAL_LM"
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    marks: dict[str, list[float]] = {"step": [], "generate": [], "generate_and_score": []}
    lengths: list[int] = []

    def timed(name: str, fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            _sync()
            start = time.perf_counter()
            out = fn(*a, **k)
            _sync()
            marks[name].append(time.perf_counter() - start)
            if name == "generate":
                lengths.extend(len(c) for c in out[0])
            return out

        return wrapper

    trainer._generate_single_turn = timed("generate", trainer._generate_single_turn)
    trainer._generate_and_score_completions = timed(
        "generate_and_score", trainer._generate_and_score_completions
    )

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.start = 0.0

        def on_step_begin(self, train_args: Any, state: Any, control: Any, **k: Any) -> None:
            if state.global_step == args.warmup and cuda:
                torch.cuda.reset_peak_memory_stats()
            _sync()
            self.start = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            _sync()
            marks["step"].append(time.perf_counter() - self.start)
            print(f"trl step {len(marks['step']) - 1}: {marks['step'][-1]:.3f} s", flush=True)

    trainer.add_callback(StepTimer())
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    steps = marks["step"][args.warmup :]
    # one generation (and one generate-and-score) per optimizer step: steps_per_generation = accum
    gen = marks["generate"][args.warmup :]
    gen_score = marks["generate_and_score"][args.warmup :]
    tokens_per_step = args.batch_size * args.grad_accum * length
    result = {
        "median_s": {
            "generation": statistics.median(gen),
            "rewards + reference + old log-probs": statistics.median(gen_score)
            - statistics.median(gen),
            "loss forward/backward + optimizer": statistics.median(steps)
            - statistics.median(gen_score),
            "total": statistics.median(steps),
        },
        "steps_s": steps,
        "generations_per_step": len(marks["generate"]) / len(marks["step"]),
        "completion_lengths": sorted(set(lengths)),
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / statistics.median(steps),
        "max_memory_allocated_mib": peak,
    }
    del trainer, model
    _free()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", default="llama-1b")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--lengths", default="10")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import trl

    model_dir = write_random_model(
        args.model_config, args.tokenizer, Path(tempfile.mkdtemp()) / "model"
    )
    _free()
    out: dict[str, Any] = {
        "setting": {
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": str(torch.__version__),
            "trl": trl.__version__,
            "model": args.model_config,
            "batch_size": args.batch_size,
            "grad_accum": args.grad_accum,
            "warmup": args.warmup,
            "steps": args.steps,
            "lora": LORA,
            "trl_beta": TRL_BETA,
        },
        "lengths": {},
    }
    rows = []
    for length in (int(t) for t in args.lengths.split(",")):
        batch, accum = args.batch_size, args.grad_accum
        per_length = {
            f"raptb {batch}x{accum}": run_raptb(model_dir, length, batch, accum, args),
            f"raptb {batch * accum}x1": run_raptb(model_dir, length, batch * accum, 1, args),
        }
        out["lengths"][str(length)] = per_length
        try:
            per_length["trl"] = run_trl(model_dir, length, args)
            trl_s = per_length["trl"]["median_s"]["total"]
        except Exception as exc:  # keep raptb's numbers when TRL fails on this machine
            traceback.print_exc()
            out.setdefault("trl_errors", {})[str(length)] = repr(exc)
            trl_s = float("nan")
            _free()
        for name, result in per_length.items():
            step = result["median_s"]["total"]
            rows.append(
                f"| {length} | {name} | {step * 1e3:.0f} | {result['tokens_per_s']:.0f} | "
                f"{step / trl_s:.2f} | {result['max_memory_allocated_mib'] or float('nan'):.0f} |"
            )
        if args.json is not None:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
    print("| T | trainer | step ms (median) | tokens/s | step / TRL step | peak MiB |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
