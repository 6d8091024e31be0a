"""Replica groups: endpoints serving the same model, one of which answers each request.

A target whose endpoint names a `replica_group` stands for every active endpoint of that group.
`expand` turns it into the group's endpoints in the order to try: the least busy first, the rest
as its fallbacks (the pipeline's fallback, breaker and Retry-After rules apply to each).

How busy a replica is, in requests: this process's requests in flight to it (known at once), plus
what its engine reported at its last check (scraped by the health checks onto the endpoint row;
read here from the database at most every ROUTING_LOAD_SECONDS, behind the requests, never
awaited by one):

- each request waiting in its queue (`vllm:num_requests_waiting`) counts 1: a new request's
  first token comes after theirs;
- each request it runs (`vllm:num_requests_running`) counts ROUTING_RUNNING_WEIGHT: a batching
  engine decodes them side by side, each only slowing the step a little (this process's own
  streams are among them, so they count 1 + the weight, the same on every replica);
- its KV-cache use (`vllm:kv_cache_usage_perc`, 0 to 1) counts ROUTING_KV_WEIGHT at full: a
  full cache queues or preempts what comes next.

A replica that is full goes after every one that is not, however busy: a request sent there
waits for a slot, a whole answer's time on a slow replica. Full: its engine reported requests
waiting, or this process alone has as many streams on it as it was running when it last
reported a queue (its batch size, learned: `--max-num-seqs`, or what its KV cache holds) or as
the endpoint's `max_concurrency` (more would wait for a slot here). With several web processes
each counts only its own streams against the batch size, so there the reported queue (as old as
the last check) does most of the work, and the tail is longer
(docs/benchmarks.md#fig-replica-pick). Counting the
others' requests as the gauges reported them plus this process's streams since the check was
tried: no better in these runs (the gauges' age makes it overcount), so not kept.

Gauges older than ROUTING_LOAD_FRESH_SECONDS are not trusted; a replica whose fresh check says
unhealthy or down goes last. A conversation keeps its replica (the one its first question
hashes to, so the engine's prefix cache is reused) while that replica is not full and no more
than ROUTING_AFFINITY_SLACK requests busier than the least busy.

ROUTING_REPLICA_PICK=round_robin turns all this off for comparison (the benchmark's baseline).

The replicas with a capacity are admitted as one pool in the order picked here
(inference_ops.admission): a request waits for room at any of them, and takes the first with
room, rather than wait in the queue of the one it was sent to while another has room.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from core import db
from inference_ops import admission
from inference_ops.models import ModelEndpoint

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Load:
    waiting: float
    running: float
    kv_cache_usage: float  # 0 to 1
    fresh: bool  # checked within ROUTING_LOAD_FRESH_SECONDS
    healthy: bool  # not reported unhealthy or down by a fresh check


_loads: dict[int, Load] = {}  # endpoint id -> its last reported load
_loaded_at = -1e9  # monotonic time of the last read
_reading: asyncio.Task | None = None
_in_flight: dict[int, int] = {}  # endpoint id -> this process's requests streaming from it
# endpoint id -> requests it runs at once, as seen when it had a queue
_slots: dict[int, float] = {}
_turns = itertools.count()  # round-robin's turn


def slots_learned(endpoint_id: int) -> float | None:
    """The requests `endpoint_id` runs at once as learned from its gauges, or None if unknown."""
    return _slots.get(endpoint_id)


def forget() -> None:
    """This process's view of the replicas, emptied: no loads read, no streams counted, no batch
    size learned (a test starts from it; a process starts with it)."""
    global _loads, _loaded_at
    _loads, _loaded_at = {}, -1e9
    _in_flight.clear()
    _slots.clear()


def started(endpoint_id: int) -> None:
    _in_flight[endpoint_id] = _in_flight.get(endpoint_id, 0) + 1


def ended(endpoint_id: int) -> None:
    _in_flight[endpoint_id] = max(0, _in_flight.get(endpoint_id, 0) - 1)


def expand(targets, affinity: str):
    """The targets in the order to try, each grouped target replaced by its group's replicas.
    The replicas with a capacity are admitted as one pool, in this order (the running request's
    admission ticket says so: inference_ops.admission)."""
    if not any(t.replicas for t in targets):
        return targets
    _refresh_soon()
    ordered = []
    waiting = admission.ticket.get()
    for target in targets:
        if not target.replicas:
            ordered.append(target)
            continue
        replicas = _ordered(target, affinity)
        if waiting is not None:
            _pool(waiting, replicas)
        ordered.extend(replicas)
    return ordered


def _pool(waiting: admission.Ticket, replicas: list) -> None:
    """Each replica's pool: the group's replicas with a capacity, from it on."""
    members = [
        (r.config.name, r.config.capacity, r.config.total_timeout)
        for r in replicas
        if r.config.capacity
    ]
    if len(members) > 1:
        for index, member in enumerate(members):
            waiting.pools[member[0]] = tuple(members[index:])


def affinity_of(history: list[dict], question: str) -> str:
    """What keeps a conversation on one replica: its first user message."""
    first = next((m["content"] for m in history if m.get("role") == "user"), question)
    return first[:2000]


def _ordered(target, affinity: str) -> list:
    replicas = list(target.replicas)
    if settings.ROUTING_REPLICA_PICK == "round_robin":
        start = next(_turns) % len(replicas)
        return replicas[start:] + replicas[:start]
    busy = {r.endpoint_id: _busy(r.endpoint_id) for r in replicas}
    full = {r.endpoint_id: _full(r.endpoint_id, r.config.max_concurrency) for r in replicas}
    # Healthy (or unknown) first, then those with a free slot, then by load; the name breaks ties
    # the same way everywhere.
    ranked = sorted(
        replicas,
        key=lambda r: (
            not _healthy(r.endpoint_id),
            full[r.endpoint_id],
            busy[r.endpoint_id],
            r.endpoint,
        ),
    )
    home = max(replicas, key=lambda r: _rendezvous(affinity, r.endpoint))
    least = busy[ranked[0].endpoint_id]
    if (
        _healthy(home.endpoint_id)
        and full[home.endpoint_id] <= full[ranked[0].endpoint_id]
        and busy[home.endpoint_id] <= least + settings.ROUTING_AFFINITY_SLACK
    ):
        ranked.remove(home)
        ranked.insert(0, home)
    return ranked


def _busy(endpoint_id: int) -> float:
    busy = float(_in_flight.get(endpoint_id, 0))
    load = _loads.get(endpoint_id)
    if load is not None and load.fresh:
        busy += (
            load.waiting
            + load.running * settings.ROUTING_RUNNING_WEIGHT
            + load.kv_cache_usage * settings.ROUTING_KV_WEIGHT
        )
    return busy


def _full(endpoint_id: int, max_concurrency: int) -> bool:
    in_flight = _in_flight.get(endpoint_id, 0)
    if in_flight >= max_concurrency:  # more would wait for a slot here, in this process
        return True
    load = _loads.get(endpoint_id)
    if load is not None and load.fresh and load.waiting > 0:
        return True
    slots = _slots.get(endpoint_id)
    return slots is not None and in_flight >= slots


def _healthy(endpoint_id: int) -> bool:
    load = _loads.get(endpoint_id)
    return load is None or load.healthy


def _rendezvous(key: str, name: str) -> int:
    # Highest random weight: a replica added or removed moves only the conversations it takes or
    # had.
    return int.from_bytes(
        hashlib.blake2b(f"{name}\x00{key}".encode(), digest_size=8).digest(), "big"
    )


def _refresh_soon() -> None:
    """Start a read of the replicas' loads when the last one is old; the request goes on at once."""
    global _reading
    if time.monotonic() - _loaded_at < settings.ROUTING_LOAD_SECONDS or (
        _reading is not None and not _reading.done()
    ):
        return
    _reading = asyncio.get_running_loop().create_task(loads_refresh())


