"""A value built from the database once per process and rebuilt when it changes: the routing
rules' snapshot, the spend limits.

A change (after commit) writes a new version into the cache (Redis), shared by every process;
each process compares versions at most once per `check_every()` seconds and rebuilds when they
differ, and every `rebuild_every` seconds whatever the version says (what no change reported: a
row written by SQL, a publication lost while Redis was away). Between checks a reader costs
nothing: no query, no round trip, no thread hop.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Generic, TypeVar

from django.core.cache import cache

from core import db
from core.flight import SingleFlight

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Versioned(Generic[T]):
    def __init__(
        self,
        *,
        key: str,
        build: Callable[[], T],
        check_every: Callable[[], float],
        what: str,
        rebuild_every: float = 300.0,
        followers: tuple[Versioned, ...] = (),
    ):
        self.key, self.what = key, what
        self._build, self._check_every, self._rebuild_every = build, check_every, rebuild_every
        self._value: T | None = None
        self._version: str | None = None
        self._built_at = 0.0
        self._checked_at = 0.0
        self._flights = SingleFlight()
        # Checked with this one, in the same read: a reader that asks for both right after the
        # other (the pipeline: rules, then limits) waits for one check, not two.
        self._followers = followers

    def _current(self) -> T | None:
        if self._value is not None and time.monotonic() - self._checked_at < self._check_every():
            return self._value
        return None

    def get(self) -> T:
        """The value, rebuilt first if it changed (blocking: a thread, or `aget`)."""
        if (value := self._current()) is not None:
            return value
        group = (self, *self._followers)
        try:
            found = cache.get_many([member.key for member in group])
        except Exception:  # noqa: BLE001 - Redis down: keep serving what we have
            logger.warning("cannot read the version of %s", self.what, exc_info=True)
            found = {member.key: member._version for member in group}
        now = time.monotonic()
        for member in group:
            member._refresh(found.get(member.key), now)
        assert self._value is not None
        return self._value

    def _refresh(self, version: str | None, now: float) -> None:
        if (
            self._value is None
            or version != self._version
            or now - self._built_at > self._rebuild_every
        ):
            self._value, self._version, self._built_at = self._build(), version, now
        self._checked_at = now

    async def aget(self) -> T:
        if (value := self._current()) is not None:
            return value  # the hot path: no thread hop, no I/O
        # The check falls due for every request at once: one of them looks, the others wait.
        return await self._flights.do(self.key, lambda: db.run(self.get))

    def changed(self) -> None:
        """Tell every process to rebuild (call it after commit); this one rebuilds at its next
        read."""
        self._value = None
        try:
            cache.set(self.key, uuid.uuid4().hex, timeout=None)
        except Exception:  # noqa: BLE001
            logger.warning(
                "cannot publish a change of %s; other processes catch up within %.0f s",
                self.what,
                self._rebuild_every,
                exc_info=True,
            )
