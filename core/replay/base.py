"""``ReplayBuffer``: the interface and per-prompt bookkeeping every replay buffer shares.

A buffer keeps one store of ``ReplayItem``s per prompt and offers ``add(items)``,
``sample(n, rng, prompt=None)`` (uniform with replacement unless a buffer says otherwise),
``len()``, ``items(prompt)`` and ``state_dict()`` / ``load_state_dict()`` (numpy arrays and
JSON-able values only, so a checkpoint restores sampling exactly).

A buffer kind (a plug-in's too, docs/adding-a-replay-buffer.md) implements ``add_to_prompt``,
which keeps a prompt's store in ``self._stores[prompt]``, and declares ``kind``, its
``[replay]`` options (``options``) and ``config()`` (the values it was built with, which a
checkpoint must match); ``_extra_state`` / ``_load_extra_state`` carry any state beyond the
stored items.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from raptb.core.replay.item import ReplayItem, pack_items, unpack_items
from raptb.core.replay.options import BufferOption, buffer_kwargs


class ReplayBuffer(ABC):
    """Shared interface and per-prompt bookkeeping of all buffers."""

    kind: ClassVar[str]
    options: ClassVar[tuple[BufferOption, ...]] = ()
    """The kind's options schema (core.replay.options): the ``[replay]`` options it reads."""
    oracle: ClassVar[bool] = False
    """Filled once with the task's enumerated solutions (needs an enumerable task), whose rows
    replace on-policy rows (probability p_oracle x oracle_fraction) instead of being replayed;
    the run neither adds to it nor checkpoints it."""

    @classmethod
    def config_kwargs(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """This buffer's keyword arguments from a run's ``[replay]`` values (``options``, by
        option name; names of other kinds are ignored), by its schema. ValueError for a kind that
        is not built from options (Oracle: its items come from the task)."""
        if cls.oracle:
            raise ValueError(f"replay {cls.kind!r} is not built from keyword arguments")
        return buffer_kwargs(cls.kind, cls.options, options, strict=False)

    def __init__(self) -> None:
        self._stores: dict[str, list[ReplayItem]] = {}

    def add(self, items: Sequence[ReplayItem]) -> None:
        """Route ``items`` to their prompt's store (in order) and update it."""
        by_prompt: dict[str, list[ReplayItem]] = {}
        for it in items:
            if not isinstance(it, ReplayItem):
                raise ValueError(f"items must be ReplayItem instances, got {type(it).__name__}")
            by_prompt.setdefault(it.prompt, []).append(it)
        for prompt, group in by_prompt.items():
            self.add_to_prompt(prompt, group)

    @abstractmethod
    def add_to_prompt(self, prompt: str, items: list[ReplayItem]) -> None:
        """Update ``prompt``'s store with ``items`` (new, in order, all of ``prompt``): keep what
        the buffer keeps in ``self._stores[prompt]``, the list that sampling and checkpoints
        read. The one method a buffer must implement; ``add`` calls it once per prompt."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_add_to_prompt" in vars(cls) and "add_to_prompt" not in vars(cls):
            # the method's name before it was public: plug-ins written against it keep working
            warnings.warn(
                f"{cls.__qualname__}._add_to_prompt is deprecated: name it add_to_prompt",
                DeprecationWarning,
                stacklevel=2,
            )
            cls.add_to_prompt = cls._add_to_prompt  # type: ignore[attr-defined,method-assign]

    def _store(self, prompt: str | None) -> list[ReplayItem]:
        if prompt is None:
            if len(self._stores) != 1:
                raise ValueError(
                    f"prompt is required when the buffer holds {len(self._stores)} prompts"
                )
            prompt = next(iter(self._stores))
        store = self._stores.get(prompt)
        if not store:
            raise ValueError(f"no items stored for prompt {prompt!r}")
        return store

    def sample(
        self, n: int, rng: np.random.Generator, prompt: str | None = None
    ) -> list[ReplayItem]:
        """``n`` items drawn uniformly with replacement from ``prompt``'s store."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        store = self._store(prompt)
        return [store[i] for i in rng.integers(0, len(store), size=n)]

    def items(self, prompt: str | None = None) -> list[ReplayItem]:
        """The stored items of ``prompt`` in storage order (a copy)."""
        return list(self._store(prompt))

    def prompts(self) -> list[str]:
        return [p for p, s in self._stores.items() if s]

    def __len__(self) -> int:
        return sum(len(s) for s in self._stores.values())

    def config(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        prompts = list(self._stores)
        return {
            "kind": self.kind,
            "config": self.config(),
            "prompts": prompts,
            "stores": [pack_items(self._stores[p]) for p in prompts],
            "extra": self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"state kind is {state.get('kind')!r}, this buffer is {self.kind!r}")
        if state.get("config") != self.config():
            raise ValueError(
                f"state config {state.get('config')} differs from this buffer's {self.config()}"
            )
        self._stores = {
            p: unpack_items(d) for p, d in zip(state["prompts"], state["stores"], strict=True)
        }
        self._load_extra_state(state.get("extra", {}))

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        del extra
