"""Static-shape decoding of the constrained rollout: a preallocated KV cache, fixed batch buckets
and, on CUDA, each token step replayed as CUDA graphs.

The rollout is ``raptb.adapters.lm.rollout``'s: the same behaviour mask, the same recorded
untempered, unmasked log-probs (``token_log_probs``) and the same random draws. Only how a step
runs differs:

- the KV cache is a transformers ``StaticCache`` of C = P + T positions (P: the longest prompt
  in tokens, shorter prompts left-padded with attention 0 and positions cumsum(mask) - 1;
  T = max_length), allocated once per (bucket, P, T) and reused by later rollouts;
- the n rows run as a bucket of B >= n rows (``bucket_rows``): rows n..B-1 and rows that have
  stopped stay in the batch, inactive, so every step has the same shapes;
- a step is two parts over fixed buffers: ``sample`` (the grammar's packed mask unpacked on the
  device, min_length, temperature, the draw, the log-probs of the drawn token and of stop, column
  k of the record) and ``forward`` (the drawn tokens through the model into the cache, the next
  prefix's logits). The draw is ``argmax(p / q)`` with q ~ Exp(1) drawn by
  ``q.exponential_(generator=...)`` over the n real rows: what ``torch.multinomial(p, 1)``
  computes, so both paths consume the generator alike and draw the same tokens;
- on CUDA each part is captured once per decoder as a CUDA graph (``torch.cuda.CUDAGraph``),
  at its second rollout, so that a shape used once (an odd prompt length) costs no capture. A
  step is then: one non-blocking copy of the packed grammar mask (pinned) to the device, the draw
  of q, two replays and one host synchronisation (the drawn tokens, which the grammar matchers
  need). The forward is replayed before the host waits, so the host accepts the tokens and fills
  the next mask in xgrammar's threads while the device runs the forward.

LoRA stays unmerged (never peft's in-place merge): the graphs read the adapter tensors where the
optimizer updates them in place, so every update is seen. Weights replaced by new tensors (moved
to another device or dtype) change the first parameter's storage, which rebuilds the decoders.
The model is in eval mode while sampling (adapter dropout off). The CUDA graphs have not yet run
on a GPU; where capturing fails the same steps run without graphs (a warning says so, and
``StaticDecoders.graph_summary`` counts it, for benchmark records).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import torch

from raptb.adapters.lm.gpu.static_decoder import StaticDecoder, StaticDecoders, bucket_rows
from raptb.adapters.lm.grammar import GrammarBatch
from raptb.adapters.lm.rollout_record import Rollout, RolloutTimings, row_temperatures
from raptb.adapters.lm.row_prompts import check_rollout_shape, row_prompt_ids


class DecodingPolicy(Protocol):
    """What the static rollout needs of ``raptb.adapters.lm.policy.HFPolicy``."""

    model: torch.nn.Module
    legal_ids: list[int]
    stop_id: int
    pad_id: int
    decoders: StaticDecoders

    @property
    def device(self) -> torch.device: ...

    def prompt_ids(self, prompt: str) -> list[int]: ...

    def check_positions(self, prompt_len: int, max_length: int) -> None: ...

    def grammar_batch(self, n: int, lane: int = 0) -> GrammarBatch | None: ...

    def row_text(self, row: Sequence[int]) -> str: ...


@torch.no_grad()
def static_rollout(
    policy: DecodingPolicy,
    prompt: str | Sequence[str],
    n: int,
    *,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor = 1.0,
    generator: torch.Generator | None = None,
) -> Rollout:
    """``sample_rollout`` on the static path (module docstring): ``n`` constrained trajectories,
    ``prompt`` one text for every row or n texts, one per row (left-padded to the longest)."""
    check_rollout_shape(n, min_length, max_length)
    start = time.perf_counter()
    model_s = grammar_s = 0.0
    prompts = row_prompt_ids(policy.prompt_ids, prompt, n)
    prompt_len = max(len(ids) for ids in prompts)
    policy.check_positions(prompt_len, max_length)
    temp = row_temperatures(temperature, n)
    decoder = _decoder(policy, n, prompt_len, max_length)
    grammar = policy.grammar_batch(n)
    was_training = policy.model.training
    policy.model.eval()
    try:
        tic = time.perf_counter()
        decoder.start(prompts, temp, min_length)
        if decoder.wants_capture():
            decoder.capture()
            decoder.start(prompts, temp, min_length)
        model_s += time.perf_counter() - tic
        # on CUDA the forward runs on the device while the host fills the next grammar mask
        overlap = decoder.cuda
        rows = list(range(n))
        if grammar is not None:
            grammar.reset()
        for _ in range(max_length):
            if grammar is not None:
                tic = time.perf_counter()
                packed = grammar.fill_bitmask(rows)
                decoder.packed[:n].copy_(packed, non_blocking=True)
                grammar_s += time.perf_counter() - tic
            decoder.noise[:n].exponential_(1, generator=generator)
            decoder.sample()
            decoder.request_moved()
            tic = time.perf_counter()
            if overlap:
                decoder.forward()
            moved = decoder.moved_rows(n)
            rows = [row for row, token in enumerate(moved) if token >= 0]
            model_s += time.perf_counter() - tic
            if not rows:
                break
            if grammar is not None:
                tic = time.perf_counter()
                accepted = grammar.accept_many(rows, [moved[row] for row in rows])
                grammar_s += time.perf_counter() - tic
                if not all(accepted):
                    raise RuntimeError("grammar matcher rejected a token its own mask allowed")
            if not overlap:
                tic = time.perf_counter()
                decoder.forward()
                model_s += time.perf_counter() - tic
        else:
            decoder.finish()
    finally:
        policy.model.train(was_training)

    tokens = decoder.tokens[:n].clone()
    length = decoder.length[:n].clone()
    log_pf, log_pterm = decoder.log_pf[:n].clone(), decoder.log_pterm[:n].clone()
    kept = [tuple(row[:tau]) for row, tau in zip(tokens.tolist(), length.tolist(), strict=True)]
    timings = RolloutTimings(model_s, grammar_s, time.perf_counter() - start)
    texts = [policy.row_text(row) for row in kept]
    return Rollout(tokens, length, log_pf, log_pterm, texts, kept, timings)


@torch.no_grad()
def static_logits(
    policy: DecodingPolicy,
    prompt_rows: Sequence[Sequence[int]],
    tokens: torch.Tensor,
    max_length: int,
) -> torch.Tensor:
    """The logits [n, V] (float32) that ``static_rollout`` of ``max_length`` reads at column k
    after each row's prompt ids ``prompt_rows`` and ``tokens`` [n, k] (its first k columns,
    ``pad_id`` after a stop): the same decoder (bucket, prompt positions, cache length) fed
    ``tokens`` (``StaticDecoder.forced_logits``)."""
    decoder = _decoder(policy, len(prompt_rows), max(map(len, prompt_rows)), max_length)
    was_training = policy.model.training
    policy.model.eval()
    try:
        return decoder.forced_logits(prompt_rows, tokens)
    finally:
        policy.model.train(was_training)


def _decoder(policy: DecodingPolicy, n: int, prompt_len: int, max_length: int) -> StaticDecoder:
    """The policy's decoder of n rows' bucket, ``prompt_len`` prompt positions, ``max_length``."""
    sub_ids = torch.tensor(
        [*policy.legal_ids, policy.stop_id], dtype=torch.long, device=policy.device
    )
    return policy.decoders.get(
        policy.model,
        bucket_rows(n),
        prompt_len,
        max_length,
        sub_ids,
        stop_id=policy.stop_id,
        pad_id=policy.pad_id,
    )
