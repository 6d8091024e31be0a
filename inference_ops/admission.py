"""Admission at an endpoint's capacity, shared by every web process through Redis.

An endpoint with a `capacity` (e.g. the engine's max_num_seqs) takes at most that many requests at
once from all gateway processes together; the others wait here, in the gateway, instead of in the
engine's first-come queue, and leave in this order: priority class first (interactive, api,
batch), then fair share among tenants (a tenant is a user; an API key counts as its owner): the
tenant who used the fewest tokens recently goes first, as in virtual-token-counter scheduling.
A tenant's count is what its admitted requests reserved (prompt estimate plus max_tokens), halving
every ADMISSION_HALF_LIFE seconds. One tenant may not fill the last ADMISSION_RESERVE slots: they
stay for the others, so a person who asks beside a busy integration starts at once instead of
after the next long stream ends. A request that finds no room within its class's deadline
(ADMISSION_DEADLINE_*) fails as EngineError("busy") with a Retry-After: the pipeline goes to the
rule's next target, or the client gets a 429.

The same discipline as the spend leases (spend.ledger) and the stream slots (core.slots): nothing
is held while tokens flow, and Redis is asked at the start and the end of a request only. Below
capacity a request costs one script call to take its slot and one ZREM, in the background, to give
it back; an endpoint without a capacity costs nothing. A slot is a sorted-set member scored by the
end of its lease (the endpoint's total_timeout and a margin): the slots of a process that dies
return on their own when their lease ends.

Above capacity each process queues its waiters in memory, in the same order, and only its first
one stands in Redis's waiting set: the script admits a request when there is room and no better
waiter of another process (one whose tenant may still take a slot) stands before it. The first
waiter tries again when a slot of this process is given back, or every POLL seconds for the slots
of the others; its place in the waiting set lapses after WAIT_LEASE unless renewed, so a dead
process's waiter blocks no one for long.

Redis unreachable: admission fails open to this process alone, as the breaker and the ledger's
`open` mode do: each process admits at most `capacity` requests by itself (so N processes may
together send up to N times the capacity, as before admission existed). Logged once per 10 s of
an outage and counted in gateway_admission_unchecked_total.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import secrets
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from django.conf import settings
from prometheus_client import Counter, Gauge, Histogram
from redis.exceptions import RedisError

from core import redis as core_redis
from core.errors import RETRY_AFTER
from core.loops import PerLoop
from inference_ops.exceptions import EngineError

logger = logging.getLogger(__name__)

# Priority classes, best first.
CLASSES = ("interactive", "api", "batch")

POLL = 0.05  # seconds between a waiting process's tries for slots other processes give back
WAIT_LEASE = 2.0  # a process's place in the waiting set lapses after this unless renewed
LEASE_MARGIN = 30.0  # a slot's lease: the endpoint's total_timeout and this
# Each process's waiting counts, by class, for the dashboard and the route tester (`occupancy`):
# written this long after they change, so a burst of arrivals costs one write; each write lasts
# QUEUED_LEASE, renewed at half of it while requests wait, so a dead process's counts lapse.
PUBLISH_AFTER = 0.2
QUEUED_LEASE = 10.0

WAITING = Gauge(
    "gateway_admission_waiting",
    "Requests waiting in this process for room at an endpoint's capacity",
    ["endpoint", "priority"],
    multiprocess_mode="livesum",
)
WAIT = Histogram(
    "gateway_admission_wait_seconds",
    "Time a request waited for room at an endpoint's capacity (admitted or not)",
    ["endpoint", "priority"],
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
REFUSED = Counter(
    "gateway_admission_refused_total",
    "Requests that found no room at an endpoint within their class's deadline",
    ["endpoint", "priority"],
)
UNCHECKED = Counter(
    "gateway_admission_unchecked_total",
    "Requests admitted by their process alone because Redis was unreachable",
)


@dataclass(slots=True)
class Ticket:
    """Who asks, for admission: set by the pipeline for the request's task (`ticket`)."""

    tenant: str = ""
    priority: str = "api"
    tokens: int = 0  # what the request may use: its prompt's estimate and its max_tokens
    waited: float = 0.0  # seconds spent waiting for room, every attempt of the request together


ticket: ContextVar[Ticket | None] = ContextVar("admission_ticket", default=None)


