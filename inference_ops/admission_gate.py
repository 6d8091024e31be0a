"""One endpoint's admission (or one replica pool's) in this process: `admit`, its waiters queued in
memory by class and tenant, the first of them standing in Redis's waiting set, the place each is
given, and admission by this process alone while Redis is unreachable. What it decides and why:
`inference_ops.admission`."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import secrets
import time
from dataclasses import dataclass, field

from django.conf import settings
from redis.exceptions import RedisError

from core import redis as core_redis
from core.errors import RETRY_AFTER
from core.loops import PerLoop
from inference_ops.admission import (
    CLASSES,
    REFUSED,
    UNCHECKED,
    WAIT,
    WAITING,
    Member,
    Place,
    Ticket,
    deadline_of,
    ticket,
)
from inference_ops.admission_scripts import PUBLISH, TAKE, TAKE_UP, endpoint_base, endpoint_keys
from inference_ops.exceptions import EngineError

logger = logging.getLogger(__name__)

POLL = 0.05  # seconds between a waiting process's tries for slots other processes give back
WAIT_LEASE = 2.0  # a process's place in the waiting set lapses after this unless renewed
LEASE_MARGIN = 30.0  # a slot's lease: the endpoint's total_timeout and this
# Each process's waiting counts, by class, for the dashboard and the route tester (`occupancy`):
# written this long after they change, so a burst of arrivals costs one write; each write lasts
# QUEUED_LEASE, renewed at half of it while requests wait, so a dead process's counts lapse.
PUBLISH_AFTER = 0.2
QUEUED_LEASE = 10.0
# A place taken at a later replica of a pool, until the request gets there (a few Redis calls of
# the pipeline's checks); one it never takes up returns this soon.
MOVE_LEASE = 5.0

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
    # Where it was admitted: the member's name and the slot's name once admitted through Redis,
    # ("", "") when admitted by this process alone.
    future: asyncio.Future[tuple[str, str]] = field(repr=False)


@dataclass(slots=True)
class Admitted:
    """A request's place at an endpoint (`name`), held until `leave`."""

    gate: _Gate
    name: str
    slot: str  # "" when admitted by this process alone (Redis unreachable)

    def leave(self) -> None:
        self.gate.leave(self.name, self.slot)

    async def take_up(self) -> bool:
        """A place taken at a later member of a pool, its request now there: held on for the
        slot's whole lease. False when it lapsed meanwhile."""
        try:
            return bool(
                await core_redis.aclient().eval(
                    TAKE_UP,
                    1,
                    self.gate.keys_of(self.name)[0],
                    self.slot,
                    self.gate.lease_of(self.name),
                )
            )
        except RedisError:
            return False


# What the script answers.
_REFUSED, _ADMITTED, _TENANT_FULL = 0, 1, 2


