"""Spend counted in Redis, one count for every web process and replica.

Each limit is a counter per fixed window: requests and tokens per UTC minute, tokens per UTC day,
money (in micro-units) per UTC day or month. A request that goes to a model reserves before it
starts: one script checks every counter that applies (its key's, its user's, its groups') and,
only if all of them allow it, adds the request, its estimated tokens (prompt + the capped
max_tokens) and its estimated cost to each, atomically. So concurrent requests in any number of
processes cannot together pass a limit: a request is let in only if what is already counted,
reservations included, plus its own estimate fits. The estimates err high (routing.prompt's token
estimate bounds a real tokenizer's count; the cost is the dearest target's, engine time included:
spend.engine_time), and a request reserves at least one micro-unit of money, so a spent budget
refuses it whatever it is priced at. When the answer ends, the reservation settles to what the
engine reported (a stopped or failed stream to its prompt, which the engine took, and what it
produced), in the background and in batches: the settlements of the answers that end within
SETTLE_EVERY travel in one script call, and nothing on an answer's way waits for them.

Leases keep Redis off the answer's way too. A trip to Redis takes, besides the request's own
estimate, a share of each counter for the requests to come (up to LEASE_REQUESTS requests' worth,
at most 1/LEASE_SHARE of the limit, and only what the limit leaves). That share is counted in Redis
like any reservation, so the next requests of the process are admitted against it in memory, with
no trip, and no less exactly: every process admits only what Redis has already counted, so all of
them together can never pass a limit. An answer that used less than it reserved gives the rest
back to the lease; a lease unused for LEASE_IDLE, or whose window is over, or whose limit changed,
goes back to Redis. The price: a process's unused share is counted as used, for up to LEASE_IDLE,
which other processes and the usage endpoint see.

A budget that reroutes (Limit.OverBudget.REROUTE) is never refused here: the pipeline reads it
before it picks a rule (`aover_budget`) and sends the request by the over-budget rules.

Redis unreachable: LIMITS_ON_REDIS_OUTAGE says whether requests with limits are refused (`closed`,
the default: no spend that is not counted) or let through uncounted (`open`); either way the log
and `gateway_spend_unchecked_total` say so.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from prometheus_client import Counter as MetricCounter
from redis.exceptions import NoScriptError, RedisError

from core import redis as core_redis
from core.errors import RETRY_AFTER
from core.loops import PerLoop
from spend.policy import Spec
from spend.prices import MICROS, micros

logger = logging.getLogger(__name__)

# KEYS: the counters. ARGV[1]: for each counter "need want," (what the request needs besides
# what the loop's lease gave it, negative when a lease gives back more, and the lease wanted for
# the requests to come); ARGV[2]: for
# each counter "unit limit ttl;" (limit -1: counted, never refused). All or nothing:
# "0,index,count" when counter `index` (1-based) would go past its limit, else "1,count after,
# lease granted,..." (one string: one line to read back, not one per counter). A lease is granted
# only as far as the limit leaves.
_RESERVE = """
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
"""

# KEYS: the counters reservations counted in (a key may come more than once: several answers'
# settlements travel together). ARGV: what to add to each (negative: give back). A counter whose
# window is over is gone and stays gone. Returns each count after (-1: gone), comma-separated.
_SETTLE = """
local counts = {}
for i = 1, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 1 then
        counts[i] = redis.call('INCRBY', KEYS[i], ARGV[i])
    else
        counts[i] = -1
    end
