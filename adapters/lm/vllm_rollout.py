"""The constrained rollout drawn by a vLLM engine in this process (``sampling.decode = "vllm"``).

The rows are those of ``raptb.adapters.lm.rollout``'s behaviour (its docstring states the mask),
asked of vLLM as one request per row (each row its own prompt and temperature): the legal tokens
and the stop (``allowed_token_ids``), the task's grammar verbatim (structured output, xgrammar
EBNF), ``min_tokens`` = min_length, ``max_tokens`` = max_length, the stop token ends a row
(``stop_token_ids``). Each request's seed is drawn from the rollout's generator, so a seed gives
the same rows. The prompt ids are the policy's (``prompt_ids``), so vLLM decodes from the same
tokens as the trainer.

The recorded ``log_pf`` and ``log_pterm`` are vLLM's own raw log-probabilities, the log-softmax
of the model's logits over the whole vocabulary (untempered, unmasked: what the eager path
records): each request asks ``logprob_token_ids = [stop]`` (the drawn token's and the stop's at
every position) and one token past ``max_length``, so that a row reaching max_length has its
stop's log-probability after its last token (the extra token is dropped; one more engine step
where a row is full). vLLM 0.32 masks the
logits by the grammar before its sampler takes raw log-probabilities (``sample_tokens`` of its
model runner), which would normalise them over the grammar's tokens and make the stop's -inf
wherever the grammar forbids it; the engine applies that mask inside the sampler instead, after
the raw log-probabilities and before the allowed tokens, min_tokens, the temperature and the draw
(``_grammar_after_raw_log_probs``), so the draw is unchanged. The record equals the trainer's
teacher-forced scoring (``HFPolicy.score`` in eval mode) up to the kernels' float rounding, with no
second forward; the objectives rescore every row anyway.

The engine follows the trainer's weights: before each rollout, the parameters whose version
counter moved since the last sync (an optimizer step, a checkpoint load) are sent as the
checkpoint's tensors (``merged_weights``: a peft LoRA layer as its base weight plus the adapter's
delta, the model itself never merged in place) through vLLM's ``reload_weights``; with tied
embeddings the output layer's packed copy on the CPU is packed again (``_repack_tied_head``),
and the prefix cache is dropped. The engine runs in float32 where the trainer does, eager mode
(no compilation: its start costs seconds, not minutes), ``VLLM_CPU_KVCACHE_SPACE`` 1 GiB on a
CPU unless set, 30% of a GPU beside the trainer.

In-process, vLLM's CPU worker replaces ``torch.set_num_threads`` by a no-op for the whole process:
the threads set before the engine starts (``threads``: the trainer sets them first) stay in force
for trainer and engine alike (benchmarks/vllm.md).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from raptb.adapters.lm.decode_mode import VLLM_INSTALL, vllm_installed
from raptb.adapters.lm.rollout_record import Rollout, RolloutTimings, row_temperatures
from raptb.adapters.lm.row_prompts import check_rollout_shape, row_prompt_ids

MAX_TEMPERATURE = 2.0
"""vLLM's sampler refuses hotter rows."""
GPU_MEMORY_UTILIZATION = 0.3
"""The engine's share of a GPU it shares with the trainer (TRL's colocate default)."""
MAX_MODEL_LEN = 4096
"""The engine's context at most (the model's positions where fewer): the KV cache must hold one."""
LOGPROBS_MODE = "raw_logprobs"
"""The engine's log-probabilities: the model's log-softmax before any processor, temperature
included (vLLM's default, named so that a change of default cannot change the record)."""


def weight_versions(model: torch.nn.Module) -> tuple[int, ...]:
    """The version counters of ``model``'s parameters: an in-place update (an optimizer step,
    ``load_state_dict``) moves them."""
    return tuple(p._version for p in model.parameters())


