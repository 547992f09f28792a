"""CommonGen concept sets: the shipped validation split, the paper's diagnostic subset, user files.

A concept-set file is JSON Lines, one object per line: ``{"concepts": [...], "references":
[...]}`` (``references`` optional; without them the quality shaping and BLEU-4 are 0). The shipped
split is ``adapters/tasks/commongen/files/dev.jsonl`` (993 sets, provenance in the README.md
beside it).

The prompt text is formed in one place, :func:`prompt_text`: "Write one sentence using: field,
stand, look." with the concepts in file order (the wording is ours, after the released code's
instruction naming the concepts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raptb.adapters.tasks.shipped_data import shipped_text

PROMPT_TEMPLATE = "Write one sentence using: {concepts}."
DEV_SOURCE = "dev"
DIAGNOSTIC_SOURCE = "diagnostic"
# The paper's appendix table "Diagnostic subset of CommonGen", in its order (as unordered sets).
DIAGNOSTIC_SETS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        "field look stand",
        "kid room dance",
        "cat pet couch",
        "climb building side",
        "climb wall talk",
        "drive snow car",
        "talk wear phone",
        "hockey rink team",
        "ocean surfer surf",
        "stair jump flight",
    )
)


@dataclass(frozen=True)
class ConceptSet:
    """One CommonGen input: its concepts (lower-case, file order) and human reference sentences."""

    concepts: tuple[str, ...]
    references: tuple[str, ...] = ()

    @property
    def prompt(self) -> str:
        """The conditioning prompt of this set (:func:`prompt_text`)."""
        return prompt_text(self.concepts)


def prompt_text(concepts: tuple[str, ...]) -> str:
    """The instruction naming ``concepts``, e.g. "Write one sentence using: field, stand, look."."""
    return PROMPT_TEMPLATE.format(concepts=", ".join(concepts))


def _string_list(value: object, field: str, where: str, *, min_items: int) -> tuple[str, ...]:
    """``value`` as a tuple of stripped non-empty strings, or a ValueError naming ``where``."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"{where}: '{field}' must be a list of non-empty strings")
    if len(value) < min_items:
        raise ValueError(f"{where}: '{field}' needs at least {min_items} item(s), got {len(value)}")
    return tuple(v.strip() for v in value)


def parse_concept_sets(text: str, source: str) -> list[ConceptSet]:
    """Concept sets from JSON Lines ``text`` (blank lines skipped); ``source`` names it in errors.

    Raises:
        ValueError: one line naming the source and line for an empty file, a line that is not a
            JSON object, a set without concepts, or a concept set listed twice.
    """
    sets: list[ConceptSet] = []
    seen: dict[tuple[str, ...], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object with 'concepts' and 'references'")
        concepts = tuple(
            c.lower() for c in _string_list(record.get("concepts"), "concepts", where, min_items=1)
        )
        references = _string_list(record.get("references", []), "references", where, min_items=0)
        if concepts in seen:
            raise ValueError(
                f"{where}: the concept set {list(concepts)} repeats line {seen[concepts]}"
            )
        seen[concepts] = number
        sets.append(ConceptSet(concepts, references))
    if not sets:
        raise ValueError(f"{source}: no concept set (the file is empty)")
    return sets


def dev_concept_sets() -> list[ConceptSet]:
    """The shipped CommonGen validation split (993 sets, file order)."""
    return parse_concept_sets(
        shipped_text("commongen", "dev.jsonl"), "tasks/commongen/files/dev.jsonl"
    )


def diagnostic_concept_sets() -> list[ConceptSet]:
    """The paper's 10 diagnostic sets, in the appendix table's order, with their references."""
    by_set = {frozenset(s.concepts): s for s in dev_concept_sets()}
    return [by_set[concepts] for concepts in DIAGNOSTIC_SETS]


def load_concept_sets(source: str | Path = DIAGNOSTIC_SOURCE) -> list[ConceptSet]:
    """``"diagnostic"`` (the paper's 10), ``"dev"`` (all 993 shipped) or a JSON Lines file path."""
    if source == DIAGNOSTIC_SOURCE:
        return diagnostic_concept_sets()
    if source == DEV_SOURCE:
        return dev_concept_sets()
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"commongen.prompts: cannot read {path} ({exc.strerror})") from None
    return parse_concept_sets(text, str(path))
