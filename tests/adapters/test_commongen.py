"""CommonGen: concept sets, reward components against hand-computed values, verb rule, metrics."""

import json
import math
from pathlib import Path

import pytest

from raptb.adapters.tasks.commongen.data import ConceptSet, load_concept_sets, prompt_text
from raptb.adapters.tasks.commongen.english import is_verb, lemma_forms, sentence_problems
from raptb.adapters.tasks.commongen.metrics import SetSamples, commongen_metrics, corpus_bleu
from raptb.adapters.tasks.commongen.task import CommonGenTask
from raptb.core.ports import Score, Task

SET = ConceptSet(("cat", "sit", "couch"), ("The cat sits on the couch.", "A cat is on a couch."))


def test_shipped_sets_and_prompts() -> None:
    diagnostic = load_concept_sets()
    assert len(diagnostic) == 10 and len(load_concept_sets("dev")) == 993
    assert diagnostic[0].concepts == ("field", "stand", "look")
    assert all(3 <= len(s.references) <= 4 for s in diagnostic)
    assert prompt_text(("field", "look")) == "Write one sentence using: field, look."
    task = CommonGenTask()
    assert isinstance(task, Task) and task.grammar is None and task.stop == "."
    assert (task.min_length, task.max_length) == (4, 20) and "." in task.alphabet
    assert task.prompts()[0] == "Write one sentence using: field, stand, look."


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no concept set"),
        ('{"concepts": []}\n', "at least 1"),
        ('{"concepts": ["a", 3]}\n', "list of non-empty strings"),
        ("[1]\n", "JSON object"),
        ("{oops\n", "not valid JSON"),
        ('{"concepts": ["a"]}\n{"concepts": ["A"]}\n', "repeats line 1"),
    ],
)
def test_bad_concept_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "sets.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_concept_sets(path)


def test_user_file_without_references(tmp_path: Path) -> None:
    path = tmp_path / "sets.jsonl"
    path.write_text(json.dumps({"concepts": ["Dog", "run"]}) + "\n")
    [concept_set] = load_concept_sets(path)
    assert concept_set == ConceptSet(("dog", "run"), ())
    task = CommonGenTask([concept_set])
    assert task.score(task.prompts()[0], "The dogs ran") == Score(1.0 + 0.0 + 1.0, True)


def test_reward_components_hand_computed() -> None:
    task = CommonGenTask([SET])
    prompt = task.prompts()[0]
    # "The cat sat": concepts cat (exact) and sit (sat -> sit) present, couch missing.
    # Bigrams (the cat)(cat sat); vs reference 1 (the cat)(cat sits)(sits on)(on the)(the couch):
    # overlap 1, P 1/2, R 1/5 -> F1 2/7; vs reference 2: (a cat)... overlap 0. Quality 2/7.
    parts = task.parts(prompt, "The cat sat")
    assert math.isclose(parts.coverage, 2 / 3) and math.isclose(parts.quality, 2 / 7)
    assert not parts.full_coverage and parts.valid
    assert math.isclose(task.prefix_score(prompt, "The cat sat").value, 2 / 3 + 2 / 7)
    assert math.isclose(task.score(prompt, "The cat sat").value, 2 / 3 + 2 / 7)
    # Full coverage and an exact reference: 1 + 1 + hard bonus 1.
    assert task.score(prompt, "The cat sits on the couch") == Score(3.0, True)
    assert task.prefix_score(prompt, "The cat sits on the couch") == Score(2.0, True)
    # Invalid finished sentence (lower-case start) scores 0; its prefix score is unaffected.
    assert task.score(prompt, "the cat sits on the couch") == Score(0.0, False)
    weighted = CommonGenTask([SET], coverage_weight=2.0, quality_weight=0.5, hard_coverage_bonus=3)
    assert weighted.score(prompt, "The cat sits on the couch") == Score(2.0 + 0.5 + 3.0, True)


def test_bleu_quality_and_errors() -> None:
    task = CommonGenTask([SET], quality="bleu")
    prompt = task.prompts()[0]
    assert task.parts(prompt, "The cat sits on the couch.").quality == 1.0
    assert task.parts(prompt, "").quality == 0.0
    with pytest.raises(ValueError, match=r"commongen\.quality"):
        CommonGenTask([SET], quality="rouge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not one of this task's prompts"):
        task.score("Write one sentence using: x.", "Hi there")
    with pytest.raises(ValueError, match="listed twice"):
        CommonGenTask([SET, SET])


