"""CommonGen metrics per concept set and averaged over sets (paper table "CommonGen performance").

Per concept set, over its N samples (N = 320 in the paper): Entropy (ragged token entropy of the
valid samples, ``core/metrics.py``), BLEU-4 (corpus BLEU of the valid samples' sentences as
written, final period included (``CommonGenTask.sentence``), against the set's references, every
sample sharing the same reference list; 0 without references or valid samples), Len (mean token
length of valid samples), Delta log p_term (trained minus reference model, on all the same
samples, ``core/metrics/termination.py``), Coverage (fraction of samples that are valid and use
every concept) and Validity (valid fraction). The summary is the plain mean of each metric over the
sets.

BLEU is sacrebleu's corpus BLEU-4 (case-sensitive, closest reference length, shorter on ties) with
no smoothing (``smooth_method="none"``) and its ``13a`` tokenisation. The official CommonGen
evaluation runs coco-caption's ``Bleu(4)`` (pycocoevalcap), which is unsmoothed too: a set whose
sentences share no 4-gram with the references scores 0 (coco's epsilons leave under 0.02 BLEU
there), where sacrebleu's default exponential smoothing would give it several points. On the same
tokens the two are the same formula (``tests/adapters/test_commongen_bleu.py`` holds ours to a
transcription of coco's scorer). Tokens differ: coco-caption's input is spaCy's English tokens;
spaCy needs a model download, and on this task's alphabet (letters, spaces and
``,;:'"!?.-()``) 13a splits the same punctuation off the words (the final period, commas,
brackets, quotes) and differs where spaCy splits clitics and hyphenated words ("boy's" -> "boy
's", "don't" -> "do n't", "ice-cream" -> "ice - cream"), which 13a keeps whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from raptb.adapters.tasks.commongen.task import CommonGenTask
from raptb.core.metrics import mean_length, ragged_token_entropy
from raptb.core.metrics.termination import delta_log_pterm

EVAL_SAMPLES_PER_SET = 320
METRIC_NAMES = ("Entropy", "BLEU", "Len", "DeltaLogPterm", "Coverage", "Validity")


@dataclass(frozen=True)
class SetSamples:
    """The evaluation samples of one prompt: texts, token ids, trained and reference log p_term."""

    prompt: str
    texts: Sequence[str]
    tokens: Sequence[Sequence[int]]
    log_pterm: Sequence[float]
    reference_log_pterm: Sequence[float]


def corpus_bleu(sentences: Sequence[str], references: Sequence[str]) -> float:
    """Unsmoothed corpus BLEU-4 (0..100, 13a tokens; module docstring) of ``sentences``, each
    against all of ``references``."""
    if not sentences or not references:
        return 0.0
    from sacrebleu.metrics import BLEU  # at use: a task lookup does not import sacrebleu

    streams = [[reference] * len(sentences) for reference in references]
    bleu = BLEU(tokenize="13a", smooth_method="none")
    return float(bleu.corpus_score(list(sentences), streams).score)


def set_metrics(task: CommonGenTask, samples: SetSamples) -> dict[str, float]:
    """The metrics of one concept set (module doc); texts exclude prompt and stop."""
    n = len(samples.texts)
    if n == 0:
        raise ValueError(f"commongen metrics: no samples for {samples.prompt!r}")
    if len(samples.tokens) != n:
        raise ValueError(f"commongen metrics: {n} texts but {len(samples.tokens)} token rows")
    parts = [task.parts(samples.prompt, text) for text in samples.texts]
    valid = [p.valid for p in parts]
    valid_texts = [t for t, ok in zip(samples.texts, valid, strict=True) if ok]
    valid_tokens = [tuple(r) for r, ok in zip(samples.tokens, valid, strict=True) if ok]
    return {
        "Entropy": ragged_token_entropy(valid_tokens),
        "BLEU": corpus_bleu(
            [task.sentence(t) for t in valid_texts], task.references(samples.prompt)
        ),
        "Len": mean_length([len(r) for r in samples.tokens], valid),
        "DeltaLogPterm": delta_log_pterm(samples.log_pterm, samples.reference_log_pterm),
        "Coverage": float(np.mean([p.valid and p.full_coverage for p in parts])),
        "Validity": float(np.mean(valid)),
    }


def commongen_metrics(
    task: CommonGenTask, per_set: Sequence[SetSamples]
) -> dict[str, Mapping[str, float]]:
    """Metrics per prompt plus ``"mean"``, the average of each metric over the sets."""
    if not per_set:
        raise ValueError("commongen metrics: no concept set was evaluated")
    table: dict[str, Mapping[str, float]] = {s.prompt: set_metrics(task, s) for s in per_set}
    table["mean"] = {
        name: float(np.mean([row[name] for row in table.values()])) for name in METRIC_NAMES
    }
    return table