def _base(endpoint: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:admission:{endpoint}"


def rank() -> int:
    """The running request's class as vLLM's `priority` (lower goes first): 0 interactive, 1 api,
    2 batch."""
    t = ticket.get()
    return CLASSES.index(t.priority) if t is not None and t.priority in CLASSES else 1


def deadline_of(priority: str) -> float:
    return {
        "interactive": settings.ADMISSION_DEADLINE_INTERACTIVE,
        "api": settings.ADMISSION_DEADLINE_API,
        "batch": settings.ADMISSION_DEADLINE_BATCH,
    }.get(priority, settings.ADMISSION_DEADLINE_API)


# KEYS: held (slot -> end of lease), waiting (member -> score), lapses (member -> end of its place),
# usage (tenant -> "tokens time"). ARGV: slot ("tenant|id"), tenant, capacity, the most one tenant
# may hold, lease, class rank, member ("tenant|process", '' to try without queueing), the member
# to take out first ('' none), wait lease, tokens to count, half-life. Returns 1 admitted, 0 not
# (queued when a member is given), 2 not because the tenant holds all it may (not queued).
_TAKE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local held, waiting, lapses, usage = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local tenant, capacity, most = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local lease, rank, member, previous = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], ARGV[8]
local wait_lease, tokens, half = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
for _, name in ipairs(redis.call('ZRANGEBYSCORE', lapses, '-inf', now)) do
    redis.call('ZREM', waiting, name)
end
redis.call('ZREMRANGEBYSCORE', lapses, '-inf', now)
if previous ~= '' then
    redis.call('ZREM', waiting, previous)
    redis.call('ZREM', lapses, previous)
end
local holders = redis.call('ZRANGE', held, 0, -1)
local per = {}
for _, name in ipairs(holders) do
    local owner = string.match(name, '^(.*)|')
    per[owner] = (per[owner] or 0) + 1
end
local used = 0
local state = redis.call('HGET', usage, tenant)
if state then
    local count, at = string.match(state, '(%S+) (%S+)')
    used = tonumber(count) * math.pow(0.5, (now - tonumber(at)) / half)
end
-- The tenant's place: log2 of its decayed count plus now / half-life. The same order as the
-- decayed counts at any moment, but it does not change while nothing is counted: a waiting
-- set's scores written at different times compare right, and one tenant's waiters keep theirs.
local place = -1e11
if used > 0 then
    place = now / half + math.log(used) / math.log(2)
end
local score = rank * 1e12 + place
if (per[tenant] or 0) >= most then
    return 2
end
local room = capacity - #holders
if room > 0 then
    local ahead = 0
    for _, name in ipairs(redis.call('ZRANGEBYSCORE', waiting, '-inf', '(' .. score)) do
        if name ~= member and (per[string.match(name, '^(.*)|')] or 0) < most then
            ahead = ahead + 1
        end
    end
    if ahead < room then
        if member ~= '' then
            redis.call('ZREM', waiting, member)
            redis.call('ZREM', lapses, member)
        end
        redis.call('ZADD', held, now + lease, ARGV[1])
        redis.call('EXPIRE', held, math.ceil(lease) + 1)
        redis.call('HSET', usage, tenant, (used + tokens) .. ' ' .. now)
        redis.call('EXPIRE', usage, math.ceil(half * 10))
        return 1
    end
end
if member ~= '' then
    redis.call('ZADD', waiting, score, member)
    redis.call('ZADD', lapses, now + wait_lease, member)
    redis.call('EXPIRE', waiting, math.ceil(wait_lease) + 1)
    redis.call('EXPIRE', lapses, math.ceil(wait_lease) + 1)
end
return 0
"""

# KEYS: queued (process -> "end of lease, then its waiting count per class"). ARGV: process,
# lease, one count per class of CLASSES. Drops the lapsed entries of dead processes on the way.
_PUBLISH = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local key, lease = KEYS[1], tonumber(ARGV[2])
local entries = redis.call('HGETALL', key)
for i = 1, #entries, 2 do
    if tonumber(string.match(entries[i + 1], '^(%S+)')) < now then
        redis.call('HDEL', key, entries[i])
    end
end
if ARGV[3] == '0' and ARGV[4] == '0' and ARGV[5] == '0' then
    redis.call('HDEL', key, ARGV[1])
else
    local counts = ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5]
    redis.call('HSET', key, ARGV[1], string.format('%.3f ', now + lease) .. counts)
    redis.call('EXPIRE', key, math.ceil(lease) + 1)
end
return 1
"""

