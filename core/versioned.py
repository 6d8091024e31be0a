"""A value built from the database once per process and rebuilt when it changes: the routing
rules' snapshot, the spend limits.

A change (after commit) writes a new version into the cache (Redis), shared by every process;
each process compares versions at most once per `check_every()` seconds and rebuilds when they
differ, and every `rebuild_every` seconds whatever the version says (what no change reported: a
row written by SQL, a publication lost while Redis was away). Between checks a reader costs
nothing: no query, no round trip, no thread hop.

An async reader never waits for a check while traffic flows: a read in the second half of the
interval starts the check in the background (one per process) and goes on with the value it has,
and so does a read up to two intervals after the last check (the check is still on its way, as on
a saturated loop); the check reads the versions on the loop's own Redis client (a thread only to
rebuild). Only a read after a quiet spell (or after this process's own `changed`) waits for it. So
a change another process made is seen within two intervals. Under load a check that readers wait
for costs them a round trip on a busy loop (and a thread hop, as it was), tens of milliseconds
each time it falls due: the request path of `bench_gateway` at 64 streams had three such waits a
second (the rules, the spend limits, the engines' states), seen as a longer time to the first
token with the same CPU.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Generic, TypeVar

from django.core.cache import cache

from core import db
from core import redis as core_redis
from core.cache import JSONSerializer
from core.flight import SingleFlight

logger = logging.getLogger(__name__)

T = TypeVar("T")
# The cache's own encoding of a value (CACHES in config/settings/databases.py), to read a version
# on the loop.
_SERIALIZER = JSONSerializer()

# In check intervals: a read after AHEAD starts the next check in the background and goes on with
# the value it has; so does one up to STALE (the check is slow or was not started); later a read
# waits for a check.
AHEAD = 0.5
STALE = 2.0


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
        return self.check()

    def check(self) -> T:
        """Compare versions now (and rebuild if they differ), however fresh the value is."""
        group = (self, *self._followers)
        try:
            found = cache.get_many([member.key for member in group])
        except Exception:  # Redis down: keep serving what we have
            logger.warning("cannot read the version of %s", self.what, exc_info=True)
            found = {member.key: member._version for member in group}
        self._refresh_group(group, found, time.monotonic())
        assert self._value is not None
        return self._value

    @staticmethod
    def _refresh_group(group: tuple[Versioned, ...], found: dict, now: float) -> None:
        for member in group:
            member._refresh(found.get(member.key), now)

    def _stale(self, version: str | None, now: float) -> bool:
        return (
            self._value is None
            or version != self._version
            or now - self._built_at > self._rebuild_every
        )

    def _refresh(self, version: str | None, now: float) -> None:
        if self._stale(version, now):
            self._value, self._version, self._built_at = self._build(), version, now
        self._checked_at = now

    async def aget(self) -> T:
        if self._value is not None:
            age, every = time.monotonic() - self._checked_at, self._check_every()
            if age < every * AHEAD:
                return self._value  # the hot path: no I/O
            if age < every * STALE:
                # Due: the check starts behind the readers, who go on with the value they have
                # (see the module docstring).
                self._flights.start(self.key, self._check_behind)
                return self._value
        # No value, or no read for a while: one reader looks, the others wait.
        return await self._flights.do(self.key, self._acheck)

    async def _acheck(self) -> T:
        """`check` from the event loop: the versions read on the loop's own Redis client (a round
        trip, no thread); a thread only to rebuild, which a change alone asks for."""
        group = (self, *self._followers)
        try:
            replies = await core_redis.aclient().mget([cache.make_key(m.key) for m in group])
            found = {
                member.key: None if raw is None else _SERIALIZER.loads(raw)
                for member, raw in zip(group, replies, strict=True)
            }
        except Exception:  # Redis down: keep serving what we have
            logger.warning("cannot read the version of %s", self.what, exc_info=True)
            found = {member.key: member._version for member in group}
        now = time.monotonic()
        if any(member._stale(found.get(member.key), now) for member in group):
            await db.run(self._refresh_group, group, found, now)
        else:
            for member in group:
                member._checked_at = now
        assert self._value is not None
        return self._value

    async def _check_behind(self) -> T:
        try:
            return await self._acheck()
        except Exception:
            # The value stays; the first reader after it expires waits for a check of its own (a
            # reader waiting on this one meanwhile gets the error, as from any check).
            logger.warning("cannot check %s ahead of its expiry", self.what, exc_info=True)
            raise

    def changed(self) -> None:
        """Tell every process to rebuild (call it after commit); this one rebuilds at its next
        read."""
        self._value = None
        try:
            cache.set(self.key, uuid.uuid4().hex, timeout=None)
        except Exception:
            logger.warning(
                "cannot publish a change of %s; other processes catch up within %.0f s",
                self.what,
                self._rebuild_every,
                exc_info=True,
            )
