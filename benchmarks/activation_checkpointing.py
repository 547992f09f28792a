"""The cost of activation checkpointing (``[optim] gradient_checkpointing``): one rescoring
forward + backward of a random Llama-shaped model with and without it, side by side in one
process, full fine-tuning and LoRA.

For each setting the same trajectories are rescored by ``HFPolicy.score`` (the trainer's
teacher-forced pass) and a squared-TB-like loss of the log-probs is backpropagated; the two
variants alternate, so load on the machine hits both alike. Reported: the median seconds of
forward + backward, their ratio, and the bytes of activations the forward keeps for backward
(tensors saved for backward other than parameters, counted with saved_tensors_hooks).

    python benchmarks/activation_checkpointing.py [--repeats 5] [--batch 16] [--length 24]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.models import build_char_tokenizer
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.tokens import legal_token_ids

TOKENIZER = build_char_tokenizer()
PROMPT = "Generate:"


def _policy(lora: int, checkpointing: bool, width: int, depth: int) -> HFPolicy:
    config = LlamaConfig(
        vocab_size=len(TOKENIZER),
        hidden_size=width,
        intermediate_size=width * 8 // 3,
        num_hidden_layers=depth,
        num_attention_heads=width // 32,
        num_key_value_heads=width // 64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model: torch.nn.Module = LlamaForCausalLM(config)
    if lora:
        model = apply_lora(model, rank=lora, dropout=0.0)
    model.train()
    stop = TOKENIZER.eos_token_id
    legal = legal_token_ids(TOKENIZER, "abcdefghij", stop_id=stop)
    policy = HFPolicy(model, TOKENIZER, legal_ids=legal, stop_id=stop)
    if checkpointing:
        policy.enable_activation_checkpointing()
    return policy


def _step(policy: HFPolicy, tokens: torch.Tensor, length: torch.Tensor) -> tuple[float, int]:
    """Seconds of one rescoring forward + backward, and the activation bytes kept for backward."""
    policy.model.zero_grad(set_to_none=True)
    kept: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            kept.append(tensor.numel() * tensor.element_size())
        return tensor

    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        log_pf, log_pterm = policy.score(PROMPT, tokens, length)
    loss = (log_pf.sum(dim=1) + log_pterm.logsumexp(dim=1)).square().mean()
    loss.backward()
    return time.perf_counter() - start, sum(kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}; "
        f"Llama width {args.width}, depth {args.depth}, batch {args.batch} x "
        f"{args.length} tokens (+ prompt)"
    )
    print("| setting | median s without | median s with | with / without | kept MiB without "
          "| kept MiB with |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for lora in (0, 16):
        plain = _policy(lora, False, args.width, args.depth)
        checked = _policy(lora, True, args.width, args.depth)
        rollout = plain.sample(
            PROMPT,
            args.batch,
            min_length=args.length,
            max_length=args.length,
            generator=torch.Generator().manual_seed(0),
        )
        runs: dict[bool, list[tuple[float, int]]] = {False: [], True: []}
        for _ in range(args.repeats + 1):  # the first round warms up and is dropped
            for flag, policy in ((False, plain), (True, checked)):
                runs[flag].append(_step(policy, rollout.tokens, rollout.length))
        seconds = {flag: statistics.median(s for s, _ in runs[flag][1:]) for flag in runs}
        kept = {flag: runs[flag][-1][1] / 2**20 for flag in runs}
        name = f"LoRA r{lora}" if lora else "full fine-tuning"
        print(
            f"| {name} | {seconds[False]:.3f} | {seconds[True]:.3f} | "
            f"{seconds[True] / seconds[False]:.2f} | {kept[False]:.1f} | {kept[True]:.1f} |"
        )


if __name__ == "__main__":
    main()