_outage_logged = 0.0


def _outage(exc: BaseException, endpoint: str) -> None:
    global _outage_logged
    UNCHECKED.inc()
    now = time.monotonic()
    if now - _outage_logged > 10:
        _outage_logged = now
        logger.error(
            "admission to %s cannot be shared (%s: %s): each process admits up to the capacity "
            "by itself",
            endpoint,
            type(exc).__name__,
            exc,
        )


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    rank: int
    arrival: int
    slot: str  # its name in the held set, "tenant|id"
    # The slot's name once admitted through Redis, "" when admitted by this process alone.
    future: asyncio.Future[str] = field(repr=False)


@dataclass(slots=True)
class Admitted:
    """A request's place at the endpoint, held until `leave`."""

    gate: _Gate
    slot: str  # "" when admitted by this process alone (Redis unreachable)

    def leave(self) -> None:
        self.gate.leave(self.slot)


# What the script answers.
_REFUSED, _ADMITTED, _TENANT_FULL = 0, 1, 2


class _Gate:
    """One endpoint's admission in this process (and event loop)."""

    def __init__(self, name: str, capacity: int, lease: float):
        self.name, self.capacity, self.lease = name, capacity, lease
        base = _base(name)
        self.keys = (f"{base}:held", f"{base}:waiting", f"{base}:lapses", f"{base}:usage")
        self.queued_key = f"{base}:queued"  # process -> its waiting counts by class (`occupancy`)
        self.process = secrets.token_hex(6)
        # Waiters by tenant and class, each in arrival order: the next to try is the head with
        # the best class, then the tenant with the fewest tokens now (not when it arrived).
        self.queues: dict[tuple[str, int], collections.deque[_Waiter]] = {}
        self.arrivals = itertools.count()
        self.wake = asyncio.Event()
        self.pump: asyncio.Task | None = None
        self.standing = ""  # this process's member in the waiting set
        self.alone = asyncio.Semaphore(capacity)  # admission while Redis is unreachable
        self.used: dict[str, tuple[float, float]] = {}  # this process's view: tokens, when
        self.tasks: set[asyncio.Task] = set()
        self.queued = dict.fromkeys(CLASSES, 0)  # waiting in this process now, by class
        self.recounted = asyncio.Event()
        self.publisher: asyncio.Task | None = None

    def most(self) -> int:
        """The slots one tenant may hold."""
        reserve = settings.ADMISSION_RESERVE
        return self.capacity - reserve if self.capacity > reserve else self.capacity

    async def _take(self, waiter: _Waiter, member: str) -> int:
        t = waiter.ticket
        took = int(
            await core_redis.aclient().eval(
                _TAKE,
                4,
                *self.keys,
                waiter.slot,
                t.tenant,
                self.capacity,
                self.most(),
                self.lease,
                waiter.rank,
                member,
                self.standing if member and self.standing != member else "",
                WAIT_LEASE,
                t.tokens,
                settings.ADMISSION_HALF_LIFE,
            )
        )
        if member:
            # Queued when refused for room; the member before it is taken out in either case.
            if took == _REFUSED:
                self.standing = member
            elif took == _ADMITTED or self.standing != member:
                self.standing = ""
        if took == _ADMITTED:
            self._count(t)
        return took

    def _count(self, t: Ticket) -> None:
        """This process's view of the tenant's recent tokens: orders its own waiters."""
        now = time.monotonic()
        tokens, at = self.used.get(t.tenant, (0.0, now))
        decayed = tokens * 0.5 ** ((now - at) / settings.ADMISSION_HALF_LIFE)
        self.used[t.tenant] = (decayed + t.tokens, now)

    def _place(self, tenant: str) -> float:
        """The tenant's place as in the script: its decayed count, in a form that does not
        change with time (log2 of the count plus the time in half-lives)."""
        tokens, at = self.used.get(tenant, (0.0, 0.0))
        return at / settings.ADMISSION_HALF_LIFE + math.log2(tokens) if tokens > 0 else -1e11

    def _candidates(self) -> list[_Waiter]:
        """The head of each tenant's and class's queue, best first; queues emptied of the
        waiters that left."""
        heads = []
        for key in list(self.queues):
            queue = self.queues[key]
            while queue and queue[0].future.done():  # gone: timed out or cancelled
                queue.popleft()
            if queue:
                heads.append(queue[0])
            else:
                del self.queues[key]
        heads.sort(key=lambda w: (w.rank, self._place(w.ticket.tenant), w.arrival))
        return heads

    async def enter(self, t: Ticket) -> Admitted:
        loop = asyncio.get_running_loop()
        started = loop.time()
        priority = t.priority if t.priority in CLASSES else "api"
        waiter = _Waiter(
            t,
            CLASSES.index(priority),
            next(self.arrivals),
            f"{t.tenant}|{secrets.token_hex(8)}",
            loop.create_future(),
        )
        if not self.queues:
            try:
                if await self._take(waiter, "") == _ADMITTED:
                    return Admitted(self, waiter.slot)
            except RedisError as exc:
                _outage(exc, self.name)
                return await self._enter_alone(t, started, priority)
        queue = self.queues.setdefault((t.tenant, waiter.rank), collections.deque())
        # In arrival order: requests that tried at once without queueing come back from Redis in
        # any order.
        at = len(queue)
        while at and queue[at - 1].arrival > waiter.arrival:
            at -= 1
        queue.insert(at, waiter)
        if self.pump is None:
            self.pump = loop.create_task(self._pump())
        self.wake.set()
        self._queue_count(priority, 1)
        deadline = deadline_of(priority)
        slot = None
        try:
            async with asyncio.timeout(deadline):
                slot = await waiter.future
                if not slot:  # Redis went away meanwhile: this process alone decides
                    await self.alone.acquire()
            return Admitted(self, slot)
        except BaseException as exc:
            # Admitted as the wait ended (a timeout or a cancellation racing the admission): the
            # place goes back at once rather than at its lease's end.
            future = waiter.future
            if slot is None and future.done() and not future.cancelled() and future.result():
                self.leave(future.result())
            if not isinstance(exc, TimeoutError):
                raise
            raise self._busy(priority, deadline) from None
        finally:
            self._queue_count(priority, -1)
            waited = loop.time() - started
            WAIT.labels(self.name, priority).observe(waited)
            t.waited += waited

    def _queue_count(self, priority: str, step: int) -> None:
        WAITING.labels(self.name, priority).inc(step)
        self.queued[priority] += step
        self.recounted.set()
        if self.publisher is None:
            self.publisher = asyncio.get_running_loop().create_task(self._publish())

    async def _publish(self) -> None:
        """Keep this process's waiting counts in Redis while requests wait here: a request below
        the capacity never waits, so it costs nothing; the last write says nothing waits."""
        try:
            while True:
                await asyncio.sleep(PUBLISH_AFTER)
                self.recounted.clear()
                counts = [self.queued[c] for c in CLASSES]
                try:
                    await core_redis.aclient().eval(
                        _PUBLISH, 1, self.queued_key, self.process, QUEUED_LEASE, *counts
                    )
                except RedisError:
                    pass  # what was written lapses with its lease; admission logs the outage
                except Exception:  # the counts must not stop being kept
                    logger.exception("admission: publishing %s's waiting counts failed", self.name)
                if not any(counts) and not self.recounted.is_set():
                    return
                try:
                    async with asyncio.timeout(QUEUED_LEASE / 2):
                        await self.recounted.wait()
                except TimeoutError:
                    pass
        finally:
            self.publisher = None

    async def _enter_alone(self, t: Ticket, started: float, priority: str) -> Admitted:
        deadline = deadline_of(priority)
        try:
            async with asyncio.timeout(deadline):
                await self.alone.acquire()
        except TimeoutError:
            raise self._busy(priority, deadline) from None
        finally:
            t.waited += asyncio.get_running_loop().time() - started
        return Admitted(self, "")

    def _busy(self, priority: str, deadline: float) -> EngineError:
        """No room within the class's deadline: counted, and the error the caller gets."""
        REFUSED.labels(self.name, priority).inc()
        return EngineError(
            "busy",
            f"no room within {deadline:g}s: {self.capacity} requests in flight",
            endpoint=self.name,
            retry_after=RETRY_AFTER,
        )

    async def _pump(self) -> None:
        """Admit this process's waiters, best first: each round tries the best head, and the
        next tenant's when a tenant holds all it may; it waits when one is refused for room."""
        try:
            while candidates := self._candidates():
                self.wake.clear()
                for waiter in candidates:
                    try:
                        took = await self._take(waiter, f"{waiter.ticket.tenant}|{self.process}")
                    except Exception as exc:  # the waiters must not be left without a pump
                        if isinstance(exc, RedisError):
                            _outage(exc, self.name)
                        else:
                            logger.exception("admission to %s failed; admitting alone", self.name)
                        took = None
                    if took == _TENANT_FULL:
                        continue
                    queue = self.queues.get((waiter.ticket.tenant, waiter.rank))
                    if took != _REFUSED and queue and queue[0] is waiter:
                        queue.popleft()
                    if took is None:
                        if not waiter.future.done():
                            waiter.future.set_result("")
                    elif took == _ADMITTED:
                        if waiter.future.done():  # it left while its slot was being taken
                            self.leave(waiter.slot)
                        else:
                            waiter.future.set_result(waiter.slot)
                    break
                else:
                    took = _REFUSED  # every tenant waiting here holds all it may
                if took == _REFUSED:
                    try:
                        async with asyncio.timeout(POLL):
                            await self.wake.wait()
                    except TimeoutError:
                        pass
        finally:
            self.pump = None
            if self.standing:
                self._background(self._withdraw(self.standing))
                self.standing = ""

    async def _withdraw(self, member: str) -> None:
        client = core_redis.aclient()
        async with client.pipeline(transaction=False) as pipe:
            pipe.zrem(self.keys[1], member)
            pipe.zrem(self.keys[2], member)
            await pipe.execute()

    def leave(self, slot: str) -> None:
        if not slot:
            self.alone.release()
            return
        self._background(self._give_back(slot))

    async def _give_back(self, slot: str) -> None:
        try:
            await core_redis.aclient().zrem(self.keys[0], slot)
        finally:
            self.wake.set()

    def _background(self, work) -> None:
        """Redis work after the answer: off its way, kept referenced until done; a failure
        leaves the slot to its lease."""
        task = asyncio.get_running_loop().create_task(_quietly(work))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def _quietly(work) -> None:
    try:
        await work
    except RedisError as exc:
        logger.warning("admission: giving back to Redis failed (%s); the lease returns it", exc)


