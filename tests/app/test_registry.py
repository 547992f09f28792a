"""The task registry: a task declared in a test module trains, evaluates and enumerates with no
other file changed; built-in specs keep the paper's presets."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raptb.adapters.tasks.registry import builtin_task_names, register_task, task_names, task_spec
from raptb.app.cli import app
from raptb.app.configuration.config import ConfigError, build_config
from raptb.app.evaluation.evaluate import evaluate
from raptb.app.training.train import Trainer
from raptb.core.plugins import PluginError, load_group
from raptb.core.ports import Score
from raptb.core.replay import replay_kwargs
from tests.app import toy_task
from tests.core.test_replay import EXPR24_SUBM, SMILES_SUBM


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy task trained for two steps (SubM replay, its own section and presets)."""
    run = tmp_path_factory.mktemp("toy") / "run"
    overrides = {
        "task": "toy",
        "toy.max_length": 3,
        "steps": 2,
        "threads": 1,
        "optim.batch_size": 8,
        "optim.grad_accum": 1,
    }
    trainer = Trainer(build_config(overrides=overrides), run, progress=False)
    assert trainer.task.max_length == 3  # built by the spec from the [toy] section
    assert trainer.cfg.reward.reward_scale == 5.0  # the spec's preset
    trainer.train()
    assert len(trainer.algorithm.buffer) > 0 and trainer.algorithm.buffer.config()["shingle_k"] == 1
    return run


def test_a_registered_task_trains_and_evaluates(toy_run: Path) -> None:
    assert "toy" in task_names()
    metrics = evaluate(toy_run, progress=False)  # N: the spec's eval_samples
    rows = [json.loads(x) for x in (toy_run / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == metrics["n_samples"] == 24
    for row in rows:
        assert 1 <= row["length"] <= 3 and set(row["text"]) <= {"a", "b"}
        assert row["valid"] is True
        assert row["correct"] == (row["text"] == "a" * row["length"])
    assert metrics["all_a"] == pytest.approx(sum(r["correct"] for r in rows) / 24)
    summary = CliRunner().invoke(app, ["eval", str(toy_run), "--samples", "8"])
    assert summary.exit_code == 0, summary.output
    assert "all_a" in summary.output and "cov_count" not in summary.output


def test_an_enumerable_registered_task_gets_oracle_replay_and_enumerate(tmp_path: Path) -> None:
    cfg = build_config(
        overrides={"task": "toy", "replay.kind": "oracle", "steps": 1, "threads": 1}
        | {"optim.batch_size": 4, "optim.grad_accum": 1}
    )
    trainer = Trainer(cfg, tmp_path / "run", progress=False)
    assert sorted(it.text for it in trainer.algorithm.oracle.items()) == ["a", "aa", "aaa", "aaaa"]
    out = CliRunner().invoke(app, ["enumerate", "toy", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {
        "task": "toy",
        "counts": {"1": 1, "2": 1, "3": 1, "4": 1},
        "total": 4,
    }


def test_task_sections_are_validated_by_the_tasks_model() -> None:
    with pytest.raises(ConfigError, match=r"toy\.max_length"):
        build_config(overrides={"task": "toy", "toy.max_length": 0})
    with pytest.raises(ConfigError, match=r"toy\.colour"):
        build_config(overrides={"task": "toy", "toy.colour": "red"})
    with pytest.raises(ConfigError, match="unknown task 'chess'"):
        build_config(overrides={"task": "chess"})
    with pytest.raises(ValueError, match="task"):
        task_spec("chess")


def test_a_name_registers_once() -> None:
    assert register_task(toy_task.SPEC) is toy_task.SPEC  # re-importing is harmless
    twin = replace(toy_task.SPEC, eval_samples=1)
    with pytest.raises(ValueError, match="already registered"):
        register_task(twin)
    with pytest.raises(ValueError, match="identifier"):
        register_task(replace(toy_task.SPEC, name="a-b"))


# Each built-in task's SubM column as written in its spec before the shared presets
# (adapters.tasks.subm_presets): the specs now compose them, and must still give these.
SUBM_COLUMNS = {
    "expr24": {
        "subm_weights": (1.0, 1.0, 1.0, 0.0),
        "gating_ratio": 1.0,
        "similarity": "jaccard",
        "shingle_k": 2,
        "shingle_on": "text",
    },
    "smiles": {
        "subm_weights": (1.0, 1.0, 1.0, 1.0),
        "gating_ratio": 0.0,
        "similarity": "tanimoto",
        "length_bin_size": 1,
    },
    "commongen": {
        "subm_weights": (1.0, 1.0, 2.0, 0.0),
        "gating_ratio": 1.0,
        "similarity": "jaccard",
        "shingle_k": 1,
        "shingle_on": "words",
        "length_bin_size": 4,
    },
    **{
        name: {
            "subm_weights": (1.0, 1.0, 1.0, 1.0),
            "gating_ratio": 0.0,
            "similarity": "jaccard",
            "shingle_k": 2,
            "shingle_on": "text",
            "length_bin_size": 1,
        }
        for name in ("amp", "custom")
    },
}


@pytest.mark.parametrize("name", sorted(SUBM_COLUMNS))
def test_builtin_subm_presets_are_the_columns(name: str) -> None:
    assert dict(task_spec(name).subm) == SUBM_COLUMNS[name]


def test_builtin_specs_keep_the_paper_presets() -> None:
    expr24, smiles, custom = (task_spec(n) for n in ("expr24", "smiles", "custom"))
    assert replay_kwargs("subm", expr24.subm) == EXPR24_SUBM
    assert replay_kwargs("subm", smiles.subm) == SMILES_SUBM
    assert custom.subm["similarity"] == "jaccard" and custom.subm["gating_ratio"] == 0.0
    assert (expr24.eval_samples, smiles.eval_samples, custom.eval_samples) == (6400, 3200, 6400)
    assert expr24.enumerable and not smiles.enumerable and not custom.enumerable

    assert expr24.is_correct(Score(1.0, True)) and not expr24.is_correct(Score(0.0, True))
    assert smiles.is_correct(Score(0.3, True)) and not smiles.is_correct(Score(0.0, False))


ROOT = Path(__file__).resolve().parents[2]


def test_builtin_tasks_are_raptbs_own_entry_points() -> None:
    """Every task folder with a spec is one of raptb's raptb.tasks entry points (setup.py declares
    them from the folders; tests/test_packaging.py checks the installed list), and they are what
    raptb registers first, by name."""
    folders = {path.parent.name for path in (ROOT / "adapters" / "tasks").glob("*/spec.py")}
    assert builtin_task_names() == tuple(sorted(folders))
    assert task_names()[: len(folders)] == builtin_task_names()


def test_an_install_without_raptbs_entry_points_says_to_reinstall() -> None:
    # an editable install older than the entry points lists none of raptb's in the group
    with pytest.raises(PluginError, match=r"declares none of .* pip install -e \."):
        load_group("raptb.no-such-group", lambda point, loaded: None, builtin=True)
    load_group("raptb.no-such-group", lambda point, loaded: None)  # not required: nothing to do
