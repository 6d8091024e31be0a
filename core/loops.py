"""Things that belong to one event loop: connection pools and clients, whose sockets the loop
that opened them owns. A process has one serving loop, but tests and management commands run
many loops in turn, and a value made on one must not be handed to another."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class PerLoop(Generic[V]):
    """Values per (running event loop, key). A value of a loop that has closed is dropped (and
    given to `on_stale`, to close what it holds) when a new value is put."""

    def __init__(self, *, on_stale: Callable[[V], None] | None = None):
        self._items: dict[tuple[int, Hashable], tuple[asyncio.AbstractEventLoop, V]] = {}
        self._on_stale = on_stale

    def peek(self, key: Hashable = None) -> V | None:
        """The running loop's value for `key`, or None."""
        loop = asyncio.get_running_loop()
        entry = self._items.get((id(loop), key))
        return entry[1] if entry is not None and entry[0] is loop else None

    def put(self, value: V, key: Hashable = None) -> V:
        loop = asyncio.get_running_loop()
        for stale in [k for k, (other, _) in self._items.items() if other.is_closed()]:
            _, old = self._items.pop(stale)
            if self._on_stale is not None:
                self._on_stale(old)
        self._items[(id(loop), key)] = (loop, value)
        return value

    def get(self, make: Callable[[], V], key: Hashable = None) -> V:
        """The running loop's value for `key`, made by `make` the first time."""
        value = self.peek(key)
        return value if value is not None else self.put(make(), key)
