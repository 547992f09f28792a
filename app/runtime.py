"""Wiring shared by training and evaluation: task, model, policy and per-prefix rewards.

Per-prefix rewards (objectives.md): for a trajectory with tokens x_1..x_tau and every k <= tau,

    u_k     = lambda * S(x_1..x_k)                      (task-only part, scored on the text)
    log_r_k = kappa * log P_ref(x_1..x_k + stop) + u_k

with log P_ref(x_1..x_k + stop) = sum_{t<k} ref_log_pf[t] + ref_log_pterm[k] from the frozen
reference model (only computed when kappa > 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from raptb.adapters.custom import CustomTask
from raptb.adapters.expr24 import Expr24Task
from raptb.adapters.lora import apply_lora, load_adapter_weights, preferred_dtype
from raptb.adapters.models import load_model_and_tokenizer
from raptb.adapters.policy import HFPolicy, default_grammar_threads
from raptb.adapters.smiles import DEFAULT_SCAFFOLD, SmilesTask, read_scaffolds
from raptb.adapters.tokens import legal_token_ids, stop_token_id
from raptb.app.config import LoraConfig, TrainConfig
from raptb.app.reward_calls import RewardCaller
from raptb.core.ports import Score, Task

TASKS = ("expr24", "smiles", "custom")


def build_task(config: TrainConfig) -> Task:
    """The run's task: ``config.task`` with its options (``config.smiles``, ``config.custom``)."""
    name = config.task
    if name == "expr24":
        return Expr24Task()
    if name == "smiles":
        options = config.smiles
        scaffolds = (
            [DEFAULT_SCAFFOLD] if options.scaffolds is None else read_scaffolds(options.scaffolds)
        )
        return SmilesTask(
            scaffolds,
            min_length=options.min_length,
            max_length=options.max_length,
            ring_closures=options.ring_closures,
        )
    if name == "custom":
        custom = config.custom
        assert custom.reward is not None  # TrainConfig validates this
        return CustomTask.from_paths(
            custom.reward,
            alphabet=custom.alphabet,
            grammar_file=custom.grammar_file,
            min_length=custom.min_length,
            max_length=custom.max_length,
            prompts=custom.prompts,
        )
    raise ValueError(f"task: unknown task {name!r}; valid choices: {', '.join(TASKS)}")


def is_success(task: Task, score: Score) -> bool:
    """What counts as a hit for Acc (metrics.md): Expr24 equals 24, other tasks a valid text."""
    if task.name == "expr24":
        return score.valid and score.value == 1.0
    return score.valid


def build_policy(
    model_name: str,
    task: Task,
    seed: int,
    *,
    lora: LoraConfig | None = None,
    adapter: Path | None = None,
) -> HFPolicy:
    """The task's constrained policy on ``model_name`` ('tiny', 'smollm2-135m', a local directory
    or an HF id), on the GPU when there is one (bf16 where supported).

    lora: with ``lora.rank`` >= 1, the model is wrapped with LoRA adapters (adapters.lora);
        ``adapter``, a folder written by ``save_pretrained``, then supplies their trained weights.
    """
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = preferred_dtype(device)
    model, tokenizer = load_model_and_tokenizer(
        model_name, seed=seed, dtype=None if dtype == torch.float32 else dtype
    )
    model = model.to(device)
    if lora is not None and lora.rank:
        model = apply_lora(model, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout)
        if adapter is not None:
            load_adapter_weights(model, adapter)
    elif adapter is not None:
        raise ValueError("adapter: loading adapter weights needs lora.rank")
    stop_id = stop_token_id(tokenizer)
    legal = legal_token_ids(tokenizer, task.alphabet, stop_id=stop_id)
    return HFPolicy(
        model,
        tokenizer,
        legal_ids=legal,
        stop_id=stop_id,
        grammar=task.grammar,
        grammar_threads=default_grammar_threads(device),
    )


@dataclass(frozen=True)
class ScoredRows:
    """Per-prefix task rewards of B trajectories padded to T = max length.

    u: float64 [B, T+1] (0 after tau); scores: the terminal Score of each row.
    """

    u: np.ndarray
    scores: list[Score]


class PrefixScorer:
    """Scores every prefix of generated token sequences with the task (memoised by text).

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
        self._cache: dict[tuple[str, str], Score] = {}

    def texts(self, tokens: Sequence[int]) -> list[str]:
        """Texts of the prefixes k = 0..len(tokens)."""
        out = [""]
        for token in tokens:
            out.append(out[-1] + self._text_of[int(token)])
        return out

    def _fill(self, prompt: str, texts: Sequence[str]) -> None:
        """Score the texts not yet cached in one batched call."""
        missing = [t for t in dict.fromkeys(texts) if (prompt, t) not in self._cache]
        if missing:
            scores = self.rewards.score_many(prompt, missing)
            self._cache.update(((prompt, t), s) for t, s in zip(missing, scores, strict=True))

    def score_text(self, prompt: str, text: str) -> Score:
        self._fill(prompt, [text])
        return self._cache[(prompt, text)]

    def score_rows(self, prompt: str, rows: Sequence[Sequence[int]], max_length: int) -> ScoredRows:
        prefixes = [self.texts(tokens) for tokens in rows]
        self._fill(prompt, [text for texts in prefixes for text in texts])
        u = np.zeros((len(rows), max_length + 1))
        scores = []
        for b, texts in enumerate(prefixes):
            prefix_scores = [self._cache[(prompt, t)] for t in texts]
            u[b, : len(prefix_scores)] = [self.reward_scale * s.value for s in prefix_scores]
            scores.append(prefix_scores[-1])
        return ScoredRows(u=u, scores=scores)


def reference_log_prob(
    policy: HFPolicy, prompt: str, tokens: torch.Tensor, length: torch.Tensor
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
