"""Time the SMILES pipeline: constrained rollout, one training micro-batch, RDKit prefix scoring.

Usage (from the repository root):

    python benchmarks/smiles.py [--model smollm2-135m] [--threads 1] [--repeats 3] [--markdown]
    python benchmarks/smiles.py --model llama-1b-random --tokenizer DIR   # GPU, bf16
    python benchmarks/smiles.py ... --grammar-threads 1,8   # mask filling with 1 and 8 threads

For the model (with LoRA r16 on every projection, as in training) and B = 32 rows, T = 10:

- rollout with and without the SMILES grammar masks: wall time, generated tokens per second
  (tokens before the stop), and the grammar's share of the rollout (mask filling + accepting);
- one micro-batch as the trainer runs it: rollout + reference forward (adapter disabled) +
  teacher-forced forward and backward;
- RDKit per prefix: ``SmilesTask.score`` (merge, sanitised parse, QED) and ``item_features``
  (canonical SMILES + packed Morgan fingerprint) on every prefix of the sampled fragments, with a
  fresh task so that nothing is memoised.

``llama-1b-random`` is a Llama-3.2-1B-shaped model (16 layers, width 2048, 32 heads, 8 KV heads,
MLP 8192) with random weights over the tokenizer given by ``--tokenizer`` (e.g. SmolLM2's, saved
with ``save_pretrained``); it runs in bf16 on a GPU that supports it. Reports medians over
``--repeats`` after one warm-up.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time

import torch

from raptb.adapters.lm.lora import apply_lora, preferred_dtype
from raptb.adapters.lm.models import load_model_and_tokenizer
from raptb.adapters.lm.policy import HFPolicy, default_grammar_threads
from raptb.adapters.lm.tokens import legal_token_ids, stop_token_id
from raptb.adapters.tasks.smiles.task import SmilesTask

LLAMA_1B = "llama-1b-random"


def build_model(name: str, tokenizer_dir: str | None, device: torch.device) -> tuple:
    dtype = preferred_dtype(device)
    if name != LLAMA_1B:
        model, tokenizer = load_model_and_tokenizer(name, dtype=dtype)
        return model.to(device), tokenizer
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if tokenizer_dir is None:
        raise SystemExit(f"--tokenizer DIR is required with --model {LLAMA_1B}")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model, tokenizer


def median_time(fn, repeats: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    fn()  # warm-up: grammar compilation, kernels, allocator
    times, result = [], None
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--grammar-threads",
        default="auto",
        help="comma-separated xgrammar thread counts to time the grammar rollout with; 'auto' is "
        "the trainer's rule (min(8, cores) on CUDA, 1 on CPU)",
    )
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    task = SmilesTask()
    prompt = task.prompts()[0]
    model, tokenizer = build_model(args.model, args.tokenizer, device)
    model = apply_lora(model, rank=16)
    stop = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, task.alphabet, stop_id=stop)
    generator = torch.Generator(device=device).manual_seed(0)
    rows: list[tuple[str, str]] = []
    texts: list[str] = []
    if args.grammar_threads == "auto":
        grammar_threads = [default_grammar_threads(device)]
    else:
        grammar_threads = [int(t) for t in args.grammar_threads.split(",")]
    runs = [(task.grammar, t) for t in grammar_threads] + [(None, 1)]
    for grammar, n_threads in runs:
        policy = HFPolicy(
            model,
            tokenizer,
            legal_ids=legal,
            stop_id=stop,
            grammar=grammar,
            grammar_threads=n_threads,
        )

        def rollout(policy: HFPolicy = policy):  # type: ignore[no-untyped-def]
            return policy.sample(
                prompt,
                args.batch,
                min_length=task.min_length,
                max_length=task.max_length,
                generator=generator,
            )

        def micro_batch(policy: HFPolicy = policy) -> None:
            out = rollout(policy)
            policy.reference_score(prompt, out.tokens, out.length)
            model.train()
            log_pf, log_pterm = policy.score(prompt, out.tokens, out.length)
            (log_pf.sum() + log_pterm.sum()).backward()
            model.zero_grad(set_to_none=True)

        seconds, out = median_time(rollout, args.repeats)
        share = out.timings.grammar_s / out.timings.total_s
        tokens = int(out.length.sum())
        micro, _ = median_time(micro_batch, args.repeats)
        label = (
            f"grammar ({n_threads} thread{'s' if n_threads > 1 else ''}) + legal tokens"
            if grammar
            else "legal tokens only"
        )
        rows.append(
            (
                f"rollout, {label}",
                f"{seconds * 1e3:.0f} ms; {tokens / seconds:.0f} tok/s; grammar share "
                f"{share:.1%}; micro-batch {micro:.2f} s",
            )
        )
        if grammar:
            texts = out.texts
    prefixes = sorted({t[:k] for t in texts for k in range(1, len(t) + 1)})
    fresh = SmilesTask()
    start = time.perf_counter()
    for p in prefixes:
        fresh.score(prompt, p)
    score_us = (time.perf_counter() - start) / len(prefixes) * 1e6
    fresh = SmilesTask()
    start = time.perf_counter()
    for p in prefixes:
        fresh.item_features(prompt, p)
    feature_us = (time.perf_counter() - start) / len(prefixes) * 1e6
    rows.append(("RDKit score per prefix", f"{score_us:.0f} us over {len(prefixes)} prefixes"))
    rows.append(("RDKit fingerprint + canonical per prefix", f"{feature_us:.0f} us"))

    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu"
    header = (
        f"{args.model} + LoRA r16, {device.type} ({name}), {preferred_dtype(device)}, "
        f"threads {torch.get_num_threads()}, B={args.batch}, T={task.max_length}, "
        f"{len(legal)} legal of {len(tokenizer)} tokens; "
        f"{datetime.date.today().isoformat()}, torch {torch.__version__}"
    )
    if args.markdown:
        print(f"{header}\n\n| measure | value |\n|---|---|")
        for key, value in rows:
            print(f"| {key} | {value} |")
    else:
        print(header)
        for key, value in rows:
            print(f"{key:45s} {value}")


if __name__ == "__main__":
    main()
