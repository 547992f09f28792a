"""``core.registry.Registry``, the one registry of objectives, buffer kinds, tasks and losses."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from raptb.core.registry import Registry


@dataclass(frozen=True)
class Entry:
    name: str


def test_names_lookups_and_one_entry_per_name():
    first, second = Entry("a"), Entry("b")
    registry = Registry("widget", lambda e: e.name, (first,), reserved=("none",))
    assert registry.register(second) is second and registry.register(second) is second
    assert registry.names() == ("a", "b") and dict(registry) == {"a": first, "b": second}
    assert registry.lookup("b") is second and "c" not in registry
    with pytest.raises(ValueError, match=r"^unknown widget 'c'; valid choices: a, b$"):
        registry.lookup("c")
    with pytest.raises(ValueError, match=r"widget 'a' is already registered"):
        registry.register(Entry("a"))
    for bad in ("none", "a-b", 3):
        with pytest.raises(ValueError, match="identifier"):
            registry.register(Entry(bad))  # type: ignore[arg-type]


def test_the_load_hook_fills_the_registry_before_every_read():
    calls = []

    def load() -> None:
        calls.append(len(registry))  # a read inside the hook does not run it again
        if "late" not in registry:
            registry.register(Entry("late"))

    registry: Registry[Entry] = Registry("widget", lambda e: e.name, load=load)
    assert registry.names() == ("late",) and registry.lookup("late") == Entry("late")
    assert calls == [0, 1]
