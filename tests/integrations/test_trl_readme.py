"""The README's "With TRL" example runs as written (CPU, a small local model it builds)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

README = Path(__file__).resolve().parents[2] / "README.md"


def with_trl_example() -> str:
    text = README.read_text()
    section = text[text.index("## With TRL") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "the section holds one Python example"
    return blocks[0]


def test_the_readme_trl_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(os.environ, "TRL_EXPERIMENTAL_SILENCE", "1")
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(with_trl_example(), str(README), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2  # type: ignore[attr-defined]
    assert (tmp_path / "tiny-llama" / "config.json").exists()
    assert len(trainer.buffer) > 0  # type: ignore[attr-defined]
