"""The README and docs/usage.md list the objectives, RL losses, replay kinds and tasks raptb ships
as the registries hold them (``raptb.app.configuration.choices``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from raptb.app.configuration import choices

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", ["README.md", "docs/usage.md"])
def test_the_pages_list_what_the_registries_hold(page: str) -> None:
    held = " ".join(choices.page_choices((ROOT / page).read_text()).split())
    want = choices.choices_markdown()
    assert held == want, f"{page}: regenerate the choices paragraph:\n{textwrap.fill(want, 100)}"


def test_the_paragraph_names_every_built_in_loss_buffer_and_task() -> None:
    text = choices.choices_markdown()
    for name in ("`raptb`", "`vargrad`", "`grpo`", "`ppo`", "`subm`", "`oracle`", "`expr24`"):
        assert name in text
    gflownet, rl = text.split("; the RL losses ")
    assert "`grpo`" not in gflownet and "`raptb`" not in rl.split(".")[0]


def test_a_page_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="choices:start"):
        choices.page_choices("no markers here")