_gates: PerLoop[_Gate] = PerLoop()


async def admit(name: str, capacity: int, total_timeout: float) -> Admitted:
    """Wait for room at endpoint `name` for the request of the running task's `ticket`: its place,
    to `leave` when the request ends; or EngineError("busy") past its class's deadline."""
    gate = _gates.get(
        lambda: _Gate(name, capacity, total_timeout + LEASE_MARGIN), (name, capacity, total_timeout)
    )
    return await gate.enter(ticket.get() or Ticket())


# KEYS: held, queued. Returns the slots held now and the waiting counts of every live process,
# one per class of CLASSES.
_OCCUPANCY = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local held = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local counts = {0, 0, 0}
local entries = redis.call('HGETALL', KEYS[2])
for i = 2, #entries, 2 do
    local lease, a, b, c = string.match(entries[i], '^(%S+) (%S+) (%S+) (%S+)$')
    if lease and tonumber(lease) >= now then
        counts[1], counts[2], counts[3] = counts[1] + a, counts[2] + b, counts[3] + c
    end
end
return {held, counts[1], counts[2], counts[3]}
"""


@dataclass(frozen=True, slots=True)
class Occupancy:
    """An endpoint's admission now, as every process sees it."""

    held: int  # slots taken and not given back (a dead process's until their lease ends)
    waiting: dict[str, int]  # requests waiting for room, by class, in every process


async def occupancy(names: list[str]) -> dict[str, Occupancy]:
    """Each endpoint's held slots and waiting requests (read-only; one round trip for all).
    Raises RedisError when Redis cannot be read."""
    if not names:
        return {}
    client = core_redis.aclient()
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            base = _base(name)
            pipe.eval(_OCCUPANCY, 2, f"{base}:held", f"{base}:queued")
        rows = await pipe.execute()
    return {
        name: Occupancy(
            held=int(row[0]), waiting=dict(zip(CLASSES, map(int, row[1:]), strict=True))
        )
        for name, row in zip(names, rows, strict=True)
    }