def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor, list[int]]]:
    """``(name, tensor, parameter ids)`` of ``model`` as its checkpoint names them (a peft model
    as its base model): each LoRA layer's weight as base weight + the active adapters' deltas
    (``get_delta_weight``: the scaling, and GPT-2's transposed layout, peft's), never merged in
    place; each other parameter as it is. The ids name the parameters the tensor is made of."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    skip: list[str] = []
    for name, module in inner.named_modules():
        if any(name.startswith(prefix) for prefix in skip):
            continue
        if isinstance(module, BaseTunerLayer):
            skip.append(f"{name}.")
            base = module.get_base_layer()
            weight = base.weight.detach()
            sources = [id(base.weight)]
            if not module.disable_adapters and not module.merged:
                for adapter in module.active_adapters:
                    weight = weight + module.get_delta_weight(adapter).detach()
                    sources += [id(p) for p in module.parameters() if p is not base.weight]
            yield f"{name}.weight", weight, sources
            if getattr(base, "bias", None) is not None:
                yield f"{name}.bias", base.bias.detach(), [id(base.bias)]
            continue
        for param_name, param in module.named_parameters(recurse=False):
            yield f"{name}.{param_name}" if name else param_name, param.detach(), [id(param)]


def _repack_tied_head(worker: Any) -> None:
    """On vLLM's worker: pack the output layer again when it shares the embedding's weight (the
    CPU build keeps a packed copy per layer, and the reload only repacks the embedding's)."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    config = getattr(model, "config", None)
    if head is not None and getattr(config, "tie_word_embeddings", False):
        head.quant_method.process_weights_after_loading(head)


def _grammar_after_raw_log_probs(worker: Any) -> None:
    """On vLLM's worker: apply the grammar's mask inside the sampler, once it has taken the raw
    log-probabilities (before the allowed tokens, min_tokens, the temperature and the draw), not
    before it as vLLM 0.32's ``sample_tokens`` does (module docstring). Installed once."""
    from vllm.v1.structured_output.utils import apply_grammar_bitmask

    runner = worker.model_runner
    if getattr(runner, "raptb_grammar_after_raw", False):
        return
    sample_tokens, sampler = runner.sample_tokens, runner.sampler
    processors = sampler.apply_logits_processors
    pending: list[tuple[Any, Any]] = []

    def late_sample_tokens(grammar_output: Any) -> Any:
        state = runner.execute_model_state
        if grammar_output is not None and state is not None:
            pending.append((state.scheduler_output, grammar_output))
            grammar_output = None
        try:
            return sample_tokens(grammar_output)
        finally:
            pending.clear()

    def masked_processors(logits: torch.Tensor, metadata: Any, bonus: bool) -> torch.Tensor:
        if pending:
            apply_grammar_bitmask(*pending.pop(), runner.input_batch, logits)
        return processors(logits, metadata, bonus)

    runner.sample_tokens = late_sample_tokens
    sampler.apply_logits_processors = masked_processors
    runner.raptb_grammar_after_raw = True


def _shield_llvmlite() -> None:
    """vLLM 0.32's kernel scan (``vllm.triton_utils.dispatcher``) calls ``vars(x).get`` on every
    module global that answers ``__dict__``; llvmlite's lazily loaded library (Numba's, loaded
    here) answers it with a C-function wrapper and the engine fails to start. Its table of
    functions gets a real, empty ``__dict__`` entry, which no C function is named."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is not None:
        ffi.lib._fntab.setdefault("__dict__", {})


class VLLMEngine:
    """A vLLM ``LLM`` of ``model``'s current weights, in this process, kept in sync with it."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, seed: int = 0) -> None:
        if not vllm_installed():
            raise ValueError(f"decode: vllm is not installed; {VLLM_INSTALL}")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        device = next(model.parameters()).device
        if device.type == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        try:
            from vllm import LLM
        except ImportError as exc:  # e.g. CUDA builds of torchvision beside a CPU torch
            raise ValueError(f"decode: vllm does not import ({exc}); {VLLM_INSTALL}") from exc
        _shield_llvmlite()
        self.model = model
        self.folder = tempfile.TemporaryDirectory(prefix="raptb-vllm-")
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        weights = {name: tensor for name, tensor, _ in merged_weights(model)}
        inner.save_pretrained(self.folder.name, state_dict=weights)
        tokenizer.save_pretrained(self.folder.name)
        self.versions = self._versions()
        positions = getattr(inner.config, "max_position_embeddings", None) or MAX_MODEL_LEN
        dtype = next(model.parameters()).dtype
        self.max_model_len = min(positions, MAX_MODEL_LEN)
        self.llm = LLM(
            model=self.folder.name,
            dtype=str(dtype).removeprefix("torch."),
            seed=seed,
            max_model_len=self.max_model_len,
            enforce_eager=True,
            gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
            logprobs_mode=LOGPROBS_MODE,
        )
        self.llm.collective_rpc(_grammar_after_raw_log_probs)
        self.syncs = 0
        self.sync_s = 0.0

    def _versions(self) -> dict[int, int]:
        return {id(p): p._version for p in self.model.parameters()}

    @torch.no_grad()
    def sync(self) -> int:
        """Send the tensors whose parameters changed since the last sync; their count."""
        versions = self._versions()
        moved = {key for key, version in versions.items() if self.versions.get(key) != version}
        if not moved:
            return 0
        tic = time.perf_counter()
        changed = [
            (name, tensor.contiguous())
            for name, tensor, sources in merged_weights(self.model)
            if moved.intersection(sources)
        ]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(changed)})
        self.llm.collective_rpc(_repack_tied_head)
        self.llm.reset_prefix_cache()
        self.versions = versions
        self.syncs += 1
        self.sync_s += time.perf_counter() - tic
        return len(changed)

    def prompt_log_probs(self, rows: Sequence[Sequence[int]]) -> list[list[float]]:
        """The engine's log-probability of each token of each row after its predecessors (the
        raw model's, untempered: ``prompt_logprobs``), row by row; for a test of the sync."""
        from vllm import SamplingParams, TokensPrompt

        self.sync()
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(row)) for row in rows], params, use_tqdm=False
        )
        return [
            [next(iter(lp.values())).logprob for lp in out.prompt_logprobs[1:]] for out in outputs
        ]


