"""The per-prefix task reward u_k = lambda S(x_1..x_k) of every prefix of a trajectory
(objectives.md), the heart of the prefix objectives: :class:`PrefixScorer` scores the prefixes'
texts through the task (cached, batched, in a worker pool where configured) into
:class:`ScoredRows`; app.reward.reference adds the reference prior when kappa > 0.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from raptb.adapters.lm.policy import HFPolicy
from raptb.app.reward.calls import RewardCaller
from raptb.core.ports import Score, Task, TaskCapabilities

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