end
return table.concat(counts, ',')
"""
_SHAS = {script: hashlib.sha1(script.encode()).hexdigest() for script in (_RESERVE, _SETTLE)}

# Settlements wait this long to travel together, one script call for all of them: a settlement
# only moves a count back to what was used, so it may come late.
SETTLE_EVERY = 0.05
SETTLE_BATCH = 512  # counters per call at most

# A trip to Redis leases, for the requests to come, up to this many requests' worth of each
# counter, at most 1/LEASE_SHARE of its limit; a lease unused for LEASE_IDLE seconds goes back.
LEASE_REQUESTS = 16
LEASE_SHARE = 16
LEASE_IDLE = 1.0
RENEWALS_WAITED = 3  # a request waits for at most this many trips of others before its own


async def _script(script: str, keys: list, args: list):
    """Run a script by its hash (Redis keeps it compiled), loading it first if Redis lost it."""
    client = core_redis.aclient()
    try:
        return await client.evalsha(_SHAS[script], len(keys), *keys, *args)
    except NoScriptError:
        return await client.eval(script, len(keys), *keys, *args)


REQUESTS, TOKENS, MONEY = "requests", "tokens", "money"

UNCHECKED = MetricCounter(
    "gateway_spend_unchecked_total",
    "Requests with limits that Redis could not count, by what the gateway did "
    "(LIMITS_ON_REDIS_OUTAGE): let through (open) or refused (closed).",
    ["outcome"],
)
WARNINGS = MetricCounter(
    "gateway_spend_warnings_total",
    "Budgets that crossed their warning share (the soft budget) or their whole (the hard "
    "budget), by subject kind.",
    ["kind", "level"],
)


@dataclass(frozen=True, slots=True)
class Counter:
    spec: Spec
    dimension: str  # requests per minute | tokens per minute | tokens per day | budget
    unit: str  # REQUESTS | TOKENS | MONEY
    key: str
    limit: int | None  # None: counted, never refused here
    ttl: int
    ends: float  # when the window ends (Unix time)

    @property
    def code(self) -> str:
        """The counter as the reserve script reads it."""
        limit = -1 if self.limit is None else self.limit
        return f"{self.unit[0]} {limit} {self.ttl};"

    @property
    def reset(self) -> float:
        """Seconds until the window ends."""
        return max(0.0, self.ends - time.time())


def _day_end(now: datetime) -> datetime:
    return datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)


def _month_end(now: datetime) -> datetime:
    return datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)


def counters(specs: tuple[Spec, ...], *, now: float | None = None) -> list[Counter]:
    """The counters of these limits in the current windows, in a fixed order. The same specs in
    the same minute give the same counters: made once a minute, not once a request."""
    now = time.time() if now is None else now
    minute = int(now // 60)
    if _made.get("minute") != minute:
        _made.clear()
        _made["minute"] = minute
    found = _made.get(specs)
    if found is None:
        found = _made[specs] = _counters(specs, now=now)
    return found


def _packed(specs: tuple[Spec, ...], found: list[Counter]) -> tuple[list[bytes], bytes]:
    """The reserve script's keys and its counters' argument, encoded once a minute."""
    packed = _made.get(("packed", specs))
    if packed is None:
        packed = _made[("packed", specs)] = (
            [c.key.encode() for c in found],
            "".join(c.code for c in found).encode(),
        )
    return packed


_made: dict = {}  # specs -> their counters, for the current minute ("minute": which one)


def _counters(specs: tuple[Spec, ...], *, now: float) -> list[Counter]:
    moment = datetime.fromtimestamp(now, UTC)
    minute = int(now // 60)
    minute_ends = (minute + 1) * 60.0
    day_ends = _day_end(moment).timestamp()
    prefix = f"{settings.REDIS_KEY_PREFIX}:spend"
    found = []
    for spec in specs:
        base = f"{prefix}:{spec.subject}"
        if spec.requests_per_minute is not None:
            found.append(
                Counter(
                    spec,
                    "requests per minute",
                    REQUESTS,
                    f"{base}:rpm:{minute}",
                    spec.requests_per_minute,
                    120,
                    minute_ends,
                )
            )
        if spec.tokens_per_minute is not None:
            found.append(
                Counter(
                    spec,
                    "tokens per minute",
                    TOKENS,
                    f"{base}:tpm:{minute}",
                    spec.tokens_per_minute,
                    120,
                    minute_ends,
                )
            )
        if spec.tokens_per_day is not None:
            found.append(
                Counter(
                    spec,
                    "tokens per day",
                    TOKENS,
                    f"{base}:tpd:{moment:%Y%m%d}",
                    spec.tokens_per_day,
                    2 * 86400,
                    day_ends,
                )
            )
        if spec.budget_micros is not None:
            if spec.budget_period == "day":
                bucket, ends, ttl = f"{moment:%Y%m%d}", day_ends, 2 * 86400
            else:
                bucket, ends, ttl = f"{moment:%Y%m}", _month_end(moment).timestamp(), 33 * 86400
            found.append(
                Counter(
                    spec,
                    f"budget per {spec.budget_period}",
                    MONEY,
                    f"{base}:cost:{bucket}",
                    None if spec.reroute else spec.budget_micros,
                    ttl,
                    ends,
                )
            )
    return found


@dataclass(frozen=True, slots=True)
class Window:
    """One limit as a client's headers say it."""

    limit: int
    remaining: int
    reset: float  # seconds