_ENGINES: weakref.WeakKeyDictionary[Any, VLLMEngine] = weakref.WeakKeyDictionary()


def engine_of(policy: Any) -> VLLMEngine:
    """The engine of ``policy`` (an ``HFPolicy``), started on first use, synced to its weights."""
    engine = _ENGINES.get(policy)
    if engine is None or engine.model is not policy.model:
        engine = _ENGINES[policy] = VLLMEngine(policy.model, policy.tokenizer)
    engine.sync()
    return engine


def vllm_rollout(
    policy: Any,
    prompt: str | Sequence[str],
    n: int,
    min_length: int,
    max_length: int,
    temperature: float | torch.Tensor,
    generator: torch.Generator | None,
) -> Rollout:
    """``sample_rollout`` drawn by vLLM, its record vLLM's log-probabilities (module docstring)."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    check_rollout_shape(n, min_length, max_length)
    start = time.perf_counter()
    temp = row_temperatures(temperature, n)
    if float(temp.max()) > MAX_TEMPERATURE:
        raise ValueError(
            f"temperature: vLLM samples at most {MAX_TEMPERATURE}, got {float(temp.max())}; "
            "lower sampling.temp_hi or decode another way"
        )
    if policy.grammar is not None and policy.stop_id != policy.tokenizer.eos_token_id:
        raise ValueError(
            "decode: vllm ends a grammar's text at EOS only; this task stops at another token "
            "(decode eager)"
        )
    prompt_rows = row_prompt_ids(policy.prompt_ids, prompt, n)
    longest = max(len(row) for row in prompt_rows)
    policy.check_positions(longest, max_length)
    engine = engine_of(policy)
    if longest + max_length + 1 > engine.max_model_len:
        raise ValueError(
            f"max_length: vLLM's record needs prompt ({longest} tokens) + max_length "
            f"({max_length}) + 1 positions, the engine has {engine.max_model_len}; lower "
            "max_length or decode eager"
        )
    seeds = torch.randint(0, 2**31 - 1, (n,), generator=generator).tolist()
    grammar = None if policy.grammar is None else StructuredOutputsParams(grammar=policy.grammar)
    allowed = [*policy.legal_ids, policy.stop_id]
    params = [
        SamplingParams(
            temperature=float(t),
            seed=int(seed),
            min_tokens=min_length,
            max_tokens=max_length + 1,  # the stop's log-probability after a full row
            allowed_token_ids=allowed,
            stop_token_ids=[policy.stop_id],
            structured_outputs=grammar,
            logprob_token_ids=[policy.stop_id],
            detokenize=False,
        )
        for t, seed in zip(temp.tolist(), seeds, strict=True)
    ]
    tic = time.perf_counter()
    outputs = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=ids) for ids in prompt_rows], params, use_tqdm=False
    )
    model_s = time.perf_counter() - tic
    tokens = torch.full((n, max_length), policy.pad_id, dtype=torch.long)
    log_pf = torch.zeros(n, max_length)
    log_pterm = torch.zeros(n, max_length + 1)
    rows = []
    legal = set(policy.legal_ids)
    for b, out in enumerate(outputs):
        row, pf, pterm = _row_record(out.outputs[0], legal, policy.stop_id, max_length)
        tokens[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        log_pf[b, : len(row)] = torch.tensor(pf, dtype=torch.float32)
        log_pterm[b, : len(row) + 1] = torch.tensor(pterm, dtype=torch.float32)
        rows.append(row)
    length = torch.tensor([len(row) for row in rows], dtype=torch.long)
    device = policy.device
    texts = [policy.row_text(row) for row in rows]
    timings = RolloutTimings(model_s, 0.0, time.perf_counter() - start)
    return Rollout(
        tokens.to(device),
        length.to(device),
        log_pf.to(device),
        log_pterm.to(device),
        texts,
        rows,
        timings,
    )


def _row_record(
    sample: Any, legal: set[int], stop_id: int, max_length: int
) -> tuple[tuple[int, ...], list[float], list[float]]:
    """One vLLM completion's row: its first ``max_length`` ids up to the first that is not a legal
    token (the stop, or what vLLM draws at a dead end, where its grammar and the legal tokens
    leave nothing: it draws id 0 and ends the request, and raptb's behaviour stops too); the raw
    log-probability of each of the row's tokens, and of the stop at each of its prefixes."""
    ids = sample.token_ids[:max_length]
    end = next((k for k, token in enumerate(ids) if token not in legal), len(ids))
    steps = sample.logprobs
    if len(steps) <= end:
        raise RuntimeError(f"vLLM returned {len(steps)} log-probabilities for a row of {end}")
    pf = [step[token].logprob for step, token in zip(steps, ids[:end], strict=False)]
    return tuple(ids[:end]), pf, [step[stop_id].logprob for step in steps[: end + 1]]
