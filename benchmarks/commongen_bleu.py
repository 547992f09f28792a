"""CommonGen BLEU: raptb's figure against the official evaluation's on 30 hand-written sentences.

Usage (from the repository root; needs ``spacy``, no model download):

    python benchmarks/commongen_bleu.py

Three sentences per diagnostic concept set, written by hand as a sampled text (without the stop
"."). Scored three ways, each per concept set then averaged over the sets (raptb's protocol) and
pooled over all sets (the official evaluation's, one corpus):

- raptb before: sacrebleu corpus BLEU-4 of the texts as sampled, without their final period;
- raptb now: ``commongen_metrics.corpus_bleu`` of ``CommonGenTask.sentence`` (final period
  included, 13a tokens);
- official: the CommonGen evaluation's BLEU-4 (coco-caption's corpus BLEU: n-gram counts clipped
  by their largest count in any one reference, each hypothesis's closest reference length, the
  brevity penalty on the sums, 1e-15 / 1e-9 guards on each precision) after spaCy's English
  tokenisation (``spacy.blank("en")``, the tokenizer of the model the evaluation loads; no
  lowercasing), written here from that definition.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
from sacrebleu.metrics import BLEU

from raptb.adapters.tasks.commongen.data import load_concept_sets
from raptb.adapters.tasks.commongen.metrics import corpus_bleu
from raptb.adapters.tasks.commongen.task import CommonGenTask

HYPOTHESES = (
    (
        "The player stands in the field and looks at the ball",
        "A man stood in the field looking at the sky",
        "The kids look at the field while they stand",
    ),
    (
        "A kid is dancing in her room",
        "The kids dance around the living room",
        "A little kid loves to dance in his room",
    ),
    (
        "A pet cat sleeps on the couch",
        "The cat is sleeping on a couch with its pet owner",
        "My pet cat likes the couch",
    ),
    (
        "A boy climbs the side of the building",
        "The man climbed up the side of a tall building",
        "Ivy climbs the side of the old building",
    ),
    (
        "The man talks about how to climb the wall",
        "A woman is talking near a climbing wall",
        "They talk before they climb the wall",
    ),
    (
        "The car drove through the snow",
        "She couldn't drive her car in the deep snow",
        "A man drives a car in the snow",
    ),
    (
        "A man wearing glasses talks on his phone",
        "The boy wears a hat while he talks on the phone",
        "I talk on the phone while wearing my coat",
    ),
    (
        "The hockey team plays at the rink",
        "Two teams are playing hockey on the ice rink",
        "The team practiced hockey in the rink",
    ),
    (
        "A surfer surfs in the ocean",
        "The surfer went to the ocean to surf",
        "Surfers surf the waves of the ocean",
    ),
    (
        "A boy jumps down a flight of stairs",
        "The dog jumps up the flight of stairs",
        "She had to jump down the stairs to catch her flight",
    ),
)

Pairs = Sequence[tuple[str, Sequence[str]]]


def official_bleu(pairs: Pairs, tokens: Callable[[str], list[str]]) -> float:
    """The CommonGen evaluation's corpus BLEU-4 (0..100) of (hypothesis, references) pairs."""
    matched, guessed = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for hypothesis, references in pairs:
        words = tokens(hypothesis)
        refs = [tokens(r) for r in references]
        hyp_len += len(words)
        ref_len += min((abs(len(r) - len(words)), len(r)) for r in refs)[1]
        for n in range(1, 5):
            grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
            most: Counter[tuple[str, ...]] = Counter()
            for r in refs:
                most |= Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            matched[n - 1] += sum(min(count, most[g]) for g, count in grams.items())
            guessed[n - 1] += max(0, len(words) - n + 1)
    product = math.prod((m + 1e-15) / (g + 1e-9) for m, g in zip(matched, guessed, strict=True))
    ratio = (hyp_len + 1e-15) / (ref_len + 1e-9)
    penalty = math.exp(1 - 1 / ratio) if ratio < 1 else 1.0
    return 100 * penalty * product ** (1 / 4)


def main() -> None:
    import spacy  # only this check needs it

    nlp = spacy.blank("en")

    def spacy_tokens(text: str) -> list[str]:
        return [token.text for token in nlp(text)]

    sets = load_concept_sets()
    task = CommonGenTask(sets)
    written = [[task.sentence(t) for t in texts] for texts in HYPOTHESES]
    refs = [s.references for s in sets]
    per_set = {
        "raptb before (no final period)": np.mean(
            [corpus_bleu(t, r) for t, r in zip(HYPOTHESES, refs, strict=True)]
        ),
        "raptb now": np.mean([corpus_bleu(t, r) for t, r in zip(written, refs, strict=True)]),
        "official": np.mean(
            [
                official_bleu([(h, r) for h in t], spacy_tokens)
                for t, r in zip(written, refs, strict=True)
            ]
        ),
    }
    # pooled: one corpus of all 30 (sacrebleu takes reference streams of equal length: the sets
    # with fewer references are padded with None, which sacrebleu skips)
    width = max(len(r) for r in refs)
    padded = [[*r, *[None] * (width - len(r))] for r in refs for _ in range(3)]
    streams = [[row[k] for row in padded] for k in range(width)]
    flat_texts = [t for texts in HYPOTHESES for t in texts]
    flat_written = [t for texts in written for t in texts]
    flat_refs = [r for r in refs for _ in range(3)]
    pooled = {
        "raptb before (no final period)": BLEU().corpus_score(flat_texts, streams).score,
        "raptb now": BLEU().corpus_score(flat_written, streams).score,
        "official": official_bleu(list(zip(flat_written, flat_refs, strict=True)), spacy_tokens),
    }
    print("| scoring | per-set mean | pooled |")
    print("|:--|--:|--:|")
    for name in per_set:
        print(f"| {name} | {per_set[name]:.2f} | {pooled[name]:.2f} |")


if __name__ == "__main__":
    main()
