"""A request's reservation: before a model is asked, one request, its estimated tokens and its
estimated cost counted against every limit that applies, all or none. Admitted in memory when the
loop's leases cover it, else by one trip to Redis (one script) that also renews the leases; a
burst waits for the trips in flight rather than making one each. spend.ledger.settlement settles
it when the answer ends."""

from __future__ import annotations

import asyncio
import time

from redis.exceptions import RedisError

from core.errors import RETRY_AFTER
from spend.ledger.counter import (
    MONEY,
    REQUESTS,
    TOKENS,
    Counter,
    counters,
    crossed,
    numbers,
    packed,
    redis_script,
    run_script,
)
from spend.ledger.leases import Lease, Leases, Reservation, lease_target, loop_leases
from spend.ledger.reads import Standing, standing_of
from spend.ledger.refusals import Refusal, outage_lets_through, refusal
from spend.ledger.settlement import queue, retire, sweep_soon
from spend.policy import Spec
from spend.prices import micros

# KEYS: the counters. ARGV[1]: for each counter "need want," (what the request needs besides
# what the loop's lease gave it, negative when a lease gives back more, and the lease wanted for
# the requests to come); ARGV[2]: for
# each counter "unit limit ttl;" (limit -1: counted, never refused). All or nothing:
# "0,index,count" when counter `index` (1-based) would go past its limit, else "1,count after,
# lease granted,..." (one string: one line to read back, not one per counter). A lease is granted
# only as far as the limit leaves.
_RESERVE = redis_script("""
local needs, wants, limits, ttls, counts = {}, {}, {}, {}, {}
for need, want in string.gmatch(ARGV[1], '(%-?%d+) (%d+),') do
    needs[#needs + 1], wants[#wants + 1] = tonumber(need), tonumber(want)
end
for limit, ttl in string.gmatch(ARGV[2], '%a (%-?%d+) (%d+);') do
    limits[#limits + 1], ttls[#ttls + 1] = tonumber(limit), ttl
end
for i = 1, #KEYS do
    if limits[i] >= 0 then
        local count = tonumber(redis.call('GET', KEYS[i]) or '0')
        if needs[i] > 0 and count + needs[i] > limits[i] then
            return '0,' .. i .. ',' .. count
        end
        counts[i] = count
    end
end
local out = {1}
for i = 1, #KEYS do
    local grant = wants[i]
    if limits[i] >= 0 then
        grant = math.max(0, math.min(grant, limits[i] - counts[i] - needs[i]))
    end
    out[#out + 1] = redis.call('INCRBY', KEYS[i], needs[i] + grant)
    out[#out + 1] = grant
    if redis.call('TTL', KEYS[i]) < 0 then
        redis.call('EXPIRE', KEYS[i], ttls[i])
    end
end
return table.concat(out, ',')
""")

RENEWALS_WAITED = 3  # a request waits for at most this many trips of others before its own


def _amounts(found: list[Counter], tokens: int, cost: int) -> list[int]:
    return [1 if c.unit == REQUESTS else tokens if c.unit == TOKENS else cost for c in found]


