"""The names a run can choose, as the README and docs/usage.md list them, read from the registries.

``choices_markdown()`` is the paragraph both pages hold between ``<!-- choices:start -->`` and
``<!-- choices:end -->``; tests/app/test_choices_doc.py fails when a page differs from it, so a
new built-in loss, buffer or task reaches the pages by regenerating them:
``python -c "from raptb.app.configuration.choices import choices_markdown as c; print(c())"``.
Plug-ins (entry points, ``register_buffer``) are left out: the pages list what raptb ships.
"""

from __future__ import annotations

from raptb.adapters.tasks.registry import builtin_task_names
from raptb.app.configuration.losses import loss_entry, loss_names
from raptb.core.replay import NO_REPLAY, buffer_class, replay_kinds

START, END = "<!-- choices:start -->", "<!-- choices:end -->"


def _shipped(cls: type) -> bool:
    return cls.__module__.startswith("raptb.")


def _codes(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def choices_markdown() -> str:
    """The built-in objectives, RL losses, replay kinds and tasks, one sentence each."""
    entries = [loss_entry(name) for name in loss_names()]
    shipped = [e for e in entries if _shipped(e.objective)]
    gflownet = [e.name for e in shipped if e.section == "objective"]
    rl = [e.name for e in shipped if e.section == "rl"]
    kinds = []
    for kind in replay_kinds():
        if kind == NO_REPLAY:
            kinds.append(f"`{kind}`")
        elif _shipped(buffer_class(kind)):
            oracle = " (tasks with an enumerated solution set)" if buffer_class(kind).oracle else ""
            kinds.append(f"`{kind}`{oracle}")
    return (
        f"Objectives (`--loss`): {_codes(gflownet)}; the RL losses {_codes(rl)}. "
        f"Replay (`--replay`): {', '.join(kinds)}. "
        f"Tasks (`--task`): {_codes(list(builtin_task_names()))}."
    )


def page_choices(text: str) -> str:
    """The paragraph a page holds between START and END (ValueError when the markers are
    missing)."""
    if START not in text or END not in text:
        raise ValueError(f"the page has no {START} ... {END} paragraph")
    return text.split(START, 1)[1].split(END, 1)[0].strip()
