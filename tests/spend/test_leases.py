"""Leases: a trip to Redis also takes a share of each counter for the requests to come, so that
most requests are admitted in memory, with no round trip on their way to the engine, and no less
exactly: a share is counted in Redis before any request uses it. Each event loop (one per web
process) holds its own leases; two loops here stand for two processes. All on the real Redis.
"""

import asyncio
import threading
import uuid

from core import redis as core_redis
from spend import ledger
from spend.ledger import reservations
from spend.ledger.counter import counters
from spend.policy import Spec
from tests.spend.test_limits import same_minute

REQUEST = 100  # tokens each request here reserves


def spec(**limits) -> Spec:
    return Spec(kind="key", ident=uuid.uuid4().hex, label="API key lease-test", **limits)


def counted(limits: Spec) -> dict[str, int]:
    """What Redis counts for each of the spec's counters (what every process sees)."""
    found = counters((limits,))
    values = core_redis.client().mget([c.key for c in found])
    return {c.dimension: int(v or 0) for c, v in zip(found, values, strict=True)}


def test_the_next_requests_are_admitted_against_the_lease_and_redis_counts_it_at_once():
    limits = spec(requests_per_minute=1000, tokens_per_minute=16_000)
    same_minute(5)

    async def scenario():
        first = await ledger.areserve((limits,), tokens=REQUEST, cost=0)
        assert isinstance(first, ledger.Reservation)
        # The request's own estimate and a share for the next ones (16 requests' worth, at most
        # a sixteenth of the limit), counted where the other processes see it.
        assert counted(limits) == {"requests per minute": 1 + 16, "tokens per minute": 100 + 1000}
        assert first.standing.tokens.remaining == 16_000 - 100

        second = await ledger.areserve((limits,), tokens=REQUEST, cost=0)
        assert isinstance(second, ledger.Reservation)
        assert counted(limits) == {"requests per minute": 17, "tokens per minute": 1100}  # no trip
        assert second.standing.tokens.remaining == 16_000 - 200
        assert second.standing.requests.remaining == 1000 - 2

        # What the answers did not use goes back to the lease; given back, Redis counts only what
        # was used.
        ledger.settle_soon(first, tokens=60, cost=0)
        ledger.settle_soon(second, tokens=70, cost=0)
        await ledger.asettled()
        assert counted(limits) == {"requests per minute": 2, "tokens per minute": 130}

    asyncio.run(scenario())


def test_an_idle_lease_goes_back_to_redis_by_itself():
    limits = spec(tokens_per_minute=16_000)
    same_minute(5)

    async def scenario():
        booked = await ledger.areserve((limits,), tokens=REQUEST, cost=0)
        ledger.settle_soon(booked, tokens=40, cost=0)
        assert counted(limits) == {"tokens per minute": 1100}
        # Unused for LEASE_IDLE, the share goes back (checked until then, however busy the
        # machine: what is asserted is where the count ends, not when).
        for _ in range(200):
            if counted(limits) == {"tokens per minute": 40}:
                break
            await asyncio.sleep(0.05)
        assert counted(limits) == {"tokens per minute": 40}

    asyncio.run(scenario())


def test_two_loops_with_leases_never_pass_the_limit_together():
    allowed = 40  # requests' worth of tokens per minute
    limits = spec(tokens_per_minute=allowed * REQUEST)
    same_minute(10)
    admitted: list[int] = []
    start = threading.Barrier(2)

    def process():
        async def burst():
            start.wait()
            results = await asyncio.gather(
                *(ledger.areserve((limits,), tokens=REQUEST, cost=0) for _ in range(allowed))
            )
            admitted.append(sum(isinstance(r, ledger.Reservation) for r in results))
            await ledger.asettled()  # every share not used goes back

        asyncio.run(burst())

    threads = [threading.Thread(target=process) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # Never past the limit; short of it by at most the shares the two loops held when the other
    # was refused (a sixteenth of the limit each).
    assert sum(admitted) <= allowed, admitted
    assert sum(admitted) >= allowed - 2 * (allowed // 16 + 1), admitted
    assert counted(limits) == {"tokens per minute": sum(admitted) * REQUEST}


def test_a_lowered_limit_holds_at_once_and_the_old_share_goes_back_in_the_same_trip():
    roomy = spec(tokens_per_minute=16_000)
    same_minute(5)

    async def scenario():
        booked = await ledger.areserve((roomy,), tokens=REQUEST, cost=0)
        ledger.settle_soon(booked, tokens=REQUEST, cost=0)
        assert counted(roomy) == {"tokens per minute": 1100}
        # The operator lowers the limit to room for one more request and a half: the lease of
        # the roomy limit no longer admits anything, and the trip gives it back as it counts.
        tight = Spec(**{**_fields(roomy), "tokens_per_minute": 250})
        again = await ledger.areserve((tight,), tokens=REQUEST, cost=0)
        assert isinstance(again, ledger.Reservation), again
        assert counted(tight) == {"tokens per minute": 200}  # no share: 250 // 16 < one request
        refused = await ledger.areserve((tight,), tokens=REQUEST, cost=0)
        assert isinstance(refused, ledger.Refusal)
        assert refused.code == "limit_exceeded" and refused.retry_after
        await ledger.asettled()
        assert counted(tight) == {"tokens per minute": 200}

    asyncio.run(scenario())


def _fields(limits: Spec) -> dict:
    return {name: getattr(limits, name) for name in Spec.__slots__}


def test_a_burst_of_64_waits_for_a_few_trips_instead_of_making_one_each(monkeypatch):
    limits = spec(requests_per_minute=100_000, tokens_per_minute=10_000_000)
    trips = []
    real = reservations.run_script

    async def counted_script(script, keys, args):
        if script is reservations._RESERVE:
            trips.append(args[0])
        return await real(script, keys, args)

    monkeypatch.setattr(reservations, "run_script", counted_script)
    same_minute(5)

    async def scenario():
        results = await asyncio.gather(
            *(ledger.areserve((limits,), tokens=REQUEST, cost=0) for _ in range(64))
        )
        assert all(isinstance(r, ledger.Reservation) for r in results)
        # A trip leases 16 requests' worth: the next 16 requests wait for it, the one after
        # makes the next trip, side by side; no request waits for more than one trip.
        assert len(trips) <= 64 // 16 + 1, trips
        await ledger.asettled()
        assert counted(limits) == {"requests per minute": 64, "tokens per minute": 6400}

    asyncio.run(scenario())
