"""Which path runs when: the module that draws a policy's rollouts and the one that rescores them.

One implementation of each per (model, device) besides the reference, transformers' own forward
over ``cat(prompt, body)`` that every fast path is held to (tests/adapters/test_one_path.py). The
rescoring of given rows (``rescoring_path``, which ``adapters.lm.rescoring`` dispatches on):

- ``compiled_rescoring``: the embedded GPT-2 (a model ``lean_gpt2.supports``) in float32 on a
  CPU, rows that share one prompt, log-probabilities only: forward and backward as two compiled
  functions (``adapters.lm.embedded.compiled_rescoring``);
- ``lean_gpt2``: that model elsewhere (a GPU, rows with their own prompts, per-state values):
  its forward in a few torch operations per block (``adapters.lm.embedded.lean_gpt2``; on a CPU
  with gradients its GELU by ``tanh_gelu``, its shared-prompt attention by ``prompt_attention``);
- ``shared_prompts``: any other model on one process, log-probabilities only: each distinct
  prompt forwarded once, the head applied only where read (``adapters.lm.shared_prompts``);
- ``model``: transformers' forward of every row's prompt and tokens (hidden states, per-state
  values of another model, a model sharded across processes or checkpointed in training).

Each distinct row is forwarded once (``adapters.lm.distinct_rows``) on every path unless the
forward is random (dropout). The rollout (``rollout_path``) follows the decoding path
(``adapters.lm.decode_mode``) and the grammar. ``which`` is docs/layout.md's table "Which path runs
when", row by row: the choice on the facts the policy reads off its model.
"""

from __future__ import annotations

from typing import Literal

import torch

from raptb.adapters.lm.decode_mode import resolve_decode

GrammarKind = Literal["none", "automaton table", "xgrammar"]
GRAMMARS: tuple[GrammarKind, ...] = ("none", "automaton table", "xgrammar")
ModelKind = Literal["the embedded GPT-2", "any other transformers model"]
MODELS: tuple[ModelKind, ...] = ("the embedded GPT-2", "any other transformers model")
Device = Literal["CPU", "CUDA", "sharded"]
DEVICES: tuple[Device, ...] = ("CPU", "CUDA", "sharded")

RESCORING_MODULES = {
    "compiled_rescoring": "adapters/lm/embedded/compiled_rescoring.py",
    "lean_gpt2": "adapters/lm/embedded/lean_gpt2.py",
    "shared_prompts": "adapters/lm/shared_prompts.py",
    "model": "adapters/lm/rescoring.py",
}
"""Each rescoring path's module (``model``: transformers' forward, called by the rescoring)."""

ROLLOUT_MODULES = {
    "eager": "adapters/lm/rollout.py",
    "static": "adapters/lm/gpu/static_decode.py",
    "compiled": "adapters/lm/embedded/compiled_rollout.py",
    "vllm": "adapters/lm/vllm_rollout.py",
}
"""Each rollout path's module."""


def grammar_kind(grammar: str | None, automaton: object | None) -> GrammarKind:
    """The grammar column of a policy with EBNF ``grammar`` and ``automaton`` (``HFPolicy``'s)."""
    if grammar is None:
        return "none"
    return "xgrammar" if automaton is None else "automaton table"


def rescoring_path(
    *,
    rows: bool,
    lean: bool,
    compiled: bool,
    one_prompt: bool,
    plain: bool,
    hidden: bool,
    per_state: bool,
) -> str:
    """The rescoring path (module docstring) of a batch: ``rows``, it has any; ``lean``, the
    policy runs the model through ``lean_gpt2`` (supported, one process); ``compiled``,
    ``compiled_rescoring.computes`` the model; ``one_prompt``, every row has the same non-empty
    prompt and T > 0; ``plain``, one process and not a checkpointed training forward; ``hidden``
    or ``per_state``, more than the log-probabilities asked for."""
    more = hidden or per_state
    if lean and compiled and rows and one_prompt and not more:
        return "compiled_rescoring"
    if lean and rows and not hidden:
        return "lean_gpt2"
    if not lean and rows and plain and not more:
        return "shared_prompts"
    return "model"


def rollout_path(decode_path: str, grammar: GrammarKind) -> str:
    """The rollout path of decoding path ``decode_path`` (``HFPolicy.decode_path``) under
    ``grammar``: the decoding path itself, under every grammar (the compiled path runs a rollout
    without a grammar or with an automaton's table as one compiled call, one with xgrammar's
    matchers, which run on the host between columns, as one compiled call a column)."""
    del grammar  # every path takes every grammar
    return decode_path


def which(device: Device, model: ModelKind, grammar: GrammarKind) -> tuple[str, str]:
    """(rollout module, rescoring module) of a training run (``decode = "auto"``, float32, rows
    that share one prompt, ``score``) on ``device`` (``"sharded"``: a model sharded with FSDP
    across processes, on either device) with ``model`` under ``grammar``: docs/layout.md's table."""
    sharded = device == "sharded"
    lean = model == "the embedded GPT-2" and not sharded
    on_cpu = device == "CPU"
    decode = resolve_decode(
        "auto",
        torch.device("cuda" if device == "CUDA" else "cpu"),
        sharded=sharded,
        compiled=lean and on_cpu,
    )
    rescoring = rescoring_path(
        rows=True,
        lean=lean,
        compiled=lean and on_cpu,
        one_prompt=True,
        plain=not sharded,
        hidden=False,
        per_state=False,
    )
    return ROLLOUT_MODULES[rollout_path(decode, grammar)], RESCORING_MODULES[rescoring]
