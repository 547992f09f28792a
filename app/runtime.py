"""Wiring shared by training and evaluation: task, model, policy and per-prefix rewards.

Per-prefix rewards (objectives.md): for a trajectory with tokens x_1..x_tau and every k <= tau,

    u_k     = lambda * S(x_1..x_k)                      (task-only part, scored on the text)
    log_r_k = kappa * log P_ref(x_1..x_k + stop) + u_k

with log P_ref(x_1..x_k + stop) = sum_{t<k} ref_log_pf[t] + ref_log_pterm[k] from the frozen
reference model (only computed when kappa > 0).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from raptb.adapters.lora import apply_lora, load_adapter_weights, preferred_dtype
from raptb.adapters.models import load_model_and_tokenizer
from raptb.adapters.policy import HFPolicy, default_grammar_threads
from raptb.adapters.registry import task_spec
from raptb.adapters.static_decode import DecodeMode
from raptb.adapters.tokens import legal_token_ids, stop_token_id
from raptb.app.config import LoraConfig, TinyConfig, TrainConfig
from raptb.app.reward_calls import RewardCaller
from raptb.core.ports import Score, Task, TaskCapabilities

_log = logging.getLogger(__name__)


def build_task(config: TrainConfig) -> Task:
    """The run's task: ``config.task`` built by its registered spec from its options."""
    return task_spec(config.task).build(config.task_options())


def build_policy(
    model_name: str,
    task: Task,
    seed: int,
    *,
    lora: LoraConfig | None = None,
    adapter: Path | None = None,
    device: torch.device | None = None,
    decode: DecodeMode = "auto",
    tiny: TinyConfig | None = None,
) -> HFPolicy:
    """The task's constrained policy on ``model_name`` ('tiny', 'smollm2-135m', a local directory
    or an HF id), on the GPU when there is one (bf16 where supported).

    lora: with ``lora.rank`` >= 1, the model is wrapped with LoRA adapters (adapters.lora);
        ``adapter``, a folder written by ``save_pretrained``, then supplies their trained weights.
    device: where the model lives (a launched process's own GPU); default the GPU when there is
        one, else the CPU.
    decode: the rollout's decoding path (``sampling.decode``; ``HFPolicy``).
    tiny: the embedded model's shape when ``model_name`` is 'tiny' (default: ``TinyConfig()``).
    """
    torch.manual_seed(seed)
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = preferred_dtype(device)
    model, tokenizer = load_model_and_tokenizer(
        model_name,
        seed=seed,
        dtype=None if dtype == torch.float32 else dtype,
        tiny_shape=(tiny or TinyConfig()).shape(),
    )
    model = model.to(device)
    if lora is not None and lora.rank:
        model = apply_lora(model, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout)
        if adapter is not None:
            load_adapter_weights(model, adapter)
    elif adapter is not None:
        raise ValueError("adapter: loading adapter weights needs lora.rank")
    stop_id = _stop_id(tokenizer, TaskCapabilities.of(task).stop)
    legal = legal_token_ids(tokenizer, task.alphabet, stop_id=stop_id)
    return HFPolicy(
        model,
        tokenizer,
        legal_ids=legal,
        stop_id=stop_id,
        grammar=task.grammar,
        grammar_threads=default_grammar_threads(device),
        decode=decode,
    )


def _stop_id(tokenizer: PreTrainedTokenizerBase, stop: str | None) -> int:
    """The task's stop token (CommonGen's ".") where the tokenizer has it as one token, else EOS."""
    if stop is not None:
        try:
            return stop_token_id(tokenizer, stop)
        except ValueError:
            _log.info("stop %r is not one token of this tokenizer; stopping at EOS", stop)
    return stop_token_id(tokenizer)


# Entries of the prefix-score cache for a task that declares no ``score_cache_size``: a long run
# visits millions of prefixes, and an entry (key tuple, two strings, a Score) costs a few hundred
# bytes, so 200k entries stay near 100 MB while every prefix of a recent batch stays cached.
DEFAULT_SCORE_CACHE_SIZE = 200_000


@dataclass(frozen=True)
class ScoredRows:
    """Per-prefix task rewards of B trajectories padded to T = max length.

    u: float64 [B, T+1], lambda S of each prefix at the scorer's ``reward_scale`` (0 after tau);
    scores: the terminal Score of each row; s: float64 [B, T+1], the task scores S themselves
    (0 after tau), from which a scheduled lambda rescales u.
    """

    u: np.ndarray
    scores: list[Score]
    s: np.ndarray


CacheKey = tuple[str, str, bool]
"""(prompt, text, finished): a prefix text equal to a finished text is a different entry when the
task scores prefixes differently."""


