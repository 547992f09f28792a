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

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import torch
from transformers import StaticCache

from raptb.adapters.lm.grammar import GrammarBatch, packed_width, unpack_bitmask
from raptb.adapters.lm.kv_cache import cache_keyword
from raptb.adapters.lm.rollout_record import (
    Rollout,
    RolloutTimings,
    row_temperatures,
    token_log_probs,
)
from raptb.adapters.lm.row_prompts import check_rollout_shape, row_prompt_ids

_log = logging.getLogger(__name__)

DecodeMode = Literal["auto", "eager", "static"]
DECODE_MODES: tuple[DecodeMode, ...] = ("auto", "eager", "static")
MAX_DECODERS = 4
"""Decoders (cache + buffers + graphs) a policy keeps; the least recently used goes first."""


def resolve_decode(mode: str, device: torch.device, *, sharded: bool) -> Literal["eager", "static"]:
    """The decoding path of ``mode`` on ``device``: ``auto`` is static on CUDA and eager elsewhere;
    a model sharded across processes (whose forwards are collectives) always decodes eagerly."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode: expected one of {', '.join(DECODE_MODES)}, got {mode!r}")
    if sharded or mode == "eager":
        return "eager"
    if mode == "auto":
        return "static" if device.type == "cuda" else "eager"
    return "static"


def bucket_rows(n: int) -> int:
    """Rows B >= n of the decoder that runs n rows: n rounded up to a multiple of 8 up to 64, of
    32 above, so that a few decoders (and graphs) serve every batch size."""
    step = 8 if n <= 64 else 32
    return -(-n // step) * step


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

    def grammar_batch(self, n: int) -> GrammarBatch | None: ...

    def row_text(self, row: Sequence[int]) -> str: ...


class StaticDecoder:
    """Cache, buffers and (on CUDA) graphs of one bucket: B rows, P prompt positions, T steps, over
    the sub-vocabulary ``sub_ids`` (S = L + 1 ids: the legal ids, then stop).

    Record buffers (valid for the first n rows after a rollout): ``tokens`` long [B, T],
    ``length`` long [B], ``log_pf`` float32 [B, T], ``log_pterm`` float32 [B, T + 1].
    """

    def __init__(
        self,
        model: torch.nn.Module,
        rows: int,
        prompt_len: int,
        max_length: int,
        sub_ids: torch.Tensor,
        *,
        stop_id: int,
        pad_id: int,
    ) -> None:
        device = sub_ids.device
        self.model = model
        self.rows, self.prompt_len, self.max_length = rows, prompt_len, max_length
        self.sub_ids, self.stop_id, self.pad_id = sub_ids, stop_id, pad_id
        width = len(sub_ids)
        self.cache = StaticCache(config=model.config, max_cache_len=prompt_len + max_length)
        self.cache_keyword = cache_keyword(model)
        self.attention = torch.ones(rows, prompt_len + max_length, dtype=torch.long, device=device)
        self.input_ids = torch.full((rows, 1), pad_id, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.logits: torch.Tensor | None = None  # [B, V] in the model's dtype, from the prefill
        self.packed = torch.full((rows, packed_width(width)), -1, dtype=torch.int32, device=device)
        self.noise = torch.ones(rows, width, device=device)
        self.temp = torch.ones(rows, device=device)
        self.active = torch.zeros(rows, dtype=torch.bool, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.min_length = torch.zeros((), dtype=torch.long, device=device)
        self.tokens = torch.full((rows, max_length), pad_id, dtype=torch.long, device=device)
        self.length = torch.full((rows,), max_length, dtype=torch.long, device=device)
        self.log_pf = torch.zeros(rows, max_length, device=device)
        self.log_pterm = torch.zeros(rows, max_length + 1, device=device)
        self.moved = torch.full((rows,), -1, dtype=torch.long, device=device)
        self.cuda = device.type == "cuda"
        self.moved_host = torch.empty(rows, dtype=torch.long, pin_memory=self.cuda)
        self.moved_ready = torch.cuda.Event() if self.cuda else None
        self.graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None
        self.graphs_failed = False
        self.capture_error: str | None = None
        self.rollouts = 0

    def start(
        self,
        prompts: Sequence[Sequence[int]],
        temp: torch.Tensor,
        min_length: int,
    ) -> None:
        """Reset the record and the cache and run the prompts through the model: ``prompts`` holds
        the token ids of each of the n <= B rows (at most P each), ``temp`` float32 [n]."""
        n, big_p = len(prompts), self.prompt_len
        device = self.attention.device
        ids = torch.full((self.rows, big_p), self.pad_id, dtype=torch.long)
        attention = torch.ones(self.rows, self.attention.shape[1], dtype=torch.long)
        # rows n..B-1 repeat the first prompt: they are never active, but must attend somewhere
        for row in range(self.rows):
            prompt = prompts[row] if row < n else prompts[0]
            ids[row, big_p - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention[row, : big_p - len(prompt)] = 0
        positions = (attention[:, :big_p].cumsum(dim=1) - 1).clamp(min=0)
        self.attention.copy_(attention)
        self.position_ids.copy_(positions[:, -1:] + 1)
        self.cache.reset()
        out = self.model(
            input_ids=ids.to(device),
            attention_mask=self.attention,
            position_ids=positions.to(device),
            **{self.cache_keyword: self.cache},
            use_cache=True,
        )
        if self.logits is None:
            self.logits = torch.empty_like(out.logits[:, -1, :])
        self.logits.copy_(out.logits[:, -1, :])
        self.temp.fill_(1.0)
        self.temp[:n] = temp.to(device)
        self.active.fill_(False)
        self.active[:n] = True
        self.step.zero_()
        self.min_length.fill_(min_length)
        self.rollouts += 1
        self.tokens.fill_(self.pad_id)
        self.length.fill_(self.max_length)
        self.log_pf.zero_()
        self.log_pterm.zero_()
        self.packed.fill_(-1)
        self.noise.fill_(1.0)

    def _sample_part(self) -> None:
        """Column ``step`` of the record from ``logits``, ``packed`` and ``noise``; the drawn tokens
        into ``input_ids`` and ``moved`` (-1 where the row does not move). Graph-safe: fixed
        buffers, no host synchronisation."""
        assert self.logits is not None
        num_legal = len(self.sub_ids) - 1
        mask = unpack_bitmask(self.packed, num_legal + 1)
        allowed = mask[:, :num_legal]
        can_stop = mask[:, num_legal] & (self.step >= self.min_length)
        # a dead end (nothing allowed, stop not allowed) stops rather than failing
        can_stop |= ~allowed.any(dim=1)
        can_stop |= ~self.active
        sub_mask = torch.cat([allowed & self.active[:, None], can_stop[:, None]], dim=1)
        behaviour = self.logits[:, self.sub_ids].float() / self.temp[:, None]
        behaviour = behaviour.masked_fill(~sub_mask, float("-inf"))
        # torch.multinomial(p, 1) is argmax(p / q) with q ~ Exp(1): the same draw, noise given
        choice = torch.argmax(torch.softmax(behaviour, dim=1) / self.noise, dim=1)
        stops = self.active & (choice == num_legal)
        moves = self.active & ~stops
        step_tokens = torch.where(moves, self.sub_ids[choice], self.pad_id)
        token_lp, stop_lp = token_log_probs(self.logits, step_tokens, self.stop_id)
        column = self.step.view(1)
        self.log_pterm.index_copy_(1, column, torch.where(self.active, stop_lp, 0.0)[:, None])
        self.log_pf.index_copy_(1, column, torch.where(moves, token_lp, 0.0)[:, None])
        self.tokens.index_copy_(1, column, step_tokens[:, None])
        self.length.copy_(torch.where(stops, self.step, self.length))
        self.active.copy_(moves)
        self.input_ids.copy_(step_tokens[:, None])
        self.moved.copy_(torch.where(moves, step_tokens, -1))
        self.step.add_(1)

    def _forward_part(self) -> None:
        """``input_ids`` through the model at the next cache position; ``logits`` of the next
        prefix. Graph-safe (the static cache advances its own device-side length)."""
        assert self.logits is not None
        out = self.model(
            input_ids=self.input_ids,
            attention_mask=self.attention,
            position_ids=self.position_ids,
            **{self.cache_keyword: self.cache},
            use_cache=True,
        )
        self.logits.copy_(out.logits[:, -1, :])
        self.position_ids.add_(1)

    def wants_capture(self) -> bool:
        """Whether ``capture`` would capture now: on CUDA only, from the decoder's second rollout
        on, once (a failed capture is not retried), and only if there are steps to capture."""
        return (
            self.cuda
            and self.graphs is None
            and not self.graphs_failed
            and self.rollouts > 1
            and self.max_length > 0
        )

    def capture(self) -> None:
        """Capture both parts as CUDA graphs (when ``wants_capture``; after a ``start``). Warming
        up and capturing spoil the rollout's state even when capturing fails: ``start`` again."""
        if not self.wants_capture():
            return
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # one eager step first: lazy initialisations
                self._sample_part()
                self._forward_part()
            torch.cuda.current_stream().wait_stream(side)
            sample, forward = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(sample):
                self._sample_part()
            with torch.cuda.graph(forward):
                self._forward_part()
            self.graphs = (sample, forward)
        except RuntimeError as exc:
            self.graphs_failed = True
            self.capture_error = f"{type(exc).__name__}: {exc}"
            _log.warning("static decode: CUDA graph capture failed (%s); stepping without", exc)

    def sample(self) -> None:
        """One ``sample`` part: a graph replay on CUDA, the operations themselves elsewhere."""
        if self.graphs is not None:
            self.graphs[0].replay()
        else:
            self._sample_part()

    def forward(self) -> None:
        """One ``forward`` part: a graph replay on CUDA, the operations themselves elsewhere."""
        if self.graphs is not None:
            self.graphs[1].replay()
        else:
            self._forward_part()

    def request_moved(self) -> None:
        """Start copying ``moved`` to the host (non-blocking from the device to pinned memory)."""
        if self.moved_ready is not None:
            self.moved_host.copy_(self.moved, non_blocking=True)
            self.moved_ready.record()

    def moved_rows(self, n: int) -> list[int]:
        """The step's one host synchronisation: the token each of the first n rows moved by, -1
        where it did not move (after ``request_moved``)."""
        if self.moved_ready is not None:
            self.moved_ready.synchronize()
            return self.moved_host[:n].tolist()
        return self.moved[:n].tolist()

    def finish(self) -> None:
        """Column T of ``log_pterm``: the stop log-prob of the rows still active at max_length."""
        assert self.logits is not None
        _, stop_lp = token_log_probs(
            self.logits, torch.full_like(self.length, self.stop_id), self.stop_id
        )
        self.log_pterm[:, self.max_length] = torch.where(self.active, stop_lp, 0.0)


