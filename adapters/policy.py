"""Hugging Face causal LM as a GFlowNet forward policy: constrained rollout and rescoring.

Actions at a prefix s_{0:k} (prompt plus k generated tokens) are the V vocabulary tokens, one of
which (``stop_id``, usually EOS) is the stop action. The policy is the model's full softmax:

    log P_F(x | s_{0:k}) = logits_k[x] - logsumexp(logits_k)          (untempered, unmasked)

Rollout (``sample``) draws B rows in lock step, one token per step for every row, reusing the KV
cache. The behaviour distribution at prefix k of an unfinished row is the softmax of
``logits_k / temperature`` restricted to

    (legal tokens ∩ grammar-allowed tokens)  ∪  {stop if k >= min_length and the grammar accepts
                                                  the text as complete}

with stop the only action at k = max_length (and, as a fallback, wherever nothing else is
allowed). The recorded values are the untempered, unmasked log P_F of the chosen token and of stop
at every visited prefix (objectives.md): ``log_pf`` [B, T] (column t < tau: the (t+1)-th token,
0 after), ``log_pterm`` [B, T+1] (column k <= tau, 0 after), with T = max_length and tau = length.

``score`` recomputes the same values for given sequences by one teacher-forced forward pass with
gradients (equal to the rollout's values up to float rounding when the model has no dropout or is
in eval mode); ``reference_score`` does it without gradients for the frozen base model (the peft
adapter disabled, or a frozen copy taken on first use). The prompt is tokenised once and shared by
every row, so rows are aligned without padding; tokens after a row's stop are ignored.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from raptb.adapters.grammar import GrammarBatch
from raptb.adapters.tokens import token_texts
from raptb.core.batch import PrefixBatch


@dataclass(frozen=True)
class RolloutTimings:
    """Wall-clock seconds of one rollout: model forwards, grammar masking and accepting, total."""

    model_s: float
    grammar_s: float
    total_s: float


@dataclass
class Rollout:
    """B sampled trajectories in the prefix layout (see the module docstring).

    tokens: LongTensor [B, T], generated ids, ``pad_id`` after the stop.
    length: LongTensor [B], tau (tokens before the stop).
    log_pf: float32 [B, T]; log_pterm: float32 [B, T+1] (untempered, unmasked, 0 after tau).
    texts: the generated text of each row, stop excluded (the concatenated in-context token texts,
        i.e. exactly the text the grammar matched).
    rows: the host copy of each row's generated ids x_1..x_tau (the texts are built from it).
    """

    tokens: torch.Tensor
    length: torch.Tensor
    log_pf: torch.Tensor
    log_pterm: torch.Tensor
    texts: list[str]
    rows: list[tuple[int, ...]]
    timings: RolloutTimings


def _log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, stop_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 log-softmax of ``logits`` [..., V] at ``tokens`` [...] and at ``stop_id``.

    Gathers then subtracts the log-normaliser instead of materialising the full log-softmax, and is
    shared by rollout and rescoring so both round the same way.
    """
    logits = logits.float()
    log_norm = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_norm
    return chosen, logits[..., stop_id] - log_norm


def default_grammar_threads(device: torch.device) -> int:
    """Threads for xgrammar's mask filling: on a GPU the model step is fast and filling masks
    over a large legal vocabulary dominates the rollout unless it uses several CPU threads
    (min(8, cores)); on CPU one thread leaves the cores to torch."""
    return min(8, os.cpu_count() or 1) if device.type == "cuda" else 1