def test_lemma_forms_and_verb_rule() -> None:
    assert {"stand"} <= lemma_forms("stood") and {"sit"} <= lemma_forms("sitting")
    assert {"carry"} <= lemma_forms("carried") and lemma_forms("red") == {"red"}
    for verb in ("is", "stood", "dancing", "hopped", "bakes", "carries", "wore", "surf"):
        assert is_verb(verb), verb
    for other in ("table", "the", "quickly", "red", "couch"):
        assert not is_verb(other), other


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("The cat sits on the couch", None),
        (" A kid is dancing in the room!", None),
        ("the cat sits", "capital"),
        ("The 3 cats sit", "characters"),
        ("The caf\u00e9 opens", "characters"),
        ("He sat. She ran", "more than one sentence"),
        ("Sits", "fewer than 2 words"),
        ("The red table", "no verb"),
    ],
)
def test_sentence_validity(text: str, problem: str | None) -> None:
    problems = sentence_problems(text)
    assert (not problems) if problem is None else any(problem in p for p in problems)


def test_commongen_metrics_hand_computed() -> None:
    task = CommonGenTask([SET])
    prompt = task.prompts()[0]
    texts = ["The cat sits on the couch", "The cat sat", "the couch"]
    tokens = [[1, 2, 3, 4, 5, 6], [1, 2, 7], [1, 5]]
    table = commongen_metrics(task, [SetSamples(prompt, texts, tokens, [-1, -2, -3], [-2, -2, -2])])
    row = table[prompt]
    assert table["mean"] == row
    assert math.isclose(row["Validity"], 2 / 3) and math.isclose(row["Coverage"], 1 / 3)
    assert row["Len"] == 4.5 and math.isclose(row["DeltaLogPterm"], 0.0)
    # valid rows [1..6] and [1,2,7]: position 2 has tokens {3, 7} -> ln 2; positions 3.. have one
    # survivor (skipped); positions 0, 1 entropy 0 -> mean (0 + 0 + ln 2) / 3
    assert math.isclose(row["Entropy"], math.log(2) / 3, rel_tol=1e-6)
    assert math.isclose(row["BLEU"], corpus_bleu([t + "." for t in texts[:2]], SET.references))
    sentence = "The cat sits on the couch ."
    assert math.isclose(corpus_bleu([sentence], [sentence]), 100.0)
    assert corpus_bleu([], ["x"]) == 0.0


def test_bleu_scores_the_sentences_as_written_against_hand_computed_bleu() -> None:
    dogs = ConceptSet(
        ("dog", "run", "park"), ("A dog runs in the park.", "The dog is running on the grass.")
    )
    task = CommonGenTask([dogs])
    # texts exclude the stop "."; the third already ends with its own mark and keeps it alone
    texts = ["The dog runs in the park", "A dog is running", "Dogs, run!"]
    assert [task.sentence(t) for t in texts] == [
        "The dog runs in the park.",
        "A dog is running.",
        "Dogs, run!",
    ]
    samples = SetSamples(dogs.prompt, texts, [[1]] * 3, [0.0] * 3, [0.0] * 3)
    bleu = commongen_metrics(task, [samples])[dogs.prompt]["BLEU"]
    # By hand, 13a tokens (punctuation split off, case kept). References:
    #   A dog runs in the park .  (7)      The dog is running on the grass .  (8)
    # Hypotheses, n-grams found in a reference / n-grams, for n = 1..4:
    #   The dog runs in the park .  (7):  7/7  6/6  4/5 ("The dog runs" is in neither)  3/4
    #   A dog is running .          (5):  5/5  3/4 ("running ." is not)  1/3  0/2
    #   Dogs , run !                (4):  0/4  0/3  0/2  0/1
    # closest reference lengths 7, 7, 7: c = 16, r = 21, brevity penalty exp(1 - r / c)
    precisions = [12 / 16, 9 / 13, 5 / 10, 3 / 7]
    by_hand = math.exp(1 - 21 / 16) * math.prod(precisions) ** (1 / 4) * 100
    assert bleu == pytest.approx(by_hand, rel=1e-9)
    assert round(by_hand, 2) == 42.25