@dataclass(frozen=True, slots=True)
class Standing:
    """The tightest request and token limits after a reservation (OpenAI's x-ratelimit-*)."""

    requests: Window | None = None
    tokens: Window | None = None

    def headers(self) -> dict[str, str]:
        found = {}
        for name, window in (("requests", self.requests), ("tokens", self.tokens)):
            if window is not None:
                found[f"x-ratelimit-limit-{name}"] = str(window.limit)
                found[f"x-ratelimit-remaining-{name}"] = str(max(0, window.remaining))
                found[f"x-ratelimit-reset-{name}"] = duration(window.reset)
        return found


def duration(seconds: float) -> str:
    """OpenAI's way of writing a reset: 1s, 6m0s, 2h3m4s."""
    seconds = max(0, math.ceil(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def _standing(found: list[Counter], counts: list[int]) -> Standing:
    tightest: dict[str, Window] = {}
    for counter, count in zip(found, counts, strict=True):
        if counter.limit is None or counter.dimension.endswith("per day"):
            continue
        if counter.unit not in (REQUESTS, TOKENS):
            continue
        window = Window(counter.limit, counter.limit - count, counter.reset)
        best = tightest.get(counter.unit)
        if best is None or window.remaining < best.remaining:
            tightest[counter.unit] = window
    return Standing(requests=tightest.get(REQUESTS), tokens=tightest.get(TOKENS))


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


class _Leases:
    """One event loop's leases, by counter key, and the timer that gives back idle ones."""

    def __init__(self) -> None:
        self.by_key: dict[str, Lease] = {}
        self.sweep: asyncio.TimerHandle | None = None


_leases: PerLoop[_Leases] = PerLoop()


def _lease_target(counter: Counter, amount: int) -> int:
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


@dataclass(frozen=True)
class Refusal:
    code: str  # limit_exceeded | budget_exceeded | limits_unavailable
    message: str
    retry_after: int | None  # None: waiting does not help (the request alone is too large)
    standing: Standing | None = None


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
    held = _leases.get(_Leases)
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
        want = _lease_target(counter, amount) + lease.waiting - lease.free - lease.pending
        want = max(0, want)
        lease.pending += want
        if want:
            lease.renewal = renewal
        leases.append(lease)
        needs.append(amount - part - returned)
        parts.append(part)
        returns.append(returned)
        wants.append(want)
    keys, codes = _packed(specs, found)
    plan = "".join(f"{need} {want}," for need, want in zip(needs, wants, strict=True))
    try:
        reply = _numbers(await _script(_RESERVE, keys, [plan, codes]))
    except (TimeoutError, RedisError, OSError) as exc:
        reply = None
        failure: BaseException = exc
    finally:
        for lease, want in zip(leases, wants, strict=True):
            lease.pending -= want
            if lease.renewal is renewal:
                lease.renewal = None
        renewal.set_result(None)  # its waiters run after this request has taken the reply in
    _sweep_soon(held)
    if reply is None or reply[0] != 1:
        # Nothing was counted: what the leases gave goes back to them (or, for a lease given back
        # meanwhile, to Redis), and they may by now cover the request (renewed by another trip).
        for counter, lease, part, returned in zip(found, leases, parts, returns, strict=True):
            if part and held.by_key.get(counter.key) is lease:
                lease.free += part
            elif part:
                _queue(counter, -part)
            if returned:  # the share of a changed limit: to Redis, never to the new lease
                _queue(counter, -returned)
        if reply is None:
            return _outage(failure, tokens, cost)
        booked = _from_leases(held, found, amounts, tokens, spent)
        if booked is not None:
            return booked
        return _refusal(found[reply[1] - 1], reply[2], amounts[reply[1] - 1], found)
    now, used = time.monotonic(), []
    for i, (counter, need) in enumerate(zip(found, needs, strict=True)):
        count, grant = reply[1 + 2 * i], reply[2 + 2 * i]
        lease = held.by_key.get(counter.key)
        if lease is None or lease.counter.limit != counter.limit:
            if lease is not None:  # a request with another limit replaced it meanwhile
                _retire(held, lease)
            lease = held.by_key[counter.key] = Lease(counter)
        lease.seen, lease.used_at = count, now
        lease.target = _lease_target(counter, amounts[i])
        lease.free += grant
        leases[i] = lease
        if counter.unit == MONEY:
            _crossed(counter, count - need - grant, count)
        used.append(count - lease.free)
    return Reservation(tuple(found), tokens, spent, _standing(found, used), tuple(leases))


async def _renewed(held: _Leases, found: list[Counter], amounts: list[int]) -> bool:
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
    held: _Leases, found: list[Counter], amounts: list[int], tokens: int, spent: int
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
    standing = _standing(found, [lease.seen - lease.free for lease in covered])
    return Reservation(tuple(found), tokens, spent, standing, tuple(covered))


def _numbers(reply: bytes) -> list[int]:
    return [int(n) for n in reply.split(b",")]


def _refusal(counter: Counter, count: int, amount: int, found: list[Counter]) -> Refusal:
    retry = max(1, math.ceil(counter.reset))
    standing = _standing(found, [count if c is counter else 0 for c in found])
    who, limit = counter.spec.label, counter.limit or 0  # a refusing counter has a limit
    if counter.unit == MONEY:
        return _budget_refusal(counter, count, amount, retry, standing)
    if amount > limit:
        return Refusal(
            "limit_exceeded",
            f"This request alone needs about {amount} {counter.unit}, more than the {who}'s "
            f"limit of {limit} {counter.dimension}: ask for fewer max_tokens or a "
            "shorter conversation.",
            None,
            standing,
        )
    return Refusal(
        "limit_exceeded",
        f"Over the {who}'s limit of {limit} {counter.dimension}: {count} counted, this "
        f"request needs {amount}. Try again in {duration(retry)}.",
        retry,
        standing,
    )


def _budget_refusal(
    counter: Counter, count: int, amount: int, retry: int, standing: Standing
) -> Refusal:
    """A budget refuses: spent, too small for this request alone, or with less left than this
    request may cost (its tokens at the dearest target's prices, and its engine time)."""
    spec, limit, currency = counter.spec, counter.limit or 0, settings.SPEND_CURRENCY
    period = spec.budget_period
    if count >= limit:
        return Refusal(
            "budget_exceeded",
            f"The {spec.label}'s budget per {period} is spent ({count / MICROS:.4f} of "
            f"{limit / MICROS:.4f} {currency}); it renews in {duration(retry)}.",
            retry,
            standing,
        )
    if amount > limit:
        return Refusal(
            "budget_exceeded",
            f"This request alone may cost up to {_money(amount)} {currency}, more than the "
            f"{spec.label}'s budget of {_money(limit)} {currency} per {period}: ask for fewer "
            "max_tokens or a shorter conversation.",
            None,
            standing,
        )
    return Refusal(
        "budget_exceeded",
        f"The {spec.label}'s budget per {period} has {_money(limit - count)} of {_money(limit)} "
        f"{currency} left, and this request may cost up to {_money(amount)}; it renews in "
        f"{duration(retry)}.",
        retry,
        standing,
    )


def _money(amount: int) -> str:
    """Micro-units as a sum: 0.00015, 12.5."""
    return f"{amount / MICROS:.6f}".rstrip("0").rstrip(".")


_outage_logged = 0.0


def outage_lets_through(exc: BaseException, what: str) -> bool:
    """Redis could not count `what` (a limit): whether the request goes on uncounted
    (LIMITS_ON_REDIS_OUTAGE=open). Logged (once per 10 s of an outage, not once per request) and
    counted either way."""
    global _outage_logged
    opened = settings.LIMITS_ON_REDIS_OUTAGE == "open"
    UNCHECKED.labels("open" if opened else "closed").inc()
    now = time.monotonic()
    if now - _outage_logged > 10:
        _outage_logged = now
        logger.error(
            "%s cannot be counted (%s: %s); LIMITS_ON_REDIS_OUTAGE=%s: requests are %s",
            what,
            type(exc).__name__,
            exc,
            settings.LIMITS_ON_REDIS_OUTAGE,
            "let through uncounted" if opened else "refused",
        )
    return opened


def _outage(exc: BaseException, tokens: int, cost: float) -> Reservation | Refusal:
    if outage_lets_through(exc, "spend limits"):
        return Reservation((), tokens, micros(cost), Standing())
    return Refusal(
        "limits_unavailable",
        "Your usage limits cannot be checked right now; try again shortly.",
        RETRY_AFTER,
    )


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
    held = _leases.get(_Leases)
    for index, delta in moves:
        counter = reservation.counters[index]
        lease = reservation.leases[index] if reservation.leases else None
        if lease is None or held.by_key.get(counter.key) is not lease:
            _queue(counter, delta)  # no lease (any more): straight to Redis
            continue
        lease.free -= delta
        if lease.free < 0:  # used more than reserved: count the rest
            _queue(counter, -lease.free)
            lease.free = 0
        elif lease.free > 2 * lease.target + lease.waiting:  # more than the loop keeps
            keep = lease.target + lease.waiting
            _queue(counter, keep - lease.free)
            lease.free = keep


def _queue(counter: Counter, delta: int) -> None:
    """Add `delta` to a counter in Redis soon, with the other moves of the next SETTLE_EVERY."""
    waiting = _waiting.get(_Waiting)
    waiting.moves.append((counter, delta))
    if len(waiting.moves) >= SETTLE_BATCH:
        _send_waiting(waiting)
    elif waiting.due is None:
        waiting.due = asyncio.get_running_loop().call_later(SETTLE_EVERY, _send_waiting, waiting)


def _retire(held: _Leases, lease: Lease) -> None:
    """Give a lease's free share back to Redis; answers in flight on it settle to Redis."""
    if held.by_key.get(lease.counter.key) is lease:
        del held.by_key[lease.counter.key]
    if lease.free:
        _queue(lease.counter, -lease.free)
        lease.free = 0


def _sweep_soon(held: _Leases) -> None:
    if held.sweep is None:
        held.sweep = asyncio.get_running_loop().call_later(LEASE_IDLE, _sweep, held)


def _sweep(held: _Leases, *, everything: bool = False) -> None:
    """Give back the leases unused for LEASE_IDLE and those whose window is over."""
    if held.sweep is not None:
        held.sweep.cancel()
        held.sweep = None
    idle_since, now = time.monotonic() - LEASE_IDLE, time.time()
    for lease in list(held.by_key.values()):
        if everything or lease.used_at <= idle_since or lease.counter.ends <= now:
            _retire(held, lease)
    if held.by_key:
        _sweep_soon(held)


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
    held = _leases.peek()
    if held is not None:
        _sweep(held, everything=True)
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
            counts = _numbers(
                await _script(_SETTLE, [c.key for c, _ in part], [d for _, d in part])
            )
        except (TimeoutError, RedisError, OSError):
            logger.warning("could not settle %d spend counter(s)", len(part), exc_info=True)
            continue
        for (counter, delta), count in zip(part, counts, strict=True):
            if counter.unit == MONEY and count >= 0:
                _crossed(counter, count - delta, count)


def _crossed(counter: Counter, before: int, after: int) -> None:
    """Log and count a budget whose spend just crossed its warning share or its whole: by the one
    reservation or settlement that crossed it, whichever process made it (the count holds what is
    reserved for the answers in flight, so a settlement below the line and a later reservation
    crossing it again count twice)."""
    spec, budget = counter.spec, counter.spec.budget_micros or 0
    for level, line in (("warn", budget * spec.warn_at), ("spent", budget)):
        if before < line <= after:
            WARNINGS.labels(spec.kind, level).inc()
            logger.warning(
                "spend: %s has spent %.4f of its %.4f %s budget per %s (%s)",
                spec.label,
                after / MICROS,
                budget / MICROS,
                settings.SPEND_CURRENCY,
                spec.budget_period,
                "warning share reached" if level == "warn" else "budget spent",
            )


async def aover_budget(specs: tuple[Spec, ...]) -> bool:
    """Whether any budget that reroutes is spent (one read). Redis unreachable: as
    LIMITS_ON_REDIS_OUTAGE says (closed: over, so the cheaper rules take the request)."""
    found = [c for c in counters(tuple(s for s in specs if s.reroute)) if c.unit == MONEY]
    if not found:
        return False
    try:
        values = await core_redis.aclient().mget([c.key for c in found])
    except (TimeoutError, RedisError, OSError):
        logger.warning("cannot read the budgets that reroute", exc_info=True)
        return settings.LIMITS_ON_REDIS_OUTAGE != "open"
    return any(
        int(value or 0) >= (c.spec.budget_micros or 0)
        for c, value in zip(found, values, strict=True)
    )


@dataclass(frozen=True)
class Reading:
    """One limit's counter as the usage endpoint and the dashboard show it."""

    spec: Spec
    dimension: str
    unit: str
    limit: int
    used: int
    reset: float

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


def readings(specs: tuple[Spec, ...]) -> list[Reading]:
    """Every counter of these limits now (blocking; for the usage endpoint and the dashboard)."""
    found = counters(specs)
    if not found:
        return []
    values = core_redis.client().mget([c.key for c in found])
    return [
        Reading(
            c.spec,
            c.dimension,
            c.unit,
            c.spec.budget_micros if c.unit == MONEY else c.limit,  # type: ignore[arg-type]
            int(value or 0),
            c.reset,
        )
        for c, value in zip(found, values, strict=True)
    ]