async def areserve(specs: tuple[Spec, ...], *, tokens: int, cost: float) -> Reservation | Refusal:
    """Reserve one request of `tokens` tokens costing `cost` against every limit in `specs`:
    all counted, or none and a Refusal that says which limit and when to come back. Admitted in
    memory when this loop's leases cover it, else by one trip to Redis that also renews them."""
    found = counters(specs)
    # At least one micro-unit: a spent budget refuses a request whatever its estimate, even one
    # priced at nothing (the script checks a counter only for an amount above 0).
    spent = max(1, micros(cost))
    if not found:
        return Reservation((), tokens, spent, Standing())
    amounts = _amounts(found, tokens, spent)
    held = loop_leases.get(Leases)
    booked, waits = _from_leases(held, found, amounts, tokens, spent), 0
    while booked is None and waits < RENEWALS_WAITED and await _renewed(held, found, amounts):
        booked, waits = _from_leases(held, found, amounts, tokens, spent), waits + 1
    if booked is not None:
        return booked
    # A trip: what this loop's leases hold goes towards the request, Redis is asked for the rest
    # and for the leases' renewal: their share, and what the requests waiting on them need, less
    # what trips in flight already ask for. A lease whose limit changed is replaced, and its
    # share given back in the same trip (a negative need), so that the new limit is checked
    # against a count without it.
    leases, needs, parts, returns, wants = [], [], [], [], []
    renewal = asyncio.get_running_loop().create_future()
    for counter, amount in zip(found, amounts, strict=True):
        lease = held.by_key.get(counter.key)
        returned = 0
        if lease is not None and lease.counter.limit != counter.limit:
            returned, lease.free = lease.free, 0
            lease = None
        if lease is None:
            lease = held.by_key[counter.key] = Lease(counter)
        part = min(lease.free, amount)
        lease.free -= part
        want = lease_target(counter, amount) + lease.waiting - lease.free - lease.pending
        want = max(0, want)
        lease.pending += want
        if want:
            lease.renewal = renewal
        leases.append(lease)
        needs.append(amount - part - returned)
        parts.append(part)
        returns.append(returned)
        wants.append(want)
    keys, codes = packed(specs, found)
    plan = "".join(f"{need} {want}," for need, want in zip(needs, wants, strict=True))
    try:
        reply = numbers(await run_script(_RESERVE, keys, [plan, codes]))
    except (TimeoutError, RedisError, OSError) as exc:
        reply = None
        failure: BaseException = exc
    finally:
        for lease, want in zip(leases, wants, strict=True):
            lease.pending -= want
            if lease.renewal is renewal:
                lease.renewal = None
        renewal.set_result(None)  # its waiters run after this request has taken the reply in
    sweep_soon(held)
    if reply is None or reply[0] != 1:
        # Nothing was counted: what the leases gave goes back to them (or, for a lease given back
        # meanwhile, to Redis), and they may by now cover the request (renewed by another trip).
        for counter, lease, part, returned in zip(found, leases, parts, returns, strict=True):
            if part and held.by_key.get(counter.key) is lease:
                lease.free += part
            elif part:
                queue(counter, -part)
            if returned:  # the share of a changed limit: to Redis, never to the new lease
                queue(counter, -returned)
        if reply is None:
            return _outage(failure, tokens, cost)
        booked = _from_leases(held, found, amounts, tokens, spent)
        if booked is not None:
            return booked
        return refusal(found[reply[1] - 1], reply[2], amounts[reply[1] - 1], found)
    now, used = time.monotonic(), []
    for i, (counter, need) in enumerate(zip(found, needs, strict=True)):
        count, grant = reply[1 + 2 * i], reply[2 + 2 * i]
        lease = held.by_key.get(counter.key)
        if lease is None or lease.counter.limit != counter.limit:
            if lease is not None:  # a request with another limit replaced it meanwhile
                retire(held, lease)
            lease = held.by_key[counter.key] = Lease(counter)
        lease.seen, lease.used_at = count, now
        lease.target = lease_target(counter, amounts[i])
        lease.free += grant
        leases[i] = lease
        if counter.unit == MONEY:
            crossed(counter, count - need - grant, count)
        used.append(count - lease.free)
    return Reservation(tuple(found), tokens, spent, standing_of(found, used), tuple(leases))


async def _renewed(held: Leases, found: list[Counter], amounts: list[int]) -> bool:
    """A burst: when the trips in flight renewing every lease short of this request bring
    enough for it besides the requests already waiting, wait for them (one reply wakes all their
    waiters) instead of a trip of its own. Otherwise this request's trip asks for the waiters'
    need too, so that a burst makes its trips side by side, one per lease's worth of requests,
    and no request waits for more than one of them. False: nothing waited for."""
    short = []
    for counter, amount in zip(found, amounts, strict=True):
        lease = held.by_key.get(counter.key)
        if lease is not None and lease.covers(counter, amount):
            continue
        if lease is None or lease.renewal is None or lease.counter.limit != counter.limit:
            return False
        if lease.free + lease.pending - lease.waiting < amount:
            return False
        short.append((lease, amount))
    for lease, amount in short:
        lease.waiting += amount
    try:
        await asyncio.wait({lease.renewal for lease, _ in short if lease.renewal is not None})
    finally:
        for lease, amount in short:
            lease.waiting -= amount
    return True


def _from_leases(
    held: Leases, found: list[Counter], amounts: list[int], tokens: int, spent: int
) -> Reservation | None:
    """The reservation if this loop's leases cover every counter, taken from them in memory."""
    covered = []
    for counter, amount in zip(found, amounts, strict=True):
        lease = held.by_key.get(counter.key)
        if lease is None or not lease.covers(counter, amount):
            return None
        covered.append(lease)
    now = time.monotonic()
    for lease, amount in zip(covered, amounts, strict=True):
        lease.free -= amount
        lease.used_at = now
    standing = standing_of(found, [lease.seen - lease.free for lease in covered])
    return Reservation(tuple(found), tokens, spent, standing, tuple(covered))


def _outage(exc: BaseException, tokens: int, cost: float) -> Reservation | Refusal:
    if outage_lets_through(exc, "spend limits"):
        return Reservation((), tokens, micros(cost), Standing())
    return Refusal(
        "limits_unavailable",
        "Your usage limits cannot be checked right now; try again shortly.",
        RETRY_AFTER,
    )
