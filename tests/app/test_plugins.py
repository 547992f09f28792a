"""Plug-ins from outside the tree: a throwaway package declares a task, an objective and a replay
buffer through the ``raptb.tasks``, ``raptb.objectives`` and ``raptb.buffers`` entry points, and
``raptb train``, ``raptb eval`` and ``raptb study`` use them with no file of raptb changed.

The package is a module plus a ``.dist-info`` folder (METADATA and entry_points.txt) in a
temporary directory put on PYTHONPATH, which is how importlib.metadata finds any installed
distribution; every command runs in its own process, as a user's would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = '''
from dataclasses import dataclass, replace
from typing import ClassVar

from raptb.adapters.tasks.registry import TaskSpec
from raptb.core.metrics import sequence_metrics
from raptb.core.gfn.objectives import TB
from raptb.core.ports import Score
from raptb.core.replay import RewardPrioritizedBuffer


class Newest(RewardPrioritizedBuffer):
    """RP under another kind: a plug-in buffer, taking RP's options ([replay] capacity, ...)."""

    kind = "newest"


@dataclass(frozen=True)
class HalfTB(TB):
    """TB at half the loss: a plug-in whose use shows in the logged loss."""

    name: ClassVar[str] = "half_tb"

    def __call__(self, batch, log_z, step=0):
        loss, diagnostics = super().__call__(batch, log_z, step)
        return loss / 2, diagnostics


@dataclass
class AsTask:
    name: str = "as_task"
    alphabet: str = "ab"
    grammar: None = None
    min_length: int = 1
    max_length: int = 3

    def prompts(self):
        return ["as:"]

    def score(self, prompt, text):
        return Score(text.count("a") / len(text), True) if text else Score(0.0, False)


def _metrics(task, rows):
    return {**sequence_metrics(rows, max_depth=task.max_length), "from_plugin": 1.0}


SPEC = TaskSpec(
    name="as_task",
    build=lambda options: AsTask(),
    metrics=_metrics,
    headline=("acc", "from_plugin"),
    subm={"similarity": "jaccard", "shingle_k": 1, "shingle_on": "text"},
    eval_samples=8,
)
CLASH = replace(SPEC, name="expr24")  # a built-in task's name
'''
ENTRY_POINTS = """[raptb.objectives]
half_tb = raptb_plugin_demo:HalfTB

[raptb.buffers]
newest = raptb_plugin_demo:Newest

[raptb.tasks]
as_task = raptb_plugin_demo:SPEC
"""
STUDY = """
seeds = [0]
[base]
task = "as_task"
steps = 2
optim = { batch_size = 4, grad_accum = 1 }
"replay.kind" = "rp"
[axes]
loss = ["half_tb"]
[eval]
samples = 8
[table]
metrics = [{ key = "from_plugin", name = "from the plug-in" }]
"""
FAST = ["--steps", "2", "--batch-size", "4", "--grad-accum", "1", "--threads", "1"]


def install(site: Path, entry_points: str, module: str = PACKAGE) -> None:
    """The throwaway distribution: its module and its metadata, as an installer leaves them."""
    (site / "raptb_plugin_demo.py").write_text(module)
    info = site / "raptb_plugin_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: raptb-plugin-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


def raptb(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(site), *sys.path]))
    return subprocess.run(
        [sys.executable, "-m", "raptb", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_package_adds_a_task_and_an_objective_to_train_eval_and_study(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    install(site, ENTRY_POINTS)
    common = ["--task", "as_task", *FAST, "--no-progress"]
    # the plug-in's buffer, at most 3 items per prompt, for the plug-in's loss
    plugged = ["--replay", "newest", "--replay.capacity", "3"]
    for loss, replay in (("half_tb", plugged), ("tb", ["--replay", "rp"])):
        done = raptb(site, tmp_path, "train", "--loss", loss, *common, *replay, "--out", loss)
        assert done.returncode == 0, done.stderr
    # the plug-in's objective ran: the first step (same weights, same rows) logs half TB's loss
    assert losses(tmp_path / "half_tb")[0] == pytest.approx(losses(tmp_path / "tb")[0] / 2)
    config = (tmp_path / "half_tb" / "config.toml").read_text()
    assert 'loss = "half_tb"' in config and 'kind = "newest"' in config
    records = [json.loads(line) for line in (tmp_path / "half_tb" / "metrics.jsonl").open()]
    assert 0 < records[-1]["buffer_size"] <= 3  # the plug-in's buffer, with its capacity

    done = raptb(site, tmp_path, "eval", "half_tb", "--json")
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)
    assert metrics["from_plugin"] == 1.0 and metrics["n_samples"] == 8  # the task's own metrics

    (tmp_path / "s.toml").write_text(STUDY)
    done = raptb(site, tmp_path, "study", "s.toml", "--out", "study", "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| 1.000 |" in (tmp_path / "study" / "table.md").read_text()


@pytest.mark.parametrize(
    ("entry_points", "message"),
    [
        ("[raptb.tasks]\nas_task = no_such_module:SPEC\n", "cannot be loaded: ModuleNotFoundError"),
        ("[raptb.tasks]\nas_task = raptb_plugin_demo:HalfTB\n", "must name a TaskSpec"),
        ("[raptb.tasks]\nother = raptb_plugin_demo:SPEC\n", "differs from the entry point's"),
        # raptb's own entry points load first, whatever the search path: the plug-in is refused
        ("[raptb.tasks]\nexpr24 = raptb_plugin_demo:CLASH\n", "CLASH): task 'expr24' is already"),
        ("[raptb.objectives]\nhalf_tb = raptb_plugin_demo:SPEC\n", "must name a subclass"),
        ("[raptb.objectives]\ngrpo = raptb_plugin_demo:HalfTB\n", "differs from the entry"),
        ("[raptb.buffers]\nnewest = raptb_plugin_demo:SPEC\n", "must name a subclass of raptb.Re"),
        ("[raptb.buffers]\nlatest = raptb_plugin_demo:Newest\n", "kind 'newest' differs from"),
    ],
)
def test_a_broken_plug_in_is_one_line_naming_it_and_exit_2(tmp_path, entry_points, message):
    site = tmp_path / "site"
    site.mkdir()
    install(site, entry_points)
    # a given loss is validated, which reads the objectives' group; the tasks' is read first
    done = raptb(site, tmp_path, "train", "--loss", "tb", *FAST, "--out", "run")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "plug-in " in lines[0], lines[0]
    assert message in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


RL_OBJECTIVE = '''
from dataclasses import dataclass
from typing import ClassVar

