"""AMP task, oracle plumbing and Jain et al. metrics."""

import math
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raptb.adapters.tasks.amp.metrics import amp_metrics, levenshtein_matrix, top_k
from raptb.adapters.tasks.amp.task import AMINO_ACIDS, AmpTask, training_peptides
from raptb.core.ports import Score, Task


def length_oracle(sequences: list[str]) -> list[float]:
    """A deterministic test oracle: length / 50."""
    length_oracle.calls.append(list(sequences))
    return [len(s) / 50 for s in sequences]


length_oracle.calls: list[list[str]] = []  # type: ignore[attr-defined]


def test_task_shape_and_shipped_data() -> None:
    task = AmpTask(oracle=length_oracle)
    assert isinstance(task, Task)
    assert (task.name, task.alphabet, task.min_length, task.max_length) == (
        "amp",
        AMINO_ACIDS,
        5,
        50,
    )
    assert task.grammar.startswith("root ::= amino_acid+")
    assert task.prompts() == ["Generate an antimicrobial peptide:"]
    peptides = training_peptides()
    assert len(peptides) == 3219 and all(set(p) <= set(AMINO_ACIDS) for p in peptides)


def test_terminal_only_score_batched_and_cached() -> None:
    length_oracle.calls.clear()
    task = AmpTask(oracle=length_oracle)
    scores = task.score_batch("p", ["ACDEF", "ACDEF", "AXZ", "", "KKKKKKKKKK"])
    assert scores == [
        Score(0.1, True),
        Score(0.1, True),
        Score(0.0, False),
        Score(0.0, False),
        Score(0.2, True),
    ]
    assert length_oracle.calls == [["ACDEF", "KKKKKKKKKK"]]  # distinct valid ones, one call
    assert task.score("p", "ACDEF") == Score(0.1, True) and len(length_oracle.calls) == 1
    assert task.prefix_score("p", "ACDEF") == Score(0.0, True)


def _install(name: str, fn: object) -> str:
    module = types.ModuleType(name)
    module.oracle = fn  # type: ignore[attr-defined]
    sys.modules[name] = module
    return f"{name}:oracle"


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda s: [0.5] * (len(s) + 1), "returned 2 values for 1 sequences"),
        (lambda s: [float("nan")] * len(s), "not a probability"),
        (lambda s: [1.5] * len(s), "not a probability"),
        (lambda s: ["x"] * len(s), "not a probability"),
    ],
)
def test_bad_oracle_outputs_name_the_function(fn: object, message: str) -> None:
    task = AmpTask(oracle=_install("raptb_test_bad_oracle", fn))
    with pytest.raises(ValueError, match=f"raptb_test_bad_oracle:oracle.*{message}"):
        task.score("p", "ACDEF")


def test_raising_oracle_and_bad_paths() -> None:
    def boom(sequences: list[str]) -> list[float]:
        raise KeyError("model file")

    task = AmpTask(oracle=_install("raptb_test_boom", boom))
    with pytest.raises(RuntimeError, match="raptb_test_boom:oracle: raised KeyError"):
        task.score("p", "ACDEF")
    with pytest.raises(ValueError, match="expected 'module:function'"):
        AmpTask(oracle="no_colon")
    with pytest.raises(ValueError, match="cannot import module"):
        AmpTask(oracle="raptb_no_such_module:f")
    with pytest.raises(ValueError, match="has no 'missing'"):
        AmpTask(oracle="math:missing")


def test_macrel_default_oracle() -> None:
    pytest.importorskip("macrel")
    pytest.importorskip("onnxruntime")
    task = AmpTask()
    [a, b] = task.score_batch("p", ["GLFDIVKKVVGALGSL", "DEDEDEDEDE"])
    assert a.valid and b.valid and 0.0 <= b.value < a.value <= 1.0


def slow_levenshtein(a: str, b: str) -> int:
    """Plain dynamic-programming edit distance (the independent reference)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, start=1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text("ACDK", max_size=12), min_size=1, max_size=5),
    st.lists(st.text("ACDK", max_size=12), min_size=1, max_size=5),
)
def test_levenshtein_matches_slow_reference(a: list[str], b: list[str]) -> None:
    expected = np.array([[slow_levenshtein(x, y) for y in b] for x in a])
    np.testing.assert_array_equal(levenshtein_matrix(a, b), expected)


def test_amp_metrics_hand_computed() -> None:
    sequences = ["AAAA", "AAAC", "AAAA", "CCCC", "KKKK"]
    scores = [0.9, 0.8, 0.9, 0.1, 0.99]
    valid = [True, True, True, True, False]
    assert top_k(sequences[:4], scores[:4], 2) == [0, 1]  # the duplicate AAAA counts once
    out = amp_metrics(sequences, scores, valid, training=["AAAA", "CCCA"], k=3)
    # top-3 distinct valid: AAAA (0.9), AAAC (0.8), CCCC (0.1); KKKK is invalid
    assert out["TopK"] == 3
    assert math.isclose(out["Perf"], (0.9 + 0.8 + 0.1) / 3)
    assert math.isclose(out["Div"], (1 + 4 + 3) / 3)  # d(AAAA,AAAC)=1, (AAAA,CCCC)=4, (AAAC,CCCC)=3
    assert math.isclose(out["Novelty"], (0 + 1 + 1) / 3)  # nearest training peptide
    assert out["Len"] == 4.0
    assert amp_metrics([], [], [], ["AAAA"])["Perf"] == 0.0


def test_runs_saved_with_the_former_default_oracle_path_get_the_default_oracle() -> None:
    from raptb.adapters.tasks.amp.oracle import FORMER_MACREL_ORACLE, MACREL_ORACLE
    from raptb.app.configuration.config import build_config

    saved = build_config(overrides={"task": "amp", "amp.oracle": FORMER_MACREL_ORACLE})
    assert saved.task_options().oracle == MACREL_ORACLE
    own = build_config(overrides={"task": "amp", "amp.oracle": "math:fsum"})
    assert own.task_options().oracle == "math:fsum"
