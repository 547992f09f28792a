"""A user task plugged in by dotted path: reward callable, alphabet, grammar file, lengths."""

from __future__ import annotations

import importlib
import json
import math
import re

import pytest
from typer.testing import CliRunner

from raptb.adapters.tasks.custom.task import CustomTask, load_callable
from raptb.app.cli import app
from raptb.app.configuration.config import ConfigError, build_config
from raptb.core.ports import Score

REWARDS = """
import math

def count_a(prompt, text):
    return text.count("a") / 5.0

def pair(prompt, text):
    return (1.0, text.endswith("b"))

def nan(prompt, text):
    return math.nan

BOOM_CALLS = []

def boom(prompt, text):
    BOOM_CALLS.append(text)
    raise RuntimeError("reward crashed")
"""


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_reward_return_forms(reward_module):
    task = CustomTask(load_callable(f"{reward_module}:count_a"))
    assert task.score("", "aab") == Score(0.4, True)
    assert CustomTask(load_callable(f"{reward_module}:pair")).score("", "ab") == Score(1.0, True)
    assert CustomTask(load_callable(f"{reward_module}:pair")).score("", "ba") == Score(1.0, False)
    assert CustomTask(load_callable(f"{reward_module}:nan")).score("", "a") == Score(0.0, False)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon", "expected 'module:function'"),
        ("missing_module_xyz:f", "cannot import module"),
        ("my_rewards:absent", "has no 'absent'"),
        ("my_rewards:math", "not callable"),
    ],
)
def test_bad_dotted_paths(reward_module, path, message):
    with pytest.raises(ValueError, match=message):
        load_callable(path)


def test_custom_task_needs_a_reward():
    with pytest.raises(ConfigError, match=r"custom\.reward"):
        build_config(overrides={"task": "custom"})


@pytest.mark.parametrize("replay", ["rp", "subm"])
def test_train_and_eval_a_custom_task(reward_module, tmp_path, replay):
    grammar = tmp_path / "ab.ebnf"
    grammar.write_text('root ::= [ab]+ "b"\n')
    config = tmp_path / "task.toml"
    config.write_text(
        'task = "custom"\n[custom]\nalphabet = "ab"\ngrammar_file = "'
        + str(grammar)
        + '"\nmin_length = 2\nmax_length = 6\nprompts = ["x:"]\n'
    )
    run = tmp_path / "run"
    runner = CliRunner()
    args = ["train", "--config", str(config), "--reward", f"{reward_module}:count_a"]
    args += ["--steps", "2", "--batch-size", "8", "--grad-accum", "1", "--out", str(run)]
    trained = runner.invoke(app, [*args, "--no-progress", "--replay", replay])
    assert trained.exit_code == 0, trained.output
    out = runner.invoke(app, ["eval", str(run), "--samples", "40", "--json"])
    assert out.exit_code == 0, out.output
    metrics = json.loads(out.stdout)
    rows = [json.loads(x) for x in (run / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 40
    for row in rows:
        assert 2 <= row["length"] <= 6 and re.fullmatch(r"[ab]+", row["text"])
        # the stop is allowed only where the grammar accepts, except when forced at max_length
        assert row["text"].endswith("b") or row["length"] == 6
        assert row["score"] == pytest.approx(row["text"].count("a") / 5.0)
    valid = [r for r in rows if r["valid"]]
    assert metrics["acc"] == pytest.approx(len(valid) / 40)
    assert metrics["score"] == pytest.approx(sum(r["score"] for r in valid) / len(valid))
    assert math.isfinite(metrics["log_pterm"]) and "prefix" in metrics


def test_a_crashing_reward_marks_samples_invalid(reward_module, tmp_path):
    cfg = build_config(
        overrides={
            "task": "custom",
            "custom.reward": f"{reward_module}:boom",
            "custom.alphabet": "ab",
            "optim.batch_size": 4,
            "optim.grad_accum": 1,
            "steps": 1,
            "replay.kind": "none",
        }
    )
    from raptb.app.training.train import Trainer

    calls = importlib.import_module(reward_module).BOOM_CALLS
    before = len(calls)
    trainer = Trainer(cfg, tmp_path / "r", progress=False)
    trainer.train()
    made = len(calls) - before
    (record,) = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    # every call the step made raised, and each was counted; every sample of the run is invalid
    assert made > 0 and record["reward_errors"] == made and record["reward_nonfinite"] == 0
    assert record["acc"] == 0.0 and record["unique_correct"] == 0
    assert math.isfinite(record["loss"])  # the step trained on the zero rewards
    assert trainer.scorer.score_text("", "ab") == Score(0.0, False)
