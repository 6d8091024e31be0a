"""Leases: a share of a counter that one event loop (one web process) took ahead of need in its
trip to Redis, counted there already, so that the loop's next requests are admitted against it in
memory. What a lease holds, how large a share a loop keeps, and a request's Reservation, which
says what it counted and on which leases: spend.ledger.reservations makes it, taking from the
leases; spend.ledger.settlement settles it, giving back to them, and returns them to Redis."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from core.loops import PerLoop
from spend.ledger.counter import Counter
from spend.ledger.reads import Standing

# A trip to Redis leases, for the requests to come, up to this many requests' worth of each
# counter, at most 1/LEASE_SHARE of its limit; a lease unused for LEASE_IDLE seconds goes back.
LEASE_REQUESTS = 16
LEASE_SHARE = 16
LEASE_IDLE = 1.0


class Lease:
    """A share of one counter that this event loop took ahead of need: counted in Redis already,
    so the loop admits requests against it in memory."""

    __slots__ = ("counter", "free", "pending", "renewal", "seen", "target", "used_at", "waiting")

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.free = 0  # counted in Redis, not yet reserved by a request
        self.pending = 0  # asked for by trips in flight
        self.renewal: asyncio.Future | None = None  # the trip in flight that renews it
        self.waiting = 0  # what the requests waiting for that trip need
        self.seen = 0  # the count in Redis at the last trip
        self.target = 0  # the share the loop keeps at most (more goes back as answers settle)
        self.used_at = time.monotonic()

    def covers(self, counter: Counter, amount: int) -> bool:
        return self.free >= amount and self.counter.limit == counter.limit


class Leases:
    """One event loop's leases, by counter key, and the timer that gives back idle ones."""

    def __init__(self) -> None:
        self.by_key: dict[str, Lease] = {}
        self.sweep: asyncio.TimerHandle | None = None


loop_leases: PerLoop[Leases] = PerLoop()


def lease_target(counter: Counter, amount: int) -> int:
    """The share of a counter a loop keeps for the requests to come: none if it would not hold
    one request like this one."""
    limit = counter.limit if counter.limit is not None else counter.spec.budget_micros or 0
    target = min(LEASE_REQUESTS * amount, limit // LEASE_SHARE)
    return target if target >= amount else 0


@dataclass
class Reservation:
    counters: tuple[Counter, ...]
    tokens: int
    cost: int  # micro-units
    standing: Standing
    leases: tuple[Lease, ...] = ()  # one per counter: where what was not used goes back
