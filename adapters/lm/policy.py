"""Hugging Face causal LM as a GFlowNet forward policy: constrained rollout and rescoring.

Actions at a prefix s_{0:k} (prompt plus k generated tokens) are the V vocabulary tokens, one of
which (``stop_id``, usually EOS) is the stop action. The policy is the model's full softmax:

    log P_F(x | s_{0:k}) = logits_k[x] - logsumexp(logits_k)          (untempered, unmasked)

Rollout (``sample``, in ``raptb.adapters.lm.rollout``) draws B rows in lock step under the
behaviour mask (legal tokens, grammar, min/max length) and records the untempered, unmasked
log P_F of the chosen token and of stop at every visited prefix (objectives.md): ``log_pf`` [B, T]
and ``log_pterm`` [B, T+1], with T = max_length.

``score`` recomputes the same values for given sequences by one teacher-forced forward pass with
gradients (equal to the rollout's values up to float rounding when the model has no dropout or is
in eval mode); ``reference_score`` does it without gradients for the frozen base model (the peft
adapter disabled, or a frozen copy taken on first use). Both take a ``temperature`` (default 1):
the log-probs of the softmax of logits / temperature, which the RL baselines score at their
sampling temperature as TRL does; the GFlowNet objectives always score temperature 1. Prompts
are tokenised once; rows are left-padded to the longest prompt; tokens after a stop are ignored.
``lean_gpt2`` runs rollout and rescoring where it supports the model (``uses_lean_gpt2``). Which
module draws and which rescores, per device, model and grammar: ``raptb.adapters.lm.paths``
(``HFPolicy.paths``); the rescoring's forward: ``raptb.adapters.lm.rescoring``.

Activation checkpointing (:meth:`HFPolicy.enable_activation_checkpointing`, TRL's
``gradient_checkpointing``) applies to that teacher-forced pass (transformers' own per-block,
non-reentrant checkpointing, inside FSDP2's hooks; training mode only): the rollout and the
reference pass run in eval mode with the KV cache, so neither is affected.
"""

from __future__ import annotations

import contextlib
import copy
import os
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from raptb.adapters.lm.decode_mode import DecodeMode, current_mode, resolve_decode
from raptb.adapters.lm.embedded import compiled_rollout, lean_gpt2
from raptb.adapters.lm.gpu.static_decoder import StaticDecoders
from raptb.adapters.lm.grammar import GrammarBatch
from raptb.adapters.lm.lanes import Lanes
from raptb.adapters.lm.paths import RESCORING_MODULES, ROLLOUT_MODULES, grammar_kind, rollout_path
from raptb.adapters.lm.rescoring import forward_log_probs
from raptb.adapters.lm.rescoring import path_of as rescoring_path_of
from raptb.adapters.lm.rollout import sample_rollout
from raptb.adapters.lm.rollout_record import softmax_entropy
from raptb.adapters.lm.table_grammar import TableGrammarBatch
from raptb.adapters.lm.tokens import token_texts
from raptb.core.char_automaton import CharAutomaton, token_table
from raptb.core.gfn.batch import PrefixBatch

PROMPT_IDS_KEPT = 65_536
"""Encoded prompts an ``HFPolicy`` keeps (a task's prompts; the memo starts over past it)."""


def default_grammar_threads(device: torch.device) -> int:
    """Threads for xgrammar's mask filling: on a GPU the model step is fast and filling masks
    over a large legal vocabulary dominates the rollout unless it uses several CPU threads
    (min(8, cores)); on CPU one thread leaves the cores to torch."""
    return min(8, os.cpu_count() or 1) if device.type == "cuda" else 1


