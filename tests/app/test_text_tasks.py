"""CommonGen and AMP through ``raptb train`` and ``raptb eval`` on the embedded tiny model, their
metrics recomputed from the written samples, and bad inputs as one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from raptb.adapters.lm.models import load_model_and_tokenizer
from raptb.adapters.tasks.amp.metrics import levenshtein_matrix
from raptb.adapters.tasks.amp.task import training_peptides
from raptb.adapters.tasks.commongen.data import load_concept_sets
from raptb.adapters.tasks.commongen.task import CommonGenTask
from raptb.adapters.tasks.registry import task_spec
from raptb.app.configuration.config import build_config
from tests.app.test_crash_safety import records, run_main

FAST = ["--steps", "2", "--batch-size", "8", "--grad-accum", "1", "--threads", "1"]
CONCEPTS = [
    {"concepts": ["dog", "run"], "references": ["A dog runs in the park.", "The dog ran."]},
    {"concepts": ["cat", "sit"], "references": ["The cat sits on the mat."]},
]


def samples(run: Path) -> list[dict]:
    lines = (run / "eval" / "samples.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_presets_carry_the_papers_columns() -> None:
    cg = build_config(None, {"task": "commongen"})
    assert (cg.steps, cg.optim.grad_accum, cg.replay.capacity) == (2500, 1, 100)
    r = cg.reward
    assert (r.kappa, r.reward_scale, r.reward_scale_end) == (1.0, 5.0, 50.0)
    assert (r.temperature, r.temperature_end) == (1.5, 1.0)
    o = cg.objective
    assert (o.eta, o.alpha, o.beta, o.rho, o.k_min) == (0.1, 0.8, 8.0, 0.5, (16, 8))
    assert cg.eval_sample_count == 320 and task_spec("commongen").eval_per_prompt
    assert task_spec("commongen").subm["shingle_on"] == "words"
    amp = build_config(None, {"task": "amp"})
    assert (amp.steps, amp.optim.clip, amp.replay.capacity) == (5000, 0.5, 200)
    # the paper's 4 micro-batches of 32 rows; the embedded model takes them as one micro-batch
    assert (amp.optim.batch_size, amp.optim.grad_accum) == (128, 1)
    pretrained = build_config(None, {"task": "amp", "model": "smollm2-135m"}).optim
    assert (pretrained.batch_size, pretrained.grad_accum) == (32, 4)
    o = amp.objective
    assert (o.eta, o.alpha, o.beta, o.rho, o.k_min) == (0.25, 0.5, 5.0, 0.1, (2, 2))
    assert amp.sampling.low_temp_prob == 0.0 and amp.eval_sample_count == 3200


def test_commongen_train_then_eval(tmp_path, capsys) -> None:
    prompts = tmp_path / "sets.jsonl"
    prompts.write_text("".join(json.dumps(s) + "\n" for s in CONCEPTS))
    run = tmp_path / "cg"
    args = ["train", "--task", "commongen", "--prompts", str(prompts), *FAST]
    code, err = run_main([*args, "--out", str(run), "--no-progress"], capsys)
    assert code == 0, err
    assert len(records(run)) == 2
    code, err = run_main(["eval", str(run), "--samples", "6", "--json"], capsys)
    assert code == 0, err
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    rows = samples(run)
    task = CommonGenTask(load_concept_sets(prompts))
    assert [r["prompt"] for r in rows] == [p for p in task.prompts() for _ in range(6)]
    # the reference model is the run's initial weights: its raw log-prob of the stop token
    model, tokenizer = load_model_and_tokenizer("tiny", seed=0)
    stop = tokenizer.encode(".", add_special_tokens=False)[0]
    for row in rows[:3]:
        prompt = tokenizer.encode(row["prompt"], add_special_tokens=False)
        ids = [tokenizer.bos_token_id, *prompt, *row["tokens"]]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        want = float(torch.log_softmax(logits.double(), -1)[stop])
        assert math.isclose(row["ref_log_pterm_stop"], want, abs_tol=1e-4)
        # u: the prefix score before the end, the finished score at it
        texts = [row["text"][:k] for k in range(row["length"] + 1)]  # one character per token
        want_u = [50.0 * task.prefix_score(row["prompt"], t).value for t in texts[:-1]]
        want_u.append(50.0 * task.score(row["prompt"], texts[-1]).value)
        np.testing.assert_allclose(row["u"], want_u, atol=1e-9)
    per_set = metrics["per_set"]
    assert set(per_set) == set(task.prompts())
    for prompt, cells in per_set.items():
        group = [r for r in rows if r["prompt"] == prompt]
        delta = np.mean([r["log_pterm_stop"] for r in group]) - np.mean(
            [r["ref_log_pterm_stop"] for r in group]
        )
        assert math.isclose(cells["DeltaLogPterm"], delta, abs_tol=1e-9)
        assert cells["Validity"] == np.mean([r["valid"] for r in group])
    for name in ("Entropy", "BLEU", "Len", "DeltaLogPterm", "Coverage", "Validity"):
        assert math.isclose(metrics[name], np.mean([c[name] for c in per_set.values()]))


def test_amp_train_then_eval_with_a_plugged_oracle(tmp_path, capsys) -> None:
    run = tmp_path / "amp"
    oracle = "tests.app.flaky_rewards:hydrophobic_oracle"
    args = ["train", "--task", "amp", "--oracle", oracle, *FAST, "--out", str(run)]
    code, err = run_main([*args, "--no-progress"], capsys)
    assert code == 0, err
    code, err = run_main(["eval", str(run), "--samples", "24", "--json"], capsys)
    assert code == 0, err
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    rows = samples(run)
    assert len(rows) == 24
    for row in rows:
        text = row["text"]
        assert row["valid"] and 5 <= len(text) <= 50
        assert row["score"] == pytest.approx(sum(c in "AILMFVW" for c in text) / len(text))
        assert row["u"] == [0.0] * row["length"] + [pytest.approx(50.0 * row["score"])]
    distinct: dict[str, float] = {}
    for row in rows:
        distinct.setdefault(row["text"], row["score"])
    top = sorted(distinct, key=lambda t: -distinct[t])  # stable: first occurrence wins ties
    assert metrics["TopK"] == len(top)
    assert metrics["Perf"] == pytest.approx(np.mean([distinct[t] for t in top]))
    assert metrics["Len"] == pytest.approx(np.mean([len(t) for t in top]))
    novelty = levenshtein_matrix(top, training_peptides()).min(axis=1).mean()
    assert metrics["Novelty"] == pytest.approx(novelty)


def test_amp_default_oracle_runs(tmp_path, capsys) -> None:
    pytest.importorskip("macrel")
    run = tmp_path / "amp"
    code, err = run_main(["train", "--task", "amp", *FAST, "--out", str(run)], capsys)
    assert code == 0, err
    code, err = run_main(["eval", str(run), "--samples", "8", "--json"], capsys)
    assert code == 0, err
    assert all(0.0 <= r["score"] <= 1.0 for r in samples(run))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "commongen", "--prompts", "EMPTY"], "no concept set (the file is empty)"),
        (["--task", "commongen", "--prompts", "missing.jsonl"], "cannot read"),
        (["--task", "amp", "--oracle", "nosuch:fn"], "amp.oracle: cannot import module"),
        (["--task", "amp", "--oracle", "json"], "expected 'module:function'"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, args, message) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    args = [str(empty) if a == "EMPTY" else a for a in args]
    code, err = run_main(["train", *args, "--steps", "1", "--out", str(tmp_path / "r")], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err


def test_an_oracle_that_raises_is_counted(tmp_path, capsys) -> None:
    run = tmp_path / "amp"
    oracle = "tests.app.flaky_rewards:broken_oracle"
    args = ["train", "--task", "amp", "--oracle", oracle, "--replay", "none", *FAST]
    args += ["--out", str(run)]
    code, err = run_main([*args, "--no-progress"], capsys)
    assert code == 0, err
    assert all(r["reward_errors"] > 0 for r in records(run))
    assert "oracle service down" in err
