"""``lanes`` through a run: None resolves to 1 on the embedded model (adapters.lm.lanes'
``lane_count``) and config.toml records what ran; two lanes run a GFlowNet step's two
micro-batches side by side and train the same weights as one lane, within float32 reordering; on
a random Llama with LoRA, a run whose rollout's second lane is a forked process (the trainer's
default on a CPU under Linux) trains the weights of the same lanes as threads, bit for bit, over
two steps (the second rollout from the weights the first trained), forking once."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest
import torch

from raptb.adapters.lm.lane_process import LaneProcess, can_fork
from raptb.adapters.lm.lanes import Lanes
from raptb.app.configuration.config import build_config
from raptb.app.training.train import Trainer
from tests.adapters.test_lora import TOKENIZER, _tiny_llama


def _run(tmp_path: Path, lanes: int | None) -> tuple[int, list[torch.Tensor]]:
    overrides: dict[str, object] = {
        "steps": 1,
        "optim.batch_size": 4,
        "optim.grad_accum": 2,
        "threads": 1,
    }
    if lanes is not None:
        overrides["lanes"] = lanes
    run = tmp_path / f"run{lanes}"
    trainer = Trainer(build_config(overrides=overrides), run, progress=False)
    trainer.train()
    recorded = tomllib.loads((run / "config.toml").read_text())["lanes"]
    params = [p.detach().clone() for p in trainer.policy.model.parameters() if p.requires_grad]
    return recorded, [*params, trainer.algorithm.log_z.detach().clone()]


def test_lanes_record_and_train_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded, one = _run(tmp_path, None)
    assert recorded == 1
    sizes: list[int] = []
    run = Lanes.run
    monkeypatch.setattr(
        Lanes, "run", lambda self, work, **kw: sizes.append(len(work)) or run(self, work, **kw)
    )
    recorded, two = _run(tmp_path, 2)
    assert recorded == 2
    assert sizes == [2]  # the step's two micro-batches, one lane each
    for a, b in zip(one, two, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def _llama_run(folder: Path, run: Path, processes: bool) -> tuple[list[torch.Tensor], int]:
    """Two steps of a random Llama with LoRA in two lanes, the rollout's second lane in a process
    of its own or a thread; the trained weights and how many processes the rollouts forked."""
    overrides = {
        "model": str(folder),
        "lora.rank": 4,
        "steps": 2,
        "threads": 1,
        "lanes": 2,
        "optim.batch_size": 4,
        "optim.grad_accum": 2,
        "optim.lr": 1e-2,
        "replay.kind": "none",
        "reward.kappa": 0.0,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(build_config(overrides=overrides), run, progress=False)
    assert trainer.policy.lanes.in_processes == can_fork()
    if not processes:
        trainer.policy.lanes = Lanes(2)
    forked: list[object] = []
    start = LaneProcess.__init__

    def counted(self: LaneProcess, *args: object, **kwargs: object) -> None:
        forked.append(self)
        start(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LaneProcess, "__init__", counted)
        trainer.train()
    params = [p.detach().clone() for p in trainer.policy.model.parameters() if p.requires_grad]
    assert not any(p._process.is_alive() for p in forked)  # ended with the run
    return [*params, trainer.algorithm.log_z.detach().clone()], len(forked)


@pytest.mark.skipif(not can_fork(), reason="lanes in processes need fork (Linux)")
def test_a_run_with_its_rollout_lanes_in_processes_trains_the_thread_lanes_weights(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "llama"
    _tiny_llama().save_pretrained(folder)
    TOKENIZER.save_pretrained(folder)
    threads, none = _llama_run(folder, tmp_path / "threads", processes=False)
    processes, one = _llama_run(folder, tmp_path / "processes", processes=True)
    assert (none, one) == (0, 1)  # forked once for the run's two rollouts
    for a, b in zip(threads, processes, strict=True):
        assert torch.equal(a, b)  # the same rows, so the same step, bit for bit
