"""leave_process_group destroys only a launched run's process group, not another library's."""

from __future__ import annotations

import pytest

from raptb.app.distribution import distributed


@pytest.mark.parametrize("launched", [True, False])
def test_only_a_launched_runs_group_is_destroyed(monkeypatch, launched):
    calls = []
    monkeypatch.setattr(distributed.dist, "is_available", lambda: True)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda: calls.append("destroy"))
    if launched:
        monkeypatch.setenv("WORLD_SIZE", "1")
    else:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    distributed.leave_process_group()
    # a group made in a plain run (an in-process vLLM engine's) is left to its owner
    assert calls == (["barrier", "destroy"] if launched else [])