class StaticDecoders:
    """A policy's decoders by (bucket rows, prompt positions, max_length), at most
    ``MAX_DECODERS``; all dropped when the model, or its first parameter's storage, changes."""

    def __init__(self) -> None:
        self._decoders: OrderedDict[tuple[int, int, int], StaticDecoder] = OrderedDict()
        self._weights: tuple[int, int] | None = None

    def get(
        self,
        model: torch.nn.Module,
        rows: int,
        prompt_len: int,
        max_length: int,
        sub_ids: torch.Tensor,
        *,
        stop_id: int,
        pad_id: int,
    ) -> StaticDecoder:
        """The decoder of ``rows`` x (``prompt_len`` + ``max_length``), built on first use."""
        weights = (id(model), next(model.parameters()).data_ptr())
        if weights != self._weights:
            self._decoders.clear()
            self._weights = weights
        key = (rows, prompt_len, max_length)
        if key not in self._decoders:
            self._decoders[key] = StaticDecoder(
                model, rows, prompt_len, max_length, sub_ids, stop_id=stop_id, pad_id=pad_id
            )
            while len(self._decoders) > MAX_DECODERS:
                self._decoders.popitem(last=False)
        self._decoders.move_to_end(key)
        return self._decoders[key]

    def graph_summary(self) -> dict[str, Any]:
        """Of the decoders kept: how many there are, how many run as captured CUDA graphs, how
        many failed to capture, and the first failure's error (for benchmark records)."""
        decoders = list(self._decoders.values())
        errors = [d.capture_error for d in decoders if d.capture_error is not None]
        return {
            "decoders": len(decoders),
            "captured": sum(d.graphs is not None for d in decoders),
            "failed": sum(d.graphs_failed for d in decoders),
            "error": errors[0] if errors else None,
        }


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
    device = policy.device
    prompts = row_prompt_ids(policy.prompt_ids, prompt, n)
    prompt_len = max(len(ids) for ids in prompts)
    policy.check_positions(prompt_len, max_length)
    temp = row_temperatures(temperature, n)
    sub_ids = torch.tensor([*policy.legal_ids, policy.stop_id], dtype=torch.long, device=device)
    decoder = policy.decoders.get(
        policy.model,
        bucket_rows(n),
        prompt_len,
        max_length,
        sub_ids,
        stop_id=policy.stop_id,
        pad_id=policy.pad_id,
    )
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
