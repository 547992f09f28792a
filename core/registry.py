"""``Registry``: the named things of one kind (objectives, buffer kinds, tasks, losses), written
once for all of them.

A registry maps a name (an identifier: it appears in config files and on the command line) to
one entry. ``register`` adds an entry under the name its ``key`` reads from it (a class's
``name`` or ``kind``, a spec's ``name``); registering the same entry again is harmless, another
entry under a taken or reserved name is a ValueError. ``lookup`` is the one-line ValueError
listing the valid names that configuration and the command line show. A ``load`` hook, when
given, runs before every read (once it has run, it may run again: it must be idempotent), which
is how a registry fills itself lazily from modules or entry points.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from raptb.core.did_you_mean import unknown_choice

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Named entries of one ``kind`` (the word error messages use), in registration order."""

    def __init__(
        self,
        kind: str,
        key: Callable[[T], object],
        entries: Iterable[T] = (),
        *,
        reserved: Iterable[str] = (),
        load: Callable[[], None] | None = None,
    ) -> None:
        self.kind = kind
        self._key = key
        self._reserved = frozenset(reserved)
        self._entries: dict[str, T] = {}
        self._load = load
        self._loading = False
        for entry in entries:
            self.register(entry)

    def register(self, entry: T) -> T:
        """Add ``entry`` under its name and return it (usable as a class decorator)."""
        name = self._key(entry)
        if not isinstance(name, str) or not name.isidentifier() or name in self._reserved:
            raise ValueError(f"a {self.kind} needs a name that is an identifier, got {name!r}")
        known = self._entries.get(name)
        if known is not None and known is not entry:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def lookup(self, name: str) -> T:
        """The entry ``name``; a one-line ValueError listing the valid names otherwise."""
        self.load()
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(unknown_choice(self.kind, name, self._entries)) from None

    def names(self) -> tuple[str, ...]:
        """Every name, in registration order."""
        self.load()
        return tuple(self._entries)

    def load(self) -> None:
        """Run the ``load`` hook (not from inside itself: its registrations do not recurse)."""
        if self._load is not None and not self._loading:
            self._loading = True
            try:
                self._load()
            finally:
                self._loading = False

    def __getitem__(self, name: str) -> T:
        self.load()
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        self.load()
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        self.load()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"
