"""Reads of the engines and endpoints: each endpoint's admission now (Redis) with its waits of
the period (the request log), each engine's states through the period."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from asgiref.sync import async_to_sync
from django.db import connection
from django.db.models import OuterRef, Subquery
from redis.exceptions import RedisError

from inference_ops import admission
from inference_ops.models import EngineEvent, EngineProcess, ModelEndpoint
from observability.selectors.periods import Period


@dataclass
class AdmissionNow:
    """An endpoint with a capacity: its admission now (every process's, from Redis) and how long
    its requests waited in the period, by priority class (inference_ops.admission)."""

    endpoint_id: int
    endpoint: str
    capacity: int
    held: int | None  # slots taken now; None: Redis could not be read
    waiting: dict[str, int] | None  # requests waiting now, by class; None: Redis unread
    waited: dict[str, int] = field(default_factory=dict)  # requests of the period that waited
    wait_p95: dict[str, float] = field(default_factory=dict)  # ms, of those

    @property
    def waiting_total(self) -> int | None:
        return None if self.waiting is None else sum(self.waiting.values())


# Rows that waited, by the endpoint that answered (or failed) last and their class.
_WAITS_SQL = """
SELECT target, priority, count(*), percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_ms)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s AND wait_ms IS NOT NULL AND target = ANY(%(names)s)
GROUP BY 1, 2
"""


def admission_now(period: Period | None) -> list[AdmissionNow]:
    """Each active endpoint with a capacity: its capacity, the slots held and the requests waiting
    now by class (Redis, one round trip for all), and the period's waits by class (the request
    log: a request's wait is counted at the target it ended on); no period, no waits (the page's
    refresh of what is live)."""
    rows = [
        AdmissionNow(endpoint_id=pk, endpoint=name, capacity=capacity, held=None, waiting=None)  # type: ignore[arg-type]  # capacity__isnull=False
        for pk, name, capacity in ModelEndpoint.objects.filter(active=True, capacity__isnull=False)
        .order_by("name")
        .values_list("pk", "name", "capacity")
    ]
    if not rows:
        return rows
    names = [row.endpoint for row in rows]
    try:
        now = async_to_sync(admission.occupancy)(names)
    except RedisError:
        now = {}  # the page says Redis could not be read, and shows the rest
    by_name = {row.endpoint: row for row in rows}
    for name, reading in now.items():
        by_name[name].held, by_name[name].waiting = reading.held, reading.waiting
    if period is None:
        return rows
    with connection.cursor() as cursor:
        cursor.execute(_WAITS_SQL, {"start": period.start, "end": period.end, "names": names})
        for name, priority, waited, p95 in cursor.fetchall():
            by_name[name].waited[priority] = waited
            by_name[name].wait_p95[priority] = p95
    return rows


@dataclass(frozen=True)
class EngineState:
    at: datetime
    status: str
    reason: str


@dataclass
class EngineHistory:
    id: int
    name: str
    status: str  # now
    status_reason: str
    before: str | None  # the state when the period began; None: no event before it
    events: list[EngineState] = field(default_factory=list)  # in the period, oldest first
    # Prompt tokens the engine looked up in its prefix cache and found there, since it started
    # (vllm:prefix_cache_queries_total and _hits_total, as its last health check read them).
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None

    @property
    def prefix_cache_hit_ratio(self) -> float | None:
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


def engine_history(period: Period, *, limit: int = 500) -> tuple[list[EngineHistory], bool]:
    """Each engine's states through the period, and whether events were left out (only the
    newest `limit` are read: an engine that flaps all week must not make the page heavy)."""
    before = EngineEvent.objects.filter(engine=OuterRef("pk"), at__lt=period.start).order_by(
        "-at", "-pk"
    )
    engines = {
        row["id"]: EngineHistory(
            id=row["id"],
            name=row["name"],
            status=row["status"],
            status_reason=row["status_reason"],
            before=row["before"],
            prefix_cache_queries=(row["metrics"] or {}).get("prefix_cache_queries"),
            prefix_cache_hits=(row["metrics"] or {}).get("prefix_cache_hits"),
        )
        for row in EngineProcess.objects.order_by("name")
        .annotate(before=Subquery(before.values("status")[:1]))
        .values("id", "name", "status", "status_reason", "before", "metrics")
    }
    events = list(
        EngineEvent.objects.filter(at__gte=period.start, at__lt=period.end)
        .order_by("-at", "-pk")
        .values_list("engine_id", "at", "status", "reason")[: limit + 1]
    )
    cut = len(events) > limit
    for engine_id, at, status, reason in reversed(events[:limit]):
        if engine_id in engines:
            engines[engine_id].events.append(EngineState(at=at, status=status, reason=reason))
    return list(engines.values()), cut
