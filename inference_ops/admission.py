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

The room is the capacity refined by what the engine itself reported at its last health check
(`engine_report`, called by the checks right after they scrape /metrics; the script reads it
in the same call, so it costs no round trip): the requests the engine runs or queues that this
gateway did not admit (running + waiting - the slots held here at that moment: another client
of the engine, another endpoint on it) count against the room; an engine that reported a queue
while running R requests runs at most R at once (its batch: `--max-num-seqs`, or what its KV
cache holds; forgotten when it is seen running more), and one whose KV-cache use reached
ADMISSION_KV_THRESHOLD takes no more than it runs. Never below 1, never above the capacity.
A report older than ROUTING_LOAD_FRESH_SECONDS counts for nothing: the room is the capacity.

A replica group is admitted as one pool (`Ticket.pools`, filled by routing.replicas.expand): a
request for the group takes the first replica with room in expand's order, and waits for room
at any of them, not in one replica's queue while another has room. The place is taken at once,
in the same script call; when it is at a replica after the one being tried, that one fails as
`busy` ("room at ...") and the pipeline's chain goes on to the replica whose place is held
(`Ticket.moved`, leased for MOVE_LEASE until that request takes it up).

Redis unreachable: admission fails open to this process alone, as the breaker and the ledger's
`open` mode do: each process admits at most `capacity` requests by itself (so N processes may
together send up to N times the capacity, as before admission existed; a pool at its first
replica). Logged once per 10 s of an outage and counted in gateway_admission_unchecked_total.

Here what the rest of the gateway reads of admission: a request's ticket and what its class
means, the engine's report, the occupancy and the metrics. The waiting itself (`admit`: one
process's queue and the places it gives) is in `admission_gate`; the Redis keys and the scripts
that decide, in `admission_scripts`.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from django.conf import settings
from prometheus_client import Counter, Gauge, Histogram
from redis.exceptions import RedisError

from core import redis as core_redis
from inference_ops.admission_scripts import OCCUPANCY, REPORT, endpoint_base, endpoint_keys

logger = logging.getLogger(__name__)

# Priority classes, best first.
CLASSES = ("interactive", "api", "batch")

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


# An endpoint as admission sees it: its name, capacity, and the total_timeout its slots outlast.
Member = tuple[str, int, float]


class Place(Protocol):
    """A request's place at an endpoint: an `admission_gate.Admitted`, which imports this module
    (hence a protocol)."""

    name: str

    def leave(self) -> None: ...

    async def take_up(self) -> bool: ...


@dataclass(slots=True)
class Ticket:
    """Who asks, for admission: set by the pipeline for the request's task (`ticket`)."""

    tenant: str = ""
    priority: str = "api"
    tokens: int = 0  # what the request may use: its prompt's estimate and its max_tokens
    waited: float = 0.0  # seconds spent waiting for room, every attempt of the request together
    # A replica's pool: its group's replicas with a capacity, from it on in the chain's order
    # (routing.replicas.expand).
    pools: dict[str, tuple[Member, ...]] = field(default_factory=dict)
    # A place taken at a later replica of a pool, for the request to take up there.
    moved: Place | None = None


ticket: ContextVar[Ticket | None] = ContextVar("admission_ticket", default=None)


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


def engine_report(*, name: str, capacity: int, metrics: dict[str, float]) -> None:
    """What a health check's /metrics scrape of endpoint `name` says about its room (see the module
    docstring): kept in Redis for the admission script. Blocking (the checks run in Celery); a
    Redis failure is logged and the room stays the capacity once the last report is old."""
    if "running" not in metrics or "waiting" not in metrics:
        return
    held, _, _, _, report = endpoint_keys(name)
    try:
        core_redis.client().eval(
            REPORT,
            2,
            held,
            report,
            metrics["running"],
            metrics["waiting"],
            metrics.get("kv_cache_usage", 0.0),
            capacity,
            settings.ADMISSION_KV_THRESHOLD,
        )
    except RedisError as exc:
        logger.warning("admission: the report of %s could not be kept (%s)", name, exc)


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
            base = endpoint_base(name)
            pipe.eval(OCCUPANCY, 2, f"{base}:held", f"{base}:queued")
        rows = await pipe.execute()
    return {
        name: Occupancy(
            held=int(row[0]), waiting=dict(zip(CLASSES, map(int, row[1:]), strict=True))
        )
        for name, row in zip(names, rows, strict=True)
    }