from raptb.app.configuration.losses import ON_POLICY, Loss
from raptb.core.rl.grpo import GRPO


@dataclass(frozen=True)
class HalfGRPO(GRPO):
    """GRPO at half the loss, with a diagnostic that shows in the logged record."""

    name: ClassVar[str] = "half_grpo"

    def __call__(self, batch, **kwargs):
        loss, diagnostics = super().__call__(batch, **kwargs)
        return loss / 2, {**diagnostics, "half": 1.0}


LOSS = Loss(
    "half_grpo",
    HalfGRPO,
    "raptb_rl_demo_algorithm:HalfGRPOAlgorithm",
    section="rl",
    replay=False,
    presets=ON_POLICY,
)
'''
RL_ALGORITHM = '''
from raptb.app.training.rl.grpo import GRPOAlgorithm


class HalfGRPOAlgorithm(GRPOAlgorithm):
    """GRPO's step, its record marked as the plug-in's."""

    def optimizer_step(self):
        record = super().optimizer_step()
        return None if record is None else {**record, "algorithm": "plug-in"}
'''


def test_a_package_adds_an_rl_loss_with_its_algorithm(tmp_path):
    """One entry point and two files (the objective with its Loss entry, the algorithm): the
    loop trains the loss with the package's algorithm, its [rl] hyperparameters and presets
    (on-policy, no replay), and a name clash is one line naming the entry point."""
    site = tmp_path / "site"
    site.mkdir()
    install(site, "[raptb.losses]\nhalf_grpo = raptb_rl_demo_loss:LOSS\n", RL_OBJECTIVE)
    (site / "raptb_rl_demo_loss.py").write_text(RL_OBJECTIVE)
    (site / "raptb_rl_demo_algorithm.py").write_text(RL_ALGORITHM)
    rl = ["--rl.num_generations", "2", "--rl.beta", "0.04"]
    done = raptb(site, tmp_path, "train", "--loss", "half_grpo", *FAST, *rl, "--out", "run")
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "run" / "metrics.jsonl").read_text()
    records = [json.loads(line) for line in log.splitlines()]
    assert len(records) == 2
    assert all(r["algorithm"] == "plug-in" and r["half"] == 1.0 for r in records)
    assert all(r["kl"] is not None for r in records)  # beta reached the objective: a KL term
    config = (tmp_path / "run" / "config.toml").read_text()
    assert 'loss = "half_grpo"' in config and 'kind = "none"' in config

    (site / "raptb_plugin_demo-0.1.dist-info" / "entry_points.txt").write_text(
        "[raptb.losses]\ngrpo = raptb_rl_demo_loss:LOSS\n"
    )
    done = raptb(site, tmp_path, "train", "--loss", "tb", *FAST, "--out", "clash")
    assert done.returncode == 2 and "differs from the entry point's" in done.stderr, done.stderr