class HFPolicy:
    """A causal LM with a legal sub-vocabulary, a stop token and an optional grammar.

    legal_ids: full-vocabulary ids of the tokens a rollout may generate (see
        ``raptb.adapters.tokens.legal_token_ids``); must not contain ``stop_id``.
    stop_id: the id of the stop action.
    grammar: EBNF (xgrammar dialect) the generated text must follow, or None.
    grammar_threads: threads xgrammar fills the B rows' masks with; more pay off only when the
        model step is fast (a GPU) and the legal vocabulary is large.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        legal_ids: Sequence[int],
        stop_id: int,
        grammar: str | None = None,
        grammar_threads: int = 1,
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
        if grammar_threads < 1:
            raise ValueError(f"grammar_threads: must be >= 1, got {grammar_threads}")
        self.grammar_threads = int(grammar_threads)
        self.pad_id = self.stop_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
        self.texts = token_texts(tokenizer, legal)
        self._legal = torch.tensor(legal, dtype=torch.long)
        self._sub_of = {full: sub for sub, full in enumerate(legal)}
        self._grammars: dict[int, GrammarBatch] = {}
        self._frozen_copy: PreTrainedModel | None = None
        if grammar is not None:
            # compile now so that a bad grammar fails at construction, not mid-training
            self._grammar_batch(grammar, 1)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _grammar_batch(self, grammar: str, n: int) -> GrammarBatch:
        if n not in self._grammars:
            self._grammars[n] = GrammarBatch(
                grammar, self.legal_ids, self.texts, n, max_threads=self.grammar_threads
            )
        return self._grammars[n]

    def prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of the prompt: the tokenizer's encoding, with BOS in front when the tokenizer
        has one and did not add it, and never empty (the stop token stands in as a start token)."""
        ids = list(self.tokenizer.encode(prompt, add_special_tokens=True))
        bos = self.tokenizer.bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids or [self.stop_id]

    def _check_positions(self, prompt_len: int, max_length: int) -> None:
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and prompt_len + max_length > limit:
            raise ValueError(
                f"max_length: prompt ({prompt_len} tokens) + max_length ({max_length}) exceeds "
                f"the model's {limit} positions"
            )

    @torch.no_grad()
    def sample(
        self,
        prompt: str,
        n: int,
        *,
        min_length: int,
        max_length: int,
        temperature: float | torch.Tensor = 1.0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Draw ``n`` constrained trajectories (see the module docstring for the behaviour mask)."""
        if n < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        if not 0 <= min_length <= max_length:
            raise ValueError(
                f"min_length, max_length: need 0 <= min_length <= max_length, got "
                f"{min_length}, {max_length}"
            )
        start = time.perf_counter()
        model_s = grammar_s = 0.0
        device = self.device
        temp = self._temperature(temperature, n).to(device)
        prompt_ids = self.prompt_ids(prompt)
        self._check_positions(len(prompt_ids), max_length)
        big_t, num_legal = max_length, len(self.legal_ids)
        legal = self._legal.to(device)
        tokens = torch.full((n, big_t), self.pad_id, dtype=torch.long, device=device)
        length = torch.full((n,), big_t, dtype=torch.long, device=device)
        log_pf = torch.zeros(n, big_t, device=device)
        log_pterm = torch.zeros(n, big_t + 1, device=device)
        active = torch.ones(n, dtype=torch.bool, device=device)
        grammar = None if self.grammar is None else self._grammar_batch(self.grammar, n)
        if grammar is not None:
            grammar.reset()

        was_training = self.model.training
        self.model.eval()
        try:
            tic = time.perf_counter()
            # an explicit all-ones attention mask: rows are aligned, nothing is padding
            attention = torch.ones(n, len(prompt_ids) + big_t, dtype=torch.long, device=device)
            out = self.model(
                input_ids=torch.tensor([prompt_ids], device=device).expand(n, -1),
                attention_mask=attention[:, : len(prompt_ids)],
                use_cache=True,
            )
            model_s += time.perf_counter() - tic
            for k in range(big_t + 1):
                logits = out.logits[:, -1, :]
                if k == big_t:
                    _, stop_lp = _log_probs(
                        logits, torch.full_like(length, self.stop_id), self.stop_id
                    )
                    log_pterm[:, k] = torch.where(active, stop_lp, 0.0)
                    break
                tic = time.perf_counter()
                if grammar is None:
                    allowed = torch.ones(n, num_legal, dtype=torch.bool, device=device)
                    complete = torch.ones(n, dtype=torch.bool, device=device)
                else:
                    allowed = grammar.allowed_mask().to(device)
                    complete = grammar.stop_mask().to(device)
                grammar_s += time.perf_counter() - tic
                can_stop = complete & (k >= min_length)
                # a dead end (nothing allowed, stop not allowed) stops rather than failing
                can_stop |= ~allowed.any(dim=1)
                allowed &= active[:, None]
                can_stop |= ~active
                sub_mask = torch.cat([allowed, can_stop[:, None]], dim=1)
                sub_logits = torch.cat([logits[:, legal], logits[:, [self.stop_id]]], dim=1)
                behaviour = sub_logits.float() / temp[:, None]
                behaviour = behaviour.masked_fill(~sub_mask, float("-inf"))
                choice = torch.multinomial(
                    torch.softmax(behaviour, dim=1), 1, generator=generator
                ).squeeze(1)
                stops = active & (choice == num_legal)
                moves = active & ~stops
                step_tokens = torch.where(
                    moves, legal[choice.clamp(max=num_legal - 1)], self.pad_id
                )
                token_lp, stop_lp = _log_probs(logits, step_tokens, self.stop_id)
                log_pterm[:, k] = torch.where(active, stop_lp, 0.0)
                log_pf[:, k] = torch.where(moves, token_lp, 0.0)
                tokens[:, k] = step_tokens
                length[stops] = k
                active = moves
                if not bool(active.any()):
                    break
                if grammar is not None:
                    tic = time.perf_counter()
                    rows = torch.nonzero(moves).squeeze(1).tolist()
                    accepted = grammar.accept_many(rows, step_tokens[moves].tolist())
                    grammar_s += time.perf_counter() - tic
                    if not all(accepted):
                        raise RuntimeError("grammar matcher rejected a token its own mask allowed")
                tic = time.perf_counter()
                out = self.model(
                    input_ids=step_tokens[:, None],
                    attention_mask=attention[:, : len(prompt_ids) + k + 1],
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
                model_s += time.perf_counter() - tic
        finally:
            self.model.train(was_training)

        rows = [tuple(row[:tau]) for row, tau in zip(tokens.tolist(), length.tolist(), strict=True)]
        texts = ["".join(self.texts[self._sub_of[t]] for t in row) for row in rows]
        timings = RolloutTimings(model_s, grammar_s, time.perf_counter() - start)
        return Rollout(tokens, length, log_pf, log_pterm, texts, rows, timings)

    @staticmethod
    def _temperature(temperature: float | torch.Tensor, n: int) -> torch.Tensor:
        temp = torch.as_tensor(temperature, dtype=torch.float32).cpu()
        if temp.ndim == 0:
            temp = temp.expand(n)
        if temp.shape != (n,):
            raise ValueError(
                f"temperature: expected a float or shape [{n}], got {tuple(temp.shape)}"
            )
        if not bool(torch.all(torch.isfinite(temp) & (temp > 0))):
            raise ValueError("temperature: every value must be finite and > 0")
        return temp

    def _forward_log_probs(
        self,
        model: PreTrainedModel,
        prompt: str,
        tokens: torch.Tensor,
        length: torch.Tensor,
        hidden: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        if tokens.ndim != 2:
            raise ValueError(f"tokens: expected shape [B, T], got {tuple(tokens.shape)}")
        b, big_t = tokens.shape
        if tuple(length.shape) != (b,):
            raise ValueError(f"length: expected shape [{b}], got {tuple(length.shape)}")
        device = self.device
        tokens, length = tokens.to(device), length.to(device)
        if b and (int(length.min()) < 0 or int(length.max()) > big_t):
            raise ValueError(f"length: values must lie in [0, T={big_t}]")
        prompt_ids = self.prompt_ids(prompt)
        self._check_positions(len(prompt_ids), big_t)
        cols = torch.arange(big_t, device=device)
        token_mask = cols[None, :] < length[:, None]
        prefix_mask = torch.arange(big_t + 1, device=device)[None, :] <= length[:, None]
        # positions after the stop hold arbitrary ids; causal attention keeps them out of every
        # earlier prefix, so any valid id will do
        body = torch.where(token_mask, tokens, self.stop_id)
        input_ids = torch.cat(
            [torch.tensor([prompt_ids], device=device).expand(b, -1), body], dim=1
        )
        out = model(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            use_cache=False,
            output_hidden_states=hidden,
        )
        logits = out.logits[:, len(prompt_ids) - 1 :, :]
        next_tokens = torch.cat([body, torch.full_like(body[:, :1], self.stop_id)], dim=1)
        token_lp, stop_lp = _log_probs(logits, next_tokens, self.stop_id)
        log_pf = torch.where(token_mask, token_lp[:, :big_t], 0.0)
        log_pterm = torch.where(prefix_mask, stop_lp, 0.0)
        return (log_pf, log_pterm, out.hidden_states[-1]) if hidden else (log_pf, log_pterm)

    def score(
        self, prompt: str, tokens: torch.Tensor, length: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced ``(log_pf [B, T], log_pterm [B, T+1])`` of given trajectories, one forward
        pass with gradients (the values the loss trains through)."""
        log_pf, log_pterm = self._forward_log_probs(self.model, prompt, tokens, length)
        return log_pf, log_pterm

    def score_with_hidden(
        self, prompt: str, tokens: torch.Tensor, length: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``score`` plus the last layer's hidden states [B, P + T, H] of the same forward pass
        (P = ``len(prompt_ids(prompt))``), for a value head on the policy's backbone."""
        log_pf, log_pterm, hidden = self._forward_log_probs(
            self.model, prompt, tokens, length, hidden=True
        )
        return log_pf, log_pterm, hidden

    @torch.no_grad()
    def reference_score(
        self, prompt: str, tokens: torch.Tensor, length: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``score`` under the frozen base model, without gradients (for kappa log P_ref).

        A peft model is evaluated with its adapter disabled (same weights, no copy); any other
        model through the frozen copy of ``freeze_reference`` (taken on the first call).
        """
        if hasattr(self.model, "disable_adapter") and hasattr(self.model, "peft_config"):
            was_training = self.model.training
            self.model.eval()
            try:
                with self.model.disable_adapter():
                    ref_pf, ref_pterm = self._forward_log_probs(self.model, prompt, tokens, length)
            finally:
                self.model.train(was_training)
            return ref_pf, ref_pterm
        ref_pf, ref_pterm = self._forward_log_probs(self.freeze_reference(), prompt, tokens, length)
        return ref_pf, ref_pterm

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
