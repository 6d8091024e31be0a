"""Settlement: what moves the counters after a reservation, in the background and in batches.
An answer's reservation settles to what it used (settle_soon): what it did not use goes back to
its loop's lease, and to Redis only past what the loop keeps; leases unused for LEASE_IDLE, or
whose window is over, go back to Redis. The moves of the answers that end within SETTLE_EVERY
travel in one script call, and nothing on an answer's way waits for them."""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import RedisError

from core.loops import PerLoop
from spend.ledger.counter import MONEY, TOKENS, Counter, crossed, numbers, redis_script, run_script
from spend.ledger.leases import LEASE_IDLE, Lease, Leases, Reservation, loop_leases
from spend.prices import micros

logger = logging.getLogger(__name__)

# KEYS: the counters reservations counted in (a key may come more than once: several answers'
# settlements travel together). ARGV: what to add to each (negative: give back). A counter whose
# window is over is gone and stays gone. Returns each count after (-1: gone), comma-separated.
_SETTLE = redis_script("""
local counts = {}
for i = 1, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 1 then
        counts[i] = redis.call('INCRBY', KEYS[i], ARGV[i])
    else
        counts[i] = -1
    end
end
return table.concat(counts, ',')
""")

# Settlements wait this long to travel together, one script call for all of them: a settlement
# only moves a count back to what was used, so it may come late.
SETTLE_EVERY = 0.05
SETTLE_BATCH = 512  # counters per call at most


def _moves(reservation: Reservation, tokens: int, cost: float) -> list[tuple[int, int]]:
    """What to add to each of the reservation's counters (by index) for it to count what was
    used."""
    spent = micros(cost)
    moves = []
    for index, counter in enumerate(reservation.counters):
        if counter.unit == TOKENS:
            delta = tokens - reservation.tokens
        elif counter.unit == MONEY:
            delta = spent - reservation.cost
        else:
            continue  # a request is a request
        if delta:
            moves.append((index, delta))
    return moves


class _Waiting:
    """One event loop's settlements waiting to be sent."""

    def __init__(self) -> None:
        self.moves: list[tuple[Counter, int]] = []
        self.due: asyncio.TimerHandle | None = None
        self.sending: set[asyncio.Task] = set()  # referenced until done


_waiting: PerLoop[_Waiting] = PerLoop()


def settle_soon(reservation: Reservation, *, tokens: int, cost: float) -> None:
    """Settle in the background, within SETTLE_EVERY, together with the other answers that end
    meanwhile: the answer's end does not wait for Redis, and many settlements cost one call.
    What the answer did not use goes back to its loop's lease, and to Redis only past it."""
    moves = _moves(reservation, tokens, cost)
    if not moves:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # an answer closed outside its loop (collected): its windows will end
        logger.warning("a spend reservation was left unsettled: no event loop")
        return
    held = loop_leases.get(Leases)
    for index, delta in moves:
        counter = reservation.counters[index]
        lease = reservation.leases[index] if reservation.leases else None
        if lease is None or held.by_key.get(counter.key) is not lease:
            queue(counter, delta)  # no lease (any more): straight to Redis
            continue
        lease.free -= delta
        if lease.free < 0:  # used more than reserved: count the rest
            queue(counter, -lease.free)
            lease.free = 0
        elif lease.free > 2 * lease.target + lease.waiting:  # more than the loop keeps
            keep = lease.target + lease.waiting
            queue(counter, keep - lease.free)
            lease.free = keep


def queue(counter: Counter, delta: int) -> None:
    """Add `delta` to a counter in Redis soon, with the other moves of the next SETTLE_EVERY."""
    waiting = _waiting.get(_Waiting)
    waiting.moves.append((counter, delta))
    if len(waiting.moves) >= SETTLE_BATCH:
        _send_waiting(waiting)
    elif waiting.due is None:
        waiting.due = asyncio.get_running_loop().call_later(SETTLE_EVERY, _send_waiting, waiting)


def retire(held: Leases, lease: Lease) -> None:
    """Give a lease's free share back to Redis; answers in flight on it settle to Redis."""
    if held.by_key.get(lease.counter.key) is lease:
        del held.by_key[lease.counter.key]
    if lease.free:
        queue(lease.counter, -lease.free)
        lease.free = 0


def sweep_soon(held: Leases) -> None:
    if held.sweep is None:
        held.sweep = asyncio.get_running_loop().call_later(LEASE_IDLE, sweep, held)


def sweep(held: Leases, *, everything: bool = False) -> None:
    """Give back the leases unused for LEASE_IDLE and those whose window is over."""
    if held.sweep is not None:
        held.sweep.cancel()
        held.sweep = None
    idle_since, now = time.monotonic() - LEASE_IDLE, time.time()
    for lease in list(held.by_key.values()):
        if everything or lease.used_at <= idle_since or lease.counter.ends <= now:
            retire(held, lease)
    if held.by_key:
        sweep_soon(held)


def _send_waiting(waiting: _Waiting) -> None:
    if waiting.due is not None:
        waiting.due.cancel()
        waiting.due = None
    moves, waiting.moves = waiting.moves, []
    if moves:
        task = asyncio.ensure_future(_send(moves))
        waiting.sending.add(task)
        task.add_done_callback(waiting.sending.discard)


async def asettled() -> None:
    """Give this loop's leases back, send the waiting settlements now and wait for every one in
    flight (benchmarks, tests: Redis then counts only what was used)."""
    held = loop_leases.peek()
    if held is not None:
        sweep(held, everything=True)
    waiting = _waiting.get(_Waiting)
    _send_waiting(waiting)
    if waiting.sending:
        await asyncio.gather(*waiting.sending)


async def _send(moves: list[tuple[Counter, int]]) -> None:
    """Move the counters. Never raises: a settlement Redis did not hear leaves the reservation
    counted, which errs on the side of the limit."""
    for start in range(0, len(moves), SETTLE_BATCH):
        part = moves[start : start + SETTLE_BATCH]
        try:
            counts = numbers(
                await run_script(_SETTLE, [c.key for c, _ in part], [d for _, d in part])
            )
        except (TimeoutError, RedisError, OSError):
            logger.warning("could not settle %d spend counter(s)", len(part), exc_info=True)
            continue
        for (counter, delta), count in zip(part, counts, strict=True):
            if counter.unit == MONEY and count >= 0:
                crossed(counter, count - delta, count)
