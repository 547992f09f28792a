"""``raptb eval``: files, sample invariants, metrics recomputation, seeding, checkpoint choice, CLI.

The run directory is built by hand (config.toml plus two checkpoints of the tiny model with
different weights), so these tests do not depend on the trainer. References: the Expr24 language
as a regex, the exact evaluator for scores, ``expr24_metrics`` recomputed from samples.jsonl, and
a teacher-forced rescoring of the samples under each checkpoint's model.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from raptb.adapters.lm.models import load_model_and_tokenizer
from raptb.adapters.tasks.expr24.metrics import expr24_metrics
from raptb.adapters.tasks.expr24.task import Expr24Task, enumerate_solutions, evaluate_expression
from raptb.app.cli import app
from raptb.app.configuration.config import RewardConfig, TrainConfig
from raptb.app.evaluation.eval_run import EvalError
from raptb.app.evaluation.evaluate import evaluate
from raptb.app.run_dir.run_config import save_config
from raptb.app.task_and_policy import build_policy, pad_rows
from tests.core.test_vendi import authors_score_k, set_jaccard

torch.set_num_threads(1)

N = 64
SENTENCE = re.compile(r"[1-9]([-+*/][1-9])*")
LATEST, OLDER = "step-000010", "step-000002"
PLOTS = ("length_histogram.png", "prefix_diagnostics.png", "score_by_length.png", "pass_at_k.png")
REWARD_SCALE = 7.0


def write_checkpoint(run: Path, name: str, model_seed: int) -> Path:
    folder = run / "checkpoints" / name / "model"
    folder.mkdir(parents=True)
    model, tokenizer = load_model_and_tokenizer("tiny", seed=model_seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Y* cached in a temporary folder for the whole module (computed once, ~2 s)."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAPTB_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory that has never been evaluated (copy it before evaluating)."""
    run = tmp_path_factory.mktemp("template") / "run"
    run.mkdir()
    config = TrainConfig(eval_samples=12, threads=1, reward=RewardConfig(reward_scale=7.0))
    save_config(config, run / "config.toml")
    write_checkpoint(run, OLDER, model_seed=1)
    write_checkpoint(run, LATEST, model_seed=2)
    records = [{"step": 1, "loss": 3.0, "log_z": 0.1}, {"step": 2, "loss": 2.5, "log_z": 0.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.fixture
def run_dir(template: Path, tmp_path: Path, cache_dir: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "run"))


@pytest.fixture(scope="module")
def evaluated(template: Path, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A copy of the run evaluated once with N samples, seed 0, batch size 24 (three chunks)."""
    run = Path(shutil.copytree(template, tmp_path_factory.mktemp("evaluated") / "run"))
    evaluate(run, samples=N, seed=0, batch_size=24, progress=False)
    return run


def read_samples(run: Path) -> list[dict[str, Any]]:
    lines = (run / "eval" / "samples.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def read_metrics(run: Path) -> dict[str, Any]:
    return json.loads((run / "eval" / "metrics.json").read_text())


def test_writes_every_file(evaluated: Path) -> None:
    out = evaluated / "eval"
    assert len(read_samples(evaluated)) == N
    assert read_metrics(evaluated)["n_samples"] == N
    # the run has a metrics.jsonl, so the training curves are plotted too
    for name in (*PLOTS, "training_curves.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert not list(out.glob(".*")), "a temporary file was left behind"


def test_samples_respect_grammar_lengths_and_scores(evaluated: Path) -> None:
    _, tokenizer = load_model_and_tokenizer(str(evaluated / "checkpoints" / LATEST / "model"))
    task = Expr24Task()
    for row in read_samples(evaluated):
        text, tau = row["text"], row["length"]
        assert SENTENCE.fullmatch(text), text
        assert 3 <= tau <= 9 and len(row["tokens"]) == tau == len(text)
        assert tokenizer.decode(row["tokens"]) == text
        assert row["prompt"] == task.prompt
        assert row["valid"] is True
        assert row["score"] == (1.0 if evaluate_expression(text) == 24 else 0.0)
        assert len(row["log_pf"]) == tau and len(row["log_pterm"]) == tau + 1
        assert row["log_pterm_stop"] == row["log_pterm"][tau]
        assert max(row["log_pf"] + row["log_pterm"]) < 0.0
        # u_k = lambda * S(first k characters): only a complete prefix equal to 24 scores
        expected_u = [
            REWARD_SCALE if evaluate_expression(text[:k]) == 24 else 0.0 for k in range(tau + 1)
        ]
        assert row["u"] == expected_u


def test_metrics_equal_recomputation_from_samples(evaluated: Path) -> None:
    metrics = read_metrics(evaluated)
    meta = metrics.pop("eval")
    rows = read_samples(evaluated)
    # every task's pass@k and Vendi score: the binomial ratio in integers, and the Vendi score of
    # the full kernel of the correct samples (Jaccard of character 2-gram Python sets, Expr24's
    # SubM kernel), each duplicate its own row
    n, c = len(rows), sum(r["correct"] for r in rows)
    assert metrics.pop("pass_at_k") == pytest.approx(
        {str(k): 1 - math.comb(n - c, k) / math.comb(n, k) for k in (1, 8, 64)} | {"256": None}
    )
    texts = [r["text"] for r in rows if r["correct"]]
    kernel = np.array([[set_jaccard(a, b) for b in texts] for a in texts]).reshape(c, c)
    assert metrics.pop("vendi") == pytest.approx(authors_score_k(kernel) if c else 0.0)
    info = metrics.pop("vendi_info")
    assert (info["samples"], info["distinct"], info["subsampled"]) == (c, len(set(texts)), False)
    assert info["kernel"] == "jaccard, 2-grams of the text"
    assert metrics == expr24_metrics(rows, enumerate_solutions())
    assert meta == {
        "checkpoint": LATEST,
        "step": 10,
        "model": "tiny",
        "seed": 0,
        "batch_size": 24,
        "temperature": 1.0,
    }


def test_log_probs_are_the_latest_checkpoints(evaluated: Path) -> None:
    rows = read_samples(evaluated)
    task = Expr24Task()
    length = torch.tensor([r["length"] for r in rows])
    deviation = {}
    for name in (LATEST, OLDER):
        policy = build_policy(str(evaluated / "checkpoints" / name / "model"), task, seed=0)
        tokens = pad_rows([r["tokens"] for r in rows], task.max_length, policy.pad_id)
        with torch.no_grad():
            log_pf, log_pterm = policy.score(task.prompt, tokens, length)
        deviation[name] = max(
            max(abs(a - b) for a, b in zip(r["log_pf"] + r["log_pterm"], pf + pt, strict=True))
            for r, pf, pt in zip(
                rows,
                [row[:tau] for row, tau in zip(log_pf.tolist(), length.tolist(), strict=True)],
                [
                    row[: tau + 1]
                    for row, tau in zip(log_pterm.tolist(), length.tolist(), strict=True)
                ],
                strict=True,
            )
        )
    assert deviation[LATEST] < 1e-5
    assert deviation[OLDER] > 1e-3


def test_same_seed_same_samples_other_seed_differs(run_dir: Path) -> None:
    samples_file = run_dir / "eval" / "samples.jsonl"
    evaluate(run_dir, samples=32, seed=5, progress=False)
    first = samples_file.read_bytes()
    evaluate(run_dir, samples=32, seed=5, progress=False)
    assert samples_file.read_bytes() == first
    evaluate(run_dir, samples=32, seed=6, progress=False)
    assert samples_file.read_bytes() != first


def test_samples_default_to_the_configs_eval_samples(run_dir: Path) -> None:
    metrics = evaluate(run_dir, progress=False)
    assert metrics["n_samples"] == 12 == len(read_samples(run_dir))
    assert metrics == read_metrics(run_dir)


def test_training_curves_only_with_a_metrics_log(run_dir: Path) -> None:
    (run_dir / "metrics.jsonl").unlink()
    evaluate(run_dir, samples=4, progress=False)
    names = {p.name for p in (run_dir / "eval").iterdir()}
    assert names == {"samples.jsonl", "metrics.json", *PLOTS}


@pytest.mark.parametrize(
    ("change", "kwargs", "message"),
    [
        ("none", {"samples": 0}, "samples: must be >= 1"),
        ("none", {"batch_size": 0}, "batch_size: must be >= 1"),
        ("no-config", {}, "has no config.toml"),
        ("no-checkpoint", {}, "has no checkpoint"),
        ("no-model", {}, "has no model/ folder"),
    ],
)
def test_bad_run_dirs_raise_clear_errors(
    run_dir: Path, change: str, kwargs: dict[str, int], message: str
) -> None:
    if change == "no-config":
        (run_dir / "config.toml").unlink()
    elif change == "no-checkpoint":
        shutil.rmtree(run_dir / "checkpoints")
    elif change == "no-model":  # in every checkpoint: a bad newest one falls back to an older
        for name in (LATEST, OLDER):
            shutil.rmtree(run_dir / "checkpoints" / name / "model")
    with pytest.raises(EvalError, match=re.escape(message)):
        evaluate(run_dir, progress=False, **kwargs)
    assert not (run_dir / "eval").exists()


def test_cli_json_prints_only_the_metrics(run_dir: Path) -> None:
    args = ["eval", str(run_dir), "--samples", "16", "--seed", "3", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload == read_metrics(run_dir)
    assert payload["n_samples"] == 16 and payload["eval"]["seed"] == 3


def test_cli_table_names_headline_metrics_and_output(run_dir: Path) -> None:
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--samples", "8"])
    assert result.exit_code == 0, result.output
    for key in ("acc", "cov_count", "norm_cov", "kl_p_pi", "js_tok", "entropy"):
        assert key in result.stdout
    assert "metrics.json" in result.stdout
    # the coverage in context: found of |Y*|, and the target's expectation at the same N,
    # 75,445 (1 - (1 - 1/75,445)^8) = 7.9996 (rounded to 8 in the line)
    metrics = read_metrics(run_dir)
    line = " ".join(result.stdout.split())
    assert f"found {metrics['cov_count']} of the 75,445 solutions in N = 8 samples" in line
    assert "would find 8 in expectation (NormCov 1.000)" in line


@pytest.mark.parametrize("case", ["missing-run-dir", "no-checkpoint", "zero-samples"])
def test_cli_bad_input_exits_2_with_one_line(run_dir: Path, case: str) -> None:
    target, extra = run_dir, ["--samples", "4"]
    if case == "missing-run-dir":
        target = run_dir / "absent"
    elif case == "no-checkpoint":
        shutil.rmtree(run_dir / "checkpoints")
    else:
        extra = ["--samples", "0"]
    result = CliRunner().invoke(app, ["eval", str(target), *extra])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr


def test_an_rl_run_is_sampled_at_its_training_temperature_unless_told(run_dir: Path) -> None:
    """A PPO run trained at rl.temperature 0.7 is evaluated at 0.7 (the same draw as asking for
    0.7), not at 1; ``temperature`` overrides it."""
    config = TrainConfig(
        loss="ppo", eval_samples=12, threads=1, rl={"temperature": 0.7}, replay={"kind": "none"}
    )
    save_config(config, run_dir / "config.toml")
    samples_file = run_dir / "eval" / "samples.jsonl"
    evaluate(run_dir, samples=32, seed=3, progress=False)
    default = samples_file.read_bytes()
    assert read_metrics(run_dir)["eval"]["temperature"] == 0.7
    evaluate(run_dir, samples=32, seed=3, progress=False, temperature=0.7)
    assert samples_file.read_bytes() == default
    evaluate(run_dir, samples=32, seed=3, progress=False, temperature=1.0)
    assert samples_file.read_bytes() != default
    assert read_metrics(run_dir)["eval"]["temperature"] == 1.0


def test_cli_temperature_sets_the_sampling_temperature(run_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["eval", str(run_dir), "--samples", "4", "--temperature", "0.5", "--json"]
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["eval"]["temperature"] == 0.5
    bad = CliRunner().invoke(app, ["eval", str(run_dir), "--samples", "4", "--temperature", "0"])
    assert bad.exit_code == 2
    assert bad.stderr.strip() == "error: temperature: must be finite and > 0, got 0.0"
