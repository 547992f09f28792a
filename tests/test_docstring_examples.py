"""The runnable examples in the docstrings of the classes a user starts from run as written:
each ``Example...::`` block is taken from the docstring, executed in a fresh folder with the names
it leaves to the reader supplied (``MODEL``: a tiny local model), and its result checked."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest


def example(obj: Any) -> str:
    """The code of ``obj``'s docstring example: the indented block after ``...::``."""
    doc = inspect.getdoc(obj) or ""
    found = re.search(r"::\n\n((?:(?:    .*)?\n)+)", doc + "\n")
    assert found, f"{obj.__qualname__} has no example block"
    return textwrap.dedent(found.group(1))


def run_example(obj: Any, folder: Path, monkeypatch: pytest.MonkeyPatch, **names: Any) -> dict:
    monkeypatch.chdir(folder)
    namespace: dict[str, Any] = dict(names)
    exec(compile(example(obj), f"<example of {obj.__qualname__}>", "exec"), namespace)
    return namespace


def test_the_trl_trainers_example_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("trl")
    from raptb.integrations.trl import GFlowNetTrainer
    from tests.integrations.trl_fixtures import write_tiny_llama

    write_tiny_llama(tmp_path / "model")
    done = run_example(GFlowNetTrainer, tmp_path, monkeypatch, MODEL=str(tmp_path / "model"))
    trainer = done["trainer"]
    assert trainer.state.global_step == 2 and trainer.buffer is not None and len(trainer.buffer)
    assert len(example(GFlowNetTrainer).strip().splitlines()) <= 15


def test_the_trainers_example_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import raptb

    done = run_example(raptb.Trainer, tmp_path, monkeypatch)
    assert done["result"].step == 2
    assert (tmp_path / "runs" / "example" / "checkpoints" / "step-000002").is_dir()
    assert len(example(raptb.Trainer).strip().splitlines()) <= 6


def test_the_loss_example_is_a_loss_that_trains_with_its_own_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import raptb
    from raptb.app.configuration.losses import LOSSES

    done = run_example(raptb.Loss, tmp_path, monkeypatch)
    LOSSES.lookup("grpo")  # the built-in entries first
    monkeypatch.setattr(LOSSES, "_entries", dict(LOSSES._entries))
    LOSSES.register(done["LOSS"])
    small = {"steps": 2, "optim.batch_size": 8, "threads": 1, "rl.num_generations": 4}
    config = raptb.build_config(overrides={"loss": "tight_grpo", **small})
    assert config.build_objective().epsilon == 0.05
    assert raptb.Trainer(config, tmp_path / "run", progress=False).train().step == 2


BUFFER_PAGE = Path(__file__).resolve().parents[1] / "docs" / "adding-a-replay-buffer.md"


def test_the_replay_buffer_pages_example_trains_with_the_buffers_own_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/adding-a-replay-buffer.md's example runs as written: the run trains with the
    buffer's own capacity (50, not [replay]'s 200), config.toml records it and no option the
    buffer does not read, and an option it does not read is refused as the page shows."""
    import tomllib

    import raptb
    from raptb.app.configuration.config import ConfigError
    from raptb.core.replay import BUFFERS

    blocks = re.findall(r"```python\n(.*?)```", BUFFER_PAGE.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, "the page holds one Python example"
    BUFFERS.lookup("subm")  # the registry read (plug-ins loaded) before the example registers
    monkeypatch.setattr(BUFFERS, "_entries", dict(BUFFERS._entries))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "buffer_page_example"}
    exec(compile(blocks[0], str(BUFFER_PAGE), "exec"), namespace)

    buffer = namespace["trainer"].algorithm.buffer
    assert type(buffer) is namespace["NewestBuffer"] and buffer.capacity == 50
    assert 0 < len(buffer) <= 50
    recorded = tomllib.loads((tmp_path / "runs" / "newest" / "config.toml").read_text())
    assert recorded["replay"]["capacity"] == 50
    # the mix it reads (no oracle: no p_oracle, oracle_fraction) and the option it declares
    assert set(recorded["replay"]) == {"kind", "capacity", "p_replay"}
    flagged = raptb.build_config(overrides={"replay.kind": "newest", "replay.capacity": 1000})
    assert flagged.replay.buffer_kwargs() == {"capacity": 1000}
    shown = re.search(r"\nerror: (invalid config: .*)\n", BUFFER_PAGE.read_text())
    assert shown, "the page shows the refusal"
    with pytest.raises(ConfigError) as refused:
        raptb.build_config(overrides={"replay.kind": "newest", "replay.rp_tolerance": 0.1})
    assert str(refused.value) == shown.group(1)