class HFPolicy:
    """A causal LM with a legal sub-vocabulary, a stop token and an optional grammar.

    legal_ids: full-vocabulary ids of the tokens a rollout may generate (see
        ``raptb.adapters.lm.tokens.legal_token_ids``); must not contain ``stop_id``.
    stop_id: the id of the stop action.
    grammar: EBNF (xgrammar dialect) the generated text must follow, or None.
    automaton: the grammar as an automaton over characters (core.char_automaton), or None:
        with it, rollouts read their masks from its table (adapters.lm.table_grammar) instead of
        running xgrammar's matcher per row; the same masks. Only read with a grammar.
    grammar_threads: threads xgrammar fills the B rows' masks with; more pay off only when the
        model step is fast (a GPU) and the legal vocabulary is large.
    decode: how ``sample`` decodes: ``"eager"`` (``raptb.adapters.lm.rollout``), ``"static"``
        (``raptb.adapters.lm.gpu.static_decode``: static KV cache, fixed batch buckets, CUDA graphs
        on a GPU; the same rollouts), ``"compiled"``
        (``raptb.adapters.lm.embedded.compiled_rollout``: the rollout compiled by Numba; GPT-2 in
        float32 on the CPU; the same rollouts up to float rounding), or ``"auto"``: static on
        CUDA, compiled on the CPU where it applies to a small model
        (``compiled_rollout.AUTO_MAX_PARAMETERS``), else eager. ``"onnx"``: ``"compiled"``'s
        former name, with a FutureWarning.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        legal_ids: Sequence[int],
        stop_id: int,
        grammar: str | None = None,
        automaton: CharAutomaton | None = None,
        grammar_threads: int = 1,
        decode: DecodeMode = "auto",
    ) -> None:
        vocab_size = int(model.get_output_embeddings().weight.shape[0])
        legal = [int(i) for i in legal_ids]
        if not legal:
            raise ValueError("legal_ids: empty; no token could ever be generated")
        if len(set(legal)) != len(legal):
            raise ValueError("legal_ids: contains duplicates")
        if not 0 <= stop_id < vocab_size:
            raise ValueError(f"stop_id: {stop_id} outside the model vocabulary [0, {vocab_size})")
        if stop_id in legal:
            raise ValueError(f"legal_ids: contains stop_id {stop_id}; stop is a separate action")
        if min(legal) < 0 or max(legal) >= vocab_size:
            raise ValueError(f"legal_ids: ids must lie in [0, {vocab_size})")
        self.model = model
        self.tokenizer = tokenizer
        self.legal_ids = legal
        self.stop_id = int(stop_id)
        self.grammar = grammar
        self.automaton = automaton
        if grammar_threads < 1:
            raise ValueError(f"grammar_threads: must be >= 1, got {grammar_threads}")
        self.grammar_threads = int(grammar_threads)
        # ValueError for a bad name (whether compiled applies is asked at each rollout)
        decode = current_mode(decode)  # type: ignore[assignment]
        resolve_decode(decode, torch.device("cpu"), sharded=False, compiled=True)
        self.decode: DecodeMode = decode
        self.decoders = StaticDecoders()
        """The static path's KV caches, buffers and CUDA graphs, kept between rollouts."""
        self.pad_id = self.stop_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
        self.texts = token_texts(tokenizer, legal)
        self._sub_of = {full: sub for sub, full in enumerate(legal)}
        self._grammars: dict[tuple[int, bool, int], GrammarBatch | TableGrammarBatch] = {}
        self._frozen_copy: PreTrainedModel | None = None
        self._prompt_ids: dict[str, list[int]] = {}
        self._lean_support: weakref.WeakKeyDictionary[torch.nn.Module, bool] = (
            weakref.WeakKeyDictionary()
        )
        self.checkpointed = False
        """Whether ``enable_activation_checkpointing`` has run (training-mode forwards then take
        transformers' own, ``paths``)."""
        self.step_together: Callable[[bool], bool] | None = None
        """For a model sharded across processes (whose forwards are collectives): called once per
        rollout step with whether this process's rows have all stopped, it returns whether every
        process's have; the rollout steps on (forwards only) until then. None: one process."""
        # the rollout's rows and the loss's micro-batches in lanes side by side (adapters.lm.lanes);
        # one lane by default, the trainer sets its own
        self.lanes = Lanes(1)
        if grammar is not None:
            # compile now so that a bad grammar fails at construction, not mid-training
            self.grammar_batch(1)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def decode_path(self) -> str:
        """``"eager"``, ``"static"``, ``"compiled"`` or ``"vllm"``: the path ``sample`` takes now
        (``decode`` resolved on the model's device and for the model; a model sharded across
        processes decodes eagerly). ValueError for ``"compiled"`` where it does not apply."""
        sharded = self.step_together is not None
        decode = current_mode(self.decode)
        compiled = (
            not sharded
            and decode in ("auto", "compiled")
            and self.uses_lean_gpt2(self.model)
            and (compiled_rollout.preferred if decode == "auto" else compiled_rollout.usable)(
                self.model
            )
        )
        return resolve_decode(decode, self.device, sharded=sharded, compiled=compiled)

    @property
    def paths(self) -> tuple[str, str]:
        """The modules (``adapters.lm.paths``' ``ROLLOUT_MODULES``, ``RESCORING_MODULES``) that
        ``sample`` and ``score`` run now, for rows that share one prompt (docs/layout.md, "Which
        path runs when")."""
        grammar = grammar_kind(self.grammar, self.automaton)
        rows, body = [self.prompt_ids("")], torch.zeros(1, 1, dtype=torch.long)
        rescoring = rescoring_path_of(self, self.model, rows, body)
        return (
            ROLLOUT_MODULES[rollout_path(self.decode_path, grammar)],
            RESCORING_MODULES[rescoring],
        )

    def grammar_batch(self, n: int, lane: int = 0) -> GrammarBatch | TableGrammarBatch | None:
        """The grammar's state for ``n`` rows of rollout lane ``lane`` (built once per ``n`` and
        lane): the automaton's table where there is one, else xgrammar's matchers; None without
        a grammar."""
        if self.grammar is None:
            return None
        key = (n, self.automaton is not None, lane)
        if key not in self._grammars:
            pinned = self.device.type == "cuda"
            self._grammars[key] = (
                TableGrammarBatch(
                    token_table(self.automaton, self.texts), self.legal_ids, n, pin_memory=pinned
                )
                if self.automaton is not None
                else GrammarBatch(
                    self.grammar,
                    self.legal_ids,
                    self.texts,
                    n,
                    max_threads=self.grammar_threads,
                    pin_memory=pinned,
                )
            )
        return self._grammars[key]

    def row_text(self, row: Sequence[int]) -> str:
        """The text of generated (legal) ids ``row``: the concatenated in-context token texts."""
        return "".join(self.texts[self._sub_of[t]] for t in row)

    def prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of the prompt: the tokenizer's encoding, with BOS in front when the tokenizer
        has one and did not add it, and never empty (the stop token stands in as a start token)."""
        ids = self._prompt_ids.get(prompt)
        if ids is None:  # the tokenizer is fixed: each text is encoded once (25 us a call here)
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=True))
            bos = self.tokenizer.bos_token_id
            if bos is not None and (not ids or ids[0] != bos):
                ids.insert(0, bos)
            ids = ids or [self.stop_id]
            if len(self._prompt_ids) >= PROMPT_IDS_KEPT:
                self._prompt_ids.clear()
            self._prompt_ids[prompt] = ids
        return list(ids)

    def check_positions(self, prompt_len: int, max_length: int) -> None:
        """ValueError when a prompt of ``prompt_len`` tokens plus ``max_length`` generated ones
        would exceed the model's position embeddings."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and prompt_len + max_length > limit:
            raise ValueError(
                f"max_length: prompt ({prompt_len} tokens) + max_length ({max_length}) exceeds "
                f"the model's {limit} positions"
            )

    sample = sample_rollout
    """``sample(prompt, n, *, min_length, max_length, temperature=1.0, generator=None,
    record=True)``: draw ``n`` constrained trajectories, a ``Rollout``
    (``raptb.adapters.lm.rollout.sample_rollout``); a sequence of n prompts gives each row its
    own; ``record=False`` for rows whose log-probabilities nobody reads (the training step's)."""

    def enable_activation_checkpointing(self) -> None:
        """Checkpoint the model's blocks in training-mode forwards, i.e. in
        ``score`` (module docstring).

        Raises:
            ValueError: the model does not support activation checkpointing.
        """
        inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        self._lean_support.clear()  # a checkpointed model takes transformers' forward
        if not getattr(inner, "supports_gradient_checkpointing", False):
            raise ValueError(
                f"optim.gradient_checkpointing: {type(inner).__name__} does not support "
                "activation checkpointing"
            )
        # the name transformers 5 gives it; its deprecated alias in transformers 4
        enable = getattr(inner, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            inner.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.checkpointed = True

    def uses_lean_gpt2(self, model: PreTrainedModel) -> bool:
        """Whether ``model``'s forwards run through ``raptb.adapters.lm.embedded.lean_gpt2`` (a
        model it supports, on one process). ``lean_gpt2.supports`` is asked once per model (it walks
        the model's modules for activation checkpointing: 85 us, three times a step) and again after
        ``enable_activation_checkpointing``."""
        if self.step_together is not None:
            return False
        supported = self._lean_support.get(model)
        if supported is None:
            supported = self._lean_support[model] = lean_gpt2.supports(model)
        return supported

    def score(
        self,
        prompt: str | Sequence[str],
        tokens: torch.Tensor,
        length: torch.Tensor,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced ``(log_pf [B, T], log_pterm [B, T+1])`` of given trajectories, one forward
        pass with gradients (the values the loss trains through), of the softmax of logits /
        ``temperature``. ``prompt``: every row's, or each row's (B prompts, left-padded together as
        in the rollout)."""
        log_pf, log_pterm = forward_log_probs(
            self, self.model, prompt, tokens, length, temperature=temperature
        )
        return log_pf, log_pterm

    def score_with_hidden(
        self, prompt: str, tokens: torch.Tensor, length: torch.Tensor, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``score`` plus the last layer's hidden states [B, P + T, H] of the same forward pass
        (P = ``len(prompt_ids(prompt))``), for a value head on the policy's backbone."""
        log_pf, log_pterm, hidden = forward_log_probs(
            self, self.model, prompt, tokens, length, hidden=True, temperature=temperature
        )
        return log_pf, log_pterm, hidden

    def score_with_entropy(
        self, prompt: str, tokens: torch.Tensor, length: torch.Tensor, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``score`` plus the entropy [B, T+1] of the full softmax of logits / ``temperature`` at
        each prefix state 0..tau (0 after), from the same forward pass and with gradients (TRL's
        ``entropy_from_logits`` of its GRPO entropy bonus)."""
        return self.score_with_states(
            prompt, tokens, length, lambda logits: softmax_entropy(logits, temperature), temperature
        )

    def score_with_states(
        self,
        prompt: str,
        tokens: torch.Tensor,
        length: torch.Tensor,
        per_state: Callable[[torch.Tensor], torch.Tensor],
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``score`` plus ``per_state`` of the untempered logits [B, T+1, V] at each prefix state
        0..T (0 after each row's stop), from the same forward pass and with gradients: e.g. the
        entropy, or the log-probs of the legal tokens and the stop."""
        log_pf, log_pterm, values = forward_log_probs(
            self, self.model, prompt, tokens, length, temperature=temperature, per_state=per_state
        )
        return log_pf, log_pterm, values

    @torch.no_grad()
    def reference_score(
        self,
        prompt: str | Sequence[str],
        tokens: torch.Tensor,
        length: torch.Tensor,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``score`` under the frozen base model, without gradients (for kappa log P_ref).

        A peft model is evaluated with its adapter disabled (same weights, no copy); any other
        model through the frozen copy of ``freeze_reference`` (taken on the first call). The rows
        are cut into the policy's ``lanes`` (``rescoring.lanes_log_probs``), the adapter switched
        off once around them all.
        """
        peft = hasattr(self.model, "disable_adapter") and hasattr(self.model, "peft_config")
        model = self.model if peft else self.freeze_reference()
        was_training = model.training
        model.eval()
        try:
            with self.model.disable_adapter() if peft else contextlib.nullcontext():
                return forward_log_probs(
                    self, model, prompt, tokens, length, temperature=temperature, lanes=self.lanes
                )
        finally:
            model.train(was_training)

    @property
    def reference_copy(self) -> PreTrainedModel | None:
        """The frozen reference copy if ``freeze_reference`` has taken one, else None."""
        return self._frozen_copy

    def freeze_reference(self) -> PreTrainedModel:
        """The frozen copy of a non-peft model used as the reference, taken on the first call.

        Call it before the first optimizer step when the reference will be needed later (kappa >
        0): the copy is the model as it is at that moment.
        """
        if self._frozen_copy is None:
            self._frozen_copy = copy.deepcopy(self.model).eval().requires_grad_(False)
        return self._frozen_copy


def to_prefix_batch(
    log_pf: torch.Tensor,
    log_pterm: torch.Tensor,
    log_r: torch.Tensor | np.ndarray,
    u: torch.Tensor | np.ndarray,
    length: torch.Tensor,
) -> PrefixBatch:
    """A core ``PrefixBatch`` from policy log-probs and task rewards (converted to log_pf's dtype
    and device, so numpy rewards from a task mix with torch log-probs)."""
    like = {"dtype": log_pf.dtype, "device": log_pf.device}
    return PrefixBatch(
        log_pf=log_pf,
        log_pterm=log_pterm,
        log_r=torch.as_tensor(log_r, **like),
        u=torch.as_tensor(u, **like),
        length=torch.as_tensor(length, dtype=torch.long, device=log_pf.device),
    )