class _Gate:
    """One endpoint's admission, or one pool's (the members in the order to try), in this process
    (and event loop)."""

    def __init__(self, members: tuple[Member, ...]):
        self.members = members
        self.name, self.capacity, timeout = members[0]
        self.lease = timeout + LEASE_MARGIN
        self.keys = [key for name, _, _ in members for key in endpoint_keys(name)]
        self.spec = [
            value
            for _, capacity, timeout in members
            for value in (capacity, timeout + LEASE_MARGIN)
        ]
        # Process -> its waiting counts by class (`occupancy`); a pool's under its first member.
        self.queued_key = f"{endpoint_base(self.name)}:queued"
        self.process = secrets.token_hex(6)
        # Waiters by tenant and class, each in arrival order: the next to try is the head with
        # the best class, then the tenant with the fewest tokens now (not when it arrived).
        self.queues: dict[tuple[str, int], collections.deque[_Waiter]] = {}
        self.arrivals = itertools.count()
        self.wake = asyncio.Event()
        self.pump: asyncio.Task | None = None
        self.standing = ""  # this process's member in the waiting sets
        # Admission while Redis is unreachable, per endpoint (shared with its pools' gates).
        self.alone = _alone.get(
            lambda: asyncio.Semaphore(self.capacity), (self.name, self.capacity)
        )
        self.used: dict[str, tuple[float, float]] = {}  # this process's view: tokens, when
        self.tasks: set[asyncio.Task] = set()
        self.queued = dict.fromkeys(CLASSES, 0)  # waiting in this process now, by class
        self.recounted = asyncio.Event()
        self.publisher: asyncio.Task | None = None

    def _index(self, name: str) -> int:
        return next(i for i, member in enumerate(self.members) if member[0] == name)

    def keys_of(self, name: str) -> tuple[str, ...]:
        index = self._index(name)
        return tuple(self.keys[5 * index : 5 * index + 5])

    def lease_of(self, name: str) -> float:
        return self.members[self._index(name)][2] + LEASE_MARGIN

    async def _take(self, waiter: _Waiter, member: str) -> tuple[int, str]:
        """The script's answer and the member admitted at ("" if none)."""
        t = waiter.ticket
        took, index = await core_redis.aclient().eval(
            TAKE,
            len(self.keys),
            *self.keys,
            waiter.slot,
            t.tenant,
            settings.ADMISSION_RESERVE,
            waiter.rank,
            member,
            self.standing if member and self.standing != member else "",
            WAIT_LEASE,
            t.tokens,
            settings.ADMISSION_HALF_LIFE,
            settings.ROUTING_LOAD_FRESH_SECONDS,
            MOVE_LEASE,
            *self.spec,
        )
        took = int(took)
        if member:
            # Queued when refused for room; the member before it is taken out in either case.
            if took == _REFUSED:
                self.standing = member
            elif took == _ADMITTED or self.standing != member:
                self.standing = ""
        if took == _ADMITTED:
            self._count(t)
            return took, self.members[int(index) - 1][0]
        return took, ""

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
                took, at = await self._take(waiter, "")
                if took == _ADMITTED:
                    return Admitted(self, at, waiter.slot)
            except RedisError as exc:
                _outage(exc, self.name)
                return await self._enter_alone(t, started, priority)
        queue = self.queues.setdefault((t.tenant, waiter.rank), collections.deque())
        # In arrival order: requests that tried at once without queueing come back from Redis in
        # any order.
        index = len(queue)
        while index and queue[index - 1].arrival > waiter.arrival:
            index -= 1
        queue.insert(index, waiter)
        if self.pump is None:
            self.pump = loop.create_task(self._pump())
        self.wake.set()
        self._queue_count(priority, 1)
        deadline = deadline_of(priority)
        place = None
        try:
            async with asyncio.timeout(deadline):
                at, slot = await waiter.future
                if not slot:  # Redis went away meanwhile: this process alone decides
                    await self.alone.acquire()
                    at = self.name
            place = Admitted(self, at, slot)
            return place
        except BaseException as exc:
            # Admitted as the wait ended (a timeout or a cancellation racing the admission): the
            # place goes back at once rather than at its lease's end.
            future = waiter.future
            if place is None and future.done() and not future.cancelled() and future.result()[1]:
                self.leave(*future.result())
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
                        PUBLISH, 1, self.queued_key, self.process, QUEUED_LEASE, *counts
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
        return Admitted(self, self.name, "")

    def _busy(self, priority: str, deadline: float) -> EngineError:
        """No room within the class's deadline: counted, and the error the caller gets."""
        REFUSED.labels(self.name, priority).inc()
        where = "" if len(self.members) == 1 else f" at any of {len(self.members)} replicas"
        return EngineError(
            "busy",
            f"no room within {deadline:g}s{where}: {self.capacity} requests in flight",
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
                    took: int | None
                    try:
                        took, at = await self._take(
                            waiter, f"{waiter.ticket.tenant}|{self.process}"
                        )
                    except Exception as exc:  # the waiters must not be left without a pump
                        if isinstance(exc, RedisError):
                            _outage(exc, self.name)
                        else:
                            logger.exception("admission to %s failed; admitting alone", self.name)
                        took, at = None, ""
                    if took == _TENANT_FULL:
                        continue
                    queue = self.queues.get((waiter.ticket.tenant, waiter.rank))
                    if took != _REFUSED and queue and queue[0] is waiter:
                        queue.popleft()
                    if took is None:
                        if not waiter.future.done():
                            waiter.future.set_result(("", ""))
                    elif took == _ADMITTED:
                        if waiter.future.done():  # it left while its slot was being taken
                            self.leave(at, waiter.slot)
                        else:
                            waiter.future.set_result((at, waiter.slot))
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
            for index in range(len(self.members)):
                pipe.zrem(self.keys[5 * index + 1], member)
                pipe.zrem(self.keys[5 * index + 2], member)
            await pipe.execute()

    def leave(self, name: str, slot: str) -> None:
        if not slot:
            self.alone.release()
            return
        self._background(self._give_back(name, slot))

    async def _give_back(self, name: str, slot: str) -> None:
        try:
            await core_redis.aclient().zrem(self.keys_of(name)[0], slot)
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
_alone: PerLoop[asyncio.Semaphore] = PerLoop()


async def admit(name: str, capacity: int, total_timeout: float) -> Place:
    """Wait for room at endpoint `name` for the request of the running task's `ticket`: its place,
    to `leave` when the request ends; or EngineError("busy") past its class's deadline.

    A replica of a pool (`Ticket.pools`) waits for room at any replica from it on; a place found
    at a later one is kept in `Ticket.moved` and this one fails as busy at once, so the chain
    goes on to it. A replica between them, which had no room either, fails the same way."""
    t = ticket.get() or Ticket()
    members = t.pools.get(name) or ((name, capacity, total_timeout),)
    moved = t.moved
    if moved is not None:
        if moved.name == name:
            t.moved = None
            if await moved.take_up():
                return moved
        elif any(member[0] == moved.name for member in members):
            raise EngineError(
                "busy",
                f"no room; a place is held at {moved.name}",
                endpoint=name,
                retry_after=RETRY_AFTER,
            )
        else:  # the chain left the pool without taking it up
            t.moved = None
            moved.leave()
    gate = _gates.get(lambda: _Gate(members), members)
    place = await gate.enter(t)
    if place.name != name:
        t.moved = place
        raise EngineError(
            "busy",
            f"no room; room at {place.name}, next in the pool",
            endpoint=name,
            retry_after=RETRY_AFTER,
        )
    return place
