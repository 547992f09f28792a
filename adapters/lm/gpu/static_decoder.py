"""The static decoder of one bucket (B rows, P prompt positions, T steps): its ``StaticCache``,
fixed buffers and, on CUDA, the two parts of a token step captured as CUDA graphs; and a
policy's decoders by bucket (``StaticDecoders``). The step loop that drives them, and the design,
are in ``raptb.adapters.lm.gpu.static_decode``."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from transformers import StaticCache

from raptb.adapters.lm.grammar import packed_width, unpack_bitmask
from raptb.adapters.lm.kv_cache import cache_keyword
from raptb.adapters.lm.rollout_record import token_log_probs

_log = logging.getLogger(__name__)

MAX_DECODERS = 4
"""Decoders (cache + buffers + graphs) a policy keeps; the least recently used goes first."""


def bucket_rows(n: int) -> int:
    """Rows B >= n of the decoder that runs n rows: n rounded up to a multiple of 8 up to 64, of
    32 above, so that a few decoders (and graphs) serve every batch size."""
    step = 8 if n <= 64 else 32
    return -(-n // step) * step


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

    def forced_logits(self, prompts: Sequence[Sequence[int]], tokens: torch.Tensor) -> torch.Tensor:
        """The logits [n, V] (float32) a rollout reads at column k after ``prompts`` (n <= B
        rows) and ``tokens`` [n, k] (its first k columns: ``pad_id`` after a stop), by the
        rollout's own forwards (a ``start``, then ``forward`` fed each column), so that a draw
        at column k can be re-examined (``adapters.lm.gpu.decode_agreement``). Spoils the record."""
        n = len(prompts)
        self.start(prompts, torch.ones(n), 0)
        for column in tokens.to(self.input_ids.device).T:
            self.input_ids.fill_(self.pad_id)
            self.input_ids[:n, 0] = column
            self.forward()
        assert self.logits is not None
        return self.logits[:n].float().clone()

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
