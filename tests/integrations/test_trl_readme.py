"""The "With TRL" example of docs/trl.md runs as written (CPU, a small local model it builds)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

TRL_PAGE = Path(__file__).resolve().parents[2] / "docs" / "trl.md"


def with_trl_example() -> str:
    text = TRL_PAGE.read_text()
    assert text.startswith("# With TRL")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1, "the page holds one Python example"
    return blocks[0]


def test_the_docs_trl_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(os.environ, "TRL_EXPERIMENTAL_SILENCE", "1")
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(with_trl_example(), str(TRL_PAGE), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2  # type: ignore[attr-defined]
    assert (tmp_path / "tiny-llama" / "config.json").exists()
    assert len(trainer.buffer) > 0  # type: ignore[attr-defined]