class ScoreCache:
    """Least-recently-used map (prompt, text, finished) -> Score of at most ``size`` entries."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size: must be >= 1, got {size}")
        self.size = size
        self._entries: OrderedDict[CacheKey, Score] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> Score | None:
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
        return hit

    def put(self, key: CacheKey, score: Score) -> None:
        self._entries[key] = score
        self._entries.move_to_end(key)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)


class PrefixScorer:
    """Scores every prefix of generated token sequences with the task, through one bounded cache.

    A row's last prefix (k = tau, the finished text) is scored by ``task.score``; its earlier
    prefixes (k < tau) by ``task.prefix_score`` when the task defines it (AMP: 0; CommonGen: no
    hard bonus, no validity), else by ``task.score`` too (Expr24 and SMILES score every prefix
    alike, and then a prefix and an equal finished text share one cache entry).
    The cache holds ``task.score_cache_size`` entries when the task declares it (Expr24), else
    :data:`DEFAULT_SCORE_CACHE_SIZE`. :meth:`score_many` is the only caller of the reward.
    Rewards are computed through ``rewards`` (default: serial, no warnings), which counts failed
    and non-finite rewards and may score the uncached prefixes of a batch in a worker pool.
    """

    def __init__(
        self,
        task: Task,
        policy: HFPolicy,
        reward_scale: float,
        rewards: RewardCaller | None = None,
    ) -> None:
        self.task = task
        self.reward_scale = float(reward_scale)
        self.rewards = rewards or RewardCaller(task)
        self._text_of = dict(zip(policy.legal_ids, policy.texts, strict=True))
        able = TaskCapabilities.of(task)
        self.cache = ScoreCache(able.score_cache_size or DEFAULT_SCORE_CACHE_SIZE)
        self._scores_prefixes = able.prefix_score is not None

    def texts(self, tokens: Sequence[int], text: str | None = None) -> list[str]:
        """Texts of the prefixes k = 0..len(tokens); ``text``, the whole row's text when the caller
        has it (a rollout), is sliced instead of concatenated again."""
        if text is None:
            text = "".join(self._text_of[int(t)] for t in tokens)
        ends = accumulate((len(self._text_of[int(t)]) for t in tokens), initial=0)
        return [text[:end] for end in ends]

    def score_many(self, prompt: str, texts: Sequence[str], finished: bool = True) -> list[Score]:
        """Task scores of ``texts`` for ``prompt`` (finished texts, or prefixes with
        ``finished=False``), uncached, in order, through the reward caller (a text whose reward
        raises or is not finite counts as invalid, and is counted)."""
        return self.rewards.score_many(prompt, texts, finished=finished)

    def scores(self, prompt: str, texts: Iterable[str], finished: bool = True) -> dict[str, Score]:
        """Score of each distinct text (finished, or unfinished prefixes): cached ones from the
        cache, the rest by one :meth:`score_many` call (then cached)."""
        finished = finished or not self._scores_prefixes
        found: dict[str, Score] = {}
        missing = []
        for text in dict.fromkeys(texts):
            hit = self.cache.get((prompt, text, finished))
            if hit is None:
                missing.append(text)
            else:
                found[text] = hit
        if missing:
            scored = self.score_many(prompt, missing, finished)
            for text, score in zip(missing, scored, strict=True):
                self.cache.put((prompt, text, finished), score)
                found[text] = score
        return found

    def score_text(self, prompt: str, text: str, finished: bool = True) -> Score:
        return self.scores(prompt, [text], finished)[text]

    def prefix_scores(self, prompt: str, prefixes: Sequence[str]) -> list[Score]:
        """Scores of one row's prefix texts k = 0..tau: the last finished, the others not."""
        found = self.scores(prompt, prefixes[:-1], finished=False)
        return [*(found[t] for t in prefixes[:-1]), self.score_text(prompt, prefixes[-1])]

    def score_rows(
        self,
        prompt: str,
        rows: Sequence[Sequence[int]],
        max_length: int,
        texts: Sequence[str] | None = None,
    ) -> ScoredRows:
        """Per-prefix rewards of token ``rows`` (with each row's text when known): every prefix of
        the batch scored through one :meth:`scores` call (two for a task with ``prefix_score``:
        the unfinished prefixes, then the finished texts)."""
        prefixes = [
            self.texts(tokens, None if texts is None else texts[b]) for b, tokens in enumerate(rows)
        ]
        if self._scores_prefixes:
            early = self.scores(prompt, (text for row in prefixes for text in row[:-1]), False)
            final = self.scores(prompt, (row[-1] for row in prefixes))
        else:
            early = final = self.scores(prompt, (text for row in prefixes for text in row))
        s = np.zeros((len(rows), max_length + 1))
        for b, row in enumerate(prefixes):
            s[b, : len(row)] = [early[text].value for text in row[:-1]] + [final[row[-1]].value]
        return ScoredRows(u=self.reward_scale * s, scores=[final[row[-1]] for row in prefixes], s=s)


def reference_log_prob(
    policy: HFPolicy, prompt: str | Sequence[str], tokens: torch.Tensor, length: torch.Tensor
) -> torch.Tensor:
    """log P_ref(prefix_k + stop) [B, T+1] from the frozen reference model (0 after tau)."""
    ref_pf, ref_pterm = policy.reference_score(prompt, tokens, length)
    cum = torch.cat([torch.zeros_like(ref_pf[:, :1]), torch.cumsum(ref_pf, dim=1)], dim=1)
    cols = torch.arange(ref_pterm.shape[1], device=ref_pterm.device)
    return torch.where(cols[None, :] <= length[:, None], cum + ref_pterm, 0.0)


def pad_rows(rows: Sequence[Sequence[int]], max_length: int, pad_id: int) -> torch.Tensor:
    """LongTensor [B, T] of token rows padded with ``pad_id``."""
    out = torch.full((len(rows), max_length), pad_id, dtype=torch.long)
    for b, tokens in enumerate(rows):
        if len(tokens) > max_length:
            raise ValueError(f"tokens: row {b} has {len(tokens)} > max_length {max_length}")
        out[b, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
    return out