async def loads_refresh() -> None:
    """Read the replicas' loads now (one statement). Requests call it behind themselves."""
    global _loads, _loaded_at
    _loaded_at = time.monotonic()
    try:
        rows = await db.query_all(
            "SELECT id, requests_waiting, requests_running, kv_cache_usage, status, checked_at"  # noqa: S608 - _meta's names; values are parameters
            f" FROM {ModelEndpoint._meta.db_table} WHERE replica_group <> '' AND active",
            [],
        )
    except Exception:  # picking goes on with what it knew
        logger.warning(
            "cannot read the replicas' loads; picking by this process's own counts", exc_info=True
        )
        return
    now = timezone.now()
    horizon = settings.ROUTING_LOAD_FRESH_SECONDS
    loads = {}
    for endpoint_id, waiting, running, kv_cache_usage, status, checked_at in rows:
        fresh = checked_at is not None and (now - checked_at).total_seconds() <= horizon
        loads[endpoint_id] = Load(
            waiting=float(waiting or 0.0),
            running=float(running or 0.0),
            kv_cache_usage=min(1.0, max(0.0, float(kv_cache_usage or 0.0))),
            fresh=fresh,
            healthy=not (
                fresh and status in (ModelEndpoint.Status.UNHEALTHY, ModelEndpoint.Status.DOWN)
            ),
        )
        _slots_learn(endpoint_id, loads[endpoint_id])
    _loads = loads


def _slots_learn(endpoint_id: int, load: Load) -> None:
    """A replica with a queue runs all it can: that is its batch size. Seen running more without
    one, it can take more than was learned (restarted bigger): forget it until it queues again."""
    if not load.fresh:
        return
    if load.waiting > 0 and load.running > 0:
        _slots[endpoint_id] = load.running
    elif load.running > _slots.get(endpoint_id, float("inf")):
        del _slots[endpoint_id]
