"""docs/layout.md's table "Which path runs when" is ``adapters.lm.paths.which``, row by row, and a
live CPU policy's ``HFPolicy.paths`` is its row: the embedded GPT-2 and a LoRA-wrapped one, under
no grammar, an automaton's table and xgrammar, on one process and as a sharded model's."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest

from raptb.adapters.lm.lora import apply_lora
from raptb.adapters.lm.paths import DEVICES, GRAMMARS, MODELS, which
from raptb.adapters.tasks.expr24.task import Expr24Task
from tests.adapters.test_policy import make_policy

REPO = Path(__file__).resolve().parents[2]
LAYOUT = REPO / "docs" / "layout.md"


def table_rows(text: str) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(device, model, task grammar) -> (rollout, rescoring) of the section's table."""
    section = text[text.index("## Which path runs when") :]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["device", "model", "task grammar", "rollout", "rescoring"]
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        assert len(cells) == 5, line
        key = (cells[0], cells[1], cells[2])
        assert key not in rows, f"row twice: {key}"
        rows[key] = (cells[3], cells[4])
    return rows


def mismatches(rows: dict[tuple[str, str, str], tuple[str, str]]) -> list[str]:
    """What the table says differently from ``which`` (a missing row, an extra row, a module)."""
    wanted = set(itertools.product(DEVICES, MODELS, GRAMMARS))
    found = [f"missing: {key}" for key in sorted(wanted - set(rows))]
    found += [f"not a case: {key}" for key in sorted(set(rows) - wanted)]
    for key in sorted(wanted & set(rows)):
        if rows[key] != which(*key):
            found.append(f"{key}: the table says {rows[key]}, the code {which(*key)}")
    return found


def test_the_table_is_the_code() -> None:
    rows = table_rows(LAYOUT.read_text(encoding="utf-8"))
    assert mismatches(rows) == []
    for rollout, rescoring in rows.values():
        assert (REPO / rollout).is_file() and (REPO / rescoring).is_file()


def test_a_wrong_row_is_found() -> None:
    text = LAYOUT.read_text(encoding="utf-8")
    line = "| CUDA | the embedded GPT-2 | none | `adapters/lm/gpu/static_decode.py` |"
    assert line in text
    wrong = text.replace(line, "| CUDA | the embedded GPT-2 | none | `adapters/lm/rollout.py` |")
    assert mismatches(table_rows(wrong)) == [
        "('CUDA', 'the embedded GPT-2', 'none'): the table says ('adapters/lm/rollout.py', "
        "'adapters/lm/embedded/lean_gpt2.py'), the code ('adapters/lm/gpu/static_decode.py', "
        "'adapters/lm/embedded/lean_gpt2.py')"
    ]
    dropped = text.replace(line, "| CUDA | the embedded GPT-3 | none | `adapters/lm/rollout.py` |")
    assert len(mismatches(table_rows(dropped))) == 2  # a case missing, one that is not a case


def _policy(model: str, grammar: str):
    policy = make_policy(None if grammar == "none" else Expr24Task().grammar)
    if grammar == "automaton table":
        policy.automaton = Expr24Task().automaton
    if model == "any other transformers model":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            policy.model = apply_lora(policy.model, rank=2, dropout=0.0)
    return policy


@pytest.mark.parametrize(("model", "grammar"), list(itertools.product(MODELS, GRAMMARS)))
def test_a_live_policys_paths_are_its_row(model: str, grammar: str) -> None:
    policy = _policy(model, grammar)
    assert policy.paths == which("CPU", model, grammar)
    policy.step_together = lambda done: done  # as a model sharded across processes
    assert policy.paths == which("sharded", model, grammar)
