"""AMP: generate antimicrobial peptides (paper appendix "AMP Biological Sequence Generation").

Prompt "Generate an antimicrobial peptide:"; the alphabet is the 20 standard amino-acid letters
and the grammar the released one (``adapters/tasks/amp/files/amp.ebnf``: one or more of them), so
the legal tokens of any tokenizer are those made only of these letters; 5..50 tokens.

Score: terminal only. S(x) = oracle probability that x is antimicrobial, in [0, 1]
(``adapters/tasks/amp/oracle.py``), so u_tau = lambda S with lambda = 50 and u_k = 0 for k < tau
(:meth:`AmpTask.prefix_score`, which the trainer must use for prefixes that are not the last).
A text with a letter outside the alphabet (possible through a custom tokenizer or a user's
samples) is invalid with score 0; the oracle never sees it. :meth:`AmpTask.score_batch` scores many
texts with one oracle call; :meth:`AmpTask.score` is the one-text form of the port.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from raptb.adapters.tasks.amp.metrics import TOP_K
from raptb.adapters.tasks.amp.oracle import (
    MACREL_ORACLE,
    CheckedOracle,
    Oracle,
    load_oracle,
    require_macrel,
)
from raptb.adapters.tasks.shipped_data import shipped_text
from raptb.core.ports import Score, check_length_bounds

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
DEFAULT_PROMPT = "Generate an antimicrobial peptide:"
_INVALID = Score(0.0, False)
_PREFIX = Score(0.0, True)


def amp_grammar() -> str:
    """The released AMP grammar (EBNF): one or more standard amino-acid letters."""
    return shipped_text("amp", "amp.ebnf")


def training_peptides() -> list[str]:
    """The 3,219 AMP training peptides, the novelty reference set (shipped data)."""
    return shipped_text("amp", "training_sequences.txt").split()


def is_peptide(text: str) -> bool:
    """Whether ``text`` is a non-empty string of the 20 standard amino-acid letters."""
    return bool(text) and set(text) <= set(AMINO_ACIDS)


@dataclass
class AmpTask:
    """The AMP task (implements :class:`raptb.core.ports.Task`; module doc for the reward)."""

    oracle: str | Oracle = MACREL_ORACLE
    min_length: int = 5
    max_length: int = 50
    prompt: str = DEFAULT_PROMPT
    top_k: int = TOP_K  # evaluation's top-k (amp_metrics); the reward does not use it
    name: str = field(default="amp", init=False)
    alphabet: str = field(default=AMINO_ACIDS, init=False)
    grammar: str = field(default_factory=amp_grammar, init=False)
    _oracle: CheckedOracle = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_length_bounds(self.min_length, self.max_length)
        if self.top_k < 1:
            raise ValueError(f"amp.top_k: must be >= 1, got {self.top_k}")
        if self.oracle == MACREL_ORACLE:
            require_macrel()  # fail at construction, with the install hint, not mid-training
        if isinstance(self.oracle, str):
            self._oracle = CheckedOracle(load_oracle(self.oracle), self.oracle)
        else:
            name = getattr(self.oracle, "__qualname__", type(self.oracle).__name__)
            self._oracle = CheckedOracle(self.oracle, name)

    def prompts(self) -> list[str]:
        """The single conditioning prompt."""
        return [self.prompt]

    def score_batch(self, prompt: str, texts: Sequence[str]) -> list[Score]:
        """Terminal scores of ``texts`` (prompt unused): one oracle call on the distinct valid
        unseen peptides (the trainer's reward caller batches through it)."""
        peptides = [t for t in texts if is_peptide(t)]
        probability = dict(zip(peptides, self._oracle(peptides), strict=True))
        return [Score(probability[t], True) if t in probability else _INVALID for t in texts]

    def score(self, prompt: str, text: str) -> Score:
        """S(text) = oracle probability (prompt unused); invalid (0) outside the alphabet."""
        return self.score_batch(prompt, [text])[0]

    def prefix_score(self, prompt: str, text: str) -> Score:
        """u_k = 0 for a prefix that is not the sample's last (terminal-only reward)."""
        return _PREFIX
