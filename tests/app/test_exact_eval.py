"""``raptb eval RUN --exact``: exact.json from a hand-built run, the comparison with a sampled
evaluation of the same checkpoint, stale and non-enumerable cases, the CLI.

References: ``exact_log_probs`` called directly on the checkpoint's model, metrics.json of the
sampled evaluation, and the core metric functions.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from raptb.adapters.lm.exact import exact_log_probs
from raptb.adapters.lm.models import load_model_and_tokenizer
from raptb.adapters.tasks.expr24.task import Expr24Task, enumerate_solutions
from raptb.app.cli import app
from raptb.app.configuration.config import TrainConfig
from raptb.app.evaluation.eval_run import EvalError
from raptb.app.evaluation.evaluate import evaluate
from raptb.app.evaluation.exact_eval import EXACT_FILE, exact_evaluate, exact_task_metrics
from raptb.app.run_dir.run_config import save_config
from raptb.app.task_and_policy import build_policy

torch.set_num_threads(1)
CHECKPOINT = "step-000004"
N = 96


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A run with one checkpoint of the tiny model, evaluated by sampling (N draws) first."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAPTB_CACHE_DIR", str(cache))
        run = tmp_path_factory.mktemp("exact") / "run"
        folder = run / "checkpoints" / CHECKPOINT / "model"
        folder.mkdir(parents=True)
        model, tokenizer = load_model_and_tokenizer("tiny", seed=3)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        save_config(TrainConfig(eval_samples=N, threads=1), run / "config.toml")
        evaluate(run, samples=N, seed=0, batch_size=N, progress=False)
        result = CliRunner().invoke(app, ["eval", str(run), "--exact"])
        assert result.exit_code == 0, result.output
        assert "acc = pi(Y*)" in result.output
        # beside the policy's E distinct, what sampling p* itself would give at the same N
        expected = 75_445 * (1 - (1 - 1 / 75_445) ** N)
        assert f"E distinct, N={N}, sampling p*" in result.output
        assert f"{expected:.2f}" in result.output
        for line in ("TV(pi, p*), all texts", "uniformity", "active modes, 90%", "E distinct at N"):
            assert line in result.output
        yield run


def test_exact_json_matches_direct_computation(run: Path) -> None:
    exact = json.loads((run / "eval" / EXACT_FILE).read_text())
    task = Expr24Task()
    policy = build_policy(str(run / "checkpoints" / CHECKPOINT / "model"), task, seed=0)
    direct = exact_log_probs(
        policy, task.prompt, enumerate_solutions(), min_length=3, max_length=9
    ).log_prob
    assert exact["acc"] == pytest.approx(math.exp(np.logaddexp.reduce(direct)), rel=1e-6)
    assert exact["n_solutions"] == 75_445
    assert sum(exact["mass_by_length"].values()) == pytest.approx(exact["acc"], rel=1e-9)
    assert set(exact["mass_by_length"]) == {"3", "5", "7", "9"}
    assert exact["kl_target_pi"] > 0
    assert exact["target_expected_distinct"][str(N)] == pytest.approx(
        75_445 * (1 - (1 - 1 / 75_445) ** N), rel=1e-9
    )
    assert exact["eval"]["checkpoint"] == CHECKPOINT and exact["eval"]["step"] == 4
    assert exact["timings"]["total_s"] > 0
    # the distances, uniformity and modes from the direct log-probs by plain numpy formulas
    pi = np.exp(direct)
    q, p = pi / pi.sum(), np.full(pi.size, 1 / pi.size)
    assert exact["tv_target_pi"] == pytest.approx(0.5 * np.abs(q - p).sum(), rel=1e-6)
    tv_all = 0.5 * (np.abs(pi - p).sum() + 1 - pi.sum())
    assert exact["tv_target_pi_all"] == pytest.approx(tv_all, rel=1e-6)
    positive = q > 0
    entropy = -np.sum(q[positive] * np.log(q[positive]))
    assert exact["kl_pi_target"] == pytest.approx(math.log(pi.size) - entropy, rel=1e-6)
    assert exact["uniformity"] == pytest.approx(entropy / math.log(pi.size), rel=1e-6)
    assert exact["kl_target_pi_all"] == pytest.approx(np.mean(np.log(p / pi)), rel=1e-6)
    acc = pi.sum()
    assert exact["pass_at_k"]["64"] == pytest.approx(1 - (1 - acc) ** 64, rel=1e-6)
    ranked = np.cumsum(np.sort(q)[::-1])
    for share in (50, 90):
        assert exact["active_modes"][str(share)] == int(np.argmax(ranked >= share / 100)) + 1
    curve = {str(n): float(np.sum(1 - (1 - pi) ** n)) for n in (64, 128, 256, 4096, 6400)}
    assert {n: exact["distinct_curve"][n] for n in curve} == pytest.approx(curve, rel=1e-6)
    assert list(exact["distinct_curve"]) == [
        "64",
        "128",
        "256",
        "512",
        "1024",
        "2048",
        "4096",
        "6400",
    ]
    assert (run / "eval" / "exact_diversity.png").read_bytes()[:4] == b"\x89PNG"


def test_compares_with_the_sampled_evaluation_of_the_same_checkpoint(run: Path) -> None:
    exact = json.loads((run / "eval" / EXACT_FILE).read_text())
    sampled = json.loads((run / "eval" / "metrics.json").read_text())
    comparison = exact["sampled"]
    assert comparison["n_samples"] == N
    assert comparison["acc"]["sampled"] == sampled["acc"]
    assert comparison["acc"]["exact"] == exact["acc"]
    lo, hi = comparison["acc"]["interval"]
    assert lo <= exact["acc"] <= hi
    assert comparison["distinct"]["sampled"] == sampled["cov_count"]
    assert comparison["distinct"]["expected"] == exact["expected_distinct"][str(N)]
    for length, check in comparison["mass_by_length"].items():
        assert check["sampled"] == sampled["count_by_length"].get(length, 0) / N


def test_stale_sampled_metrics_are_not_compared(run: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(run, tmp_path / "run"))
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    metrics["eval"]["checkpoint"] = "step-000001"
    (run / "eval" / "metrics.json").write_text(json.dumps(metrics))
    exact = exact_evaluate(run, draws=[10, 100])
    assert "sampled" not in exact
    assert set(exact["expected_distinct"]) == {"10", "100"}
    assert exact["expected_distinct"]["10"] <= 10 * exact["acc"] + 1e-12


def test_non_enumerable_task_is_refused() -> None:
    with pytest.raises(EvalError, match="no enumerable solution set"):
        exact_task_metrics(None, SimpleNamespace(name="smiles"), draws=[1])  # type: ignore[arg-type]


def test_cli_reports_a_missing_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", str(tmp_path / "nowhere"), "--exact"])
    assert result.exit_code == 2
    assert "not a directory" in result.output
