"""Reads of the request log over a period: traffic by road, latency by target, errors, features,
what the screening found.

Every figure is summed in PostgreSQL, one statement per panel, bounded by the period on `at`:
the request log is partitioned by day on it, so a period reads only its days' partitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection

from observability.selectors.periods import Period

ROADS = ("kb", "local", "external", "")  # "": the request failed before a road was chosen


@dataclass
class Slot:
    at: datetime
    by_road: dict[str, int] = field(default_factory=dict)
    checked: int = 0  # requests the KB looked at (a named model skips it)
    hits: int = 0
    failed: int = 0
    fell_back: int = 0  # requests answered (or failed) after passing over at least one endpoint

    @property
    def requests(self) -> int:
        return sum(self.by_road.values())

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / self.checked if self.checked else None


@dataclass
class Traffic:
    slots: list[Slot]
    hits_by_method: dict[str, int]

    @property
    def requests(self) -> int:
        return sum(s.requests for s in self.slots)

    def road_total(self, road: str) -> int:
        return sum(s.by_road.get(road, 0) for s in self.slots)

    @property
    def hit_ratio(self) -> float | None:
        checked = sum(s.checked for s in self.slots)
        return sum(s.hits for s in self.slots) / checked if checked else None

    @property
    def failed(self) -> int:
        return sum(s.failed for s in self.slots)

    @property
    def fell_back(self) -> int:
        return sum(s.fell_back for s in self.slots)


_TRAFFIC_SQL = """
SELECT date_bin(%(slot)s, at, %(start)s) AS slot, road, kb_method,
       count(*), count(*) FILTER (WHERE kb_hit), count(*) FILTER (WHERE status = 'failed'),
       count(*) FILTER (WHERE fallbacks > 0)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s
GROUP BY 1, 2, 3
"""


def traffic(period: Period) -> Traffic:
    """Requests per slot by road, with the KB's hits, the failures and the fallbacks."""
    slots = {at: Slot(at=at) for at in period.slots}
    by_method: dict[str, int] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            _TRAFFIC_SQL,
            {"slot": period.slot, "start": period.start, "end": period.end},  # type: ignore[dict-item]  # psycopg adapts a timedelta
        )
        for at, road, method, count, hits, failed, fell_back in cursor.fetchall():
            slot = slots[at]
            road = road if road in ROADS else ""
            slot.by_road[road] = slot.by_road.get(road, 0) + count
            if method:
                slot.checked += count
                slot.hits += hits
                if hits:
                    by_method[method] = by_method.get(method, 0) + hits
            slot.failed += failed
            slot.fell_back += fell_back
    return Traffic(slots=list(slots.values()), hits_by_method=by_method)


@dataclass(frozen=True)
class TargetLatency:
    road: str
    target: str  # the endpoint's name; "" for the KB's direct answers and for no road
    requests: int
    failed: int
    fallbacks: int  # endpoints passed over before this one, summed
    ttft_p50: float | None
    ttft_p95: float | None
    latency_p50: float | None  # of the complete answers
    latency_p95: float | None
    overhead_p50: float | None
    overhead_p95: float | None
    waited: int  # requests that waited for room at the endpoint's capacity
    wait_p95: float | None  # of those


# The KB's rows name their entry as target (KB#12): they count as one target here.
_TARGETS_SQL = """
SELECT road, CASE WHEN road = 'kb' THEN '' ELSE target END AS name, count(*),
       count(*) FILTER (WHERE status = 'failed'), coalesce(sum(fallbacks), 0),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY ttft_ms),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) FILTER (WHERE status = 'complete'),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) FILTER (WHERE status = 'complete'),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY overhead_ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY overhead_ms),
       count(wait_ms), percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_ms)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s
GROUP BY 1, 2
ORDER BY 3 DESC, 1, 2
"""


def latency_by_target(period: Period) -> list[TargetLatency]:
    """TTFT, latency and the gateway's own share, p50 and p95, per target, busiest first; and the
    requests that waited for room at the target's capacity, with their wait's p95."""
    with connection.cursor() as cursor:
        cursor.execute(_TARGETS_SQL, {"start": period.start, "end": period.end})
        return [TargetLatency(*row) for row in cursor.fetchall()]


@dataclass(frozen=True)
class ErrorCount:
    code: str
    requests: int
    last_at: datetime


_ERRORS_SQL = """
SELECT error_code, count(*), max(at)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s AND error_code <> ''
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT %(limit)s
"""


def errors(period: Period, *, limit: int = 10) -> list[ErrorCount]:
    """The most frequent error codes of the period."""
    with connection.cursor() as cursor:
        cursor.execute(_ERRORS_SQL, {"start": period.start, "end": period.end, "limit": limit})
        return [ErrorCount(*row) for row in cursor.fetchall()]


@dataclass(frozen=True)
class FeatureCount:
    feature: str  # observability.models.REQUEST_FEATURES
    requests: int


_FEATURES_SQL = """
SELECT feature, count(*)
FROM chat_requestlog, unnest(string_to_array(features, ' ')) AS feature
WHERE at >= %(start)s AND at < %(end)s AND features <> ''
GROUP BY 1
ORDER BY 2 DESC, 1
"""


def features(period: Period) -> list[FeatureCount]:
    """How many requests of the period asked for tools, a structured output, ... (a request may
    count under several)."""
    with connection.cursor() as cursor:
        cursor.execute(_FEATURES_SQL, {"start": period.start, "end": period.end})
        return [FeatureCount(*row) for row in cursor.fetchall()]


@dataclass
class Screened:
    """What the screening found in the period's requests, never the values: per personal data type
    and per suspected injection's kind, the requests by what came of them (RequestLog's actions;
    "" where the row names none)."""

    personal_data: dict[str, dict[str, int]] = field(default_factory=dict)  # type -> action -> n
    # Requests that held any personal data, by action: a request holding two types counts under
    # each type above, once here.
    personal_requests: dict[str, int] = field(default_factory=dict)
    injections: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> action -> n


# One statement for the panel: the types (a row per type a request held), the requests that held
# any, and the injections, each grouped by its action. Most rows hold neither, and skip the unnest.
_SCREENED_SQL = """
SELECT 'type', found, personal_data_action, count(*)
FROM chat_requestlog, unnest(string_to_array(personal_data, ' ')) AS found
WHERE at >= %(start)s AND at < %(end)s AND personal_data <> ''
GROUP BY 2, 3
UNION ALL
SELECT 'requests', '', personal_data_action, count(*)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s AND personal_data <> ''
GROUP BY 3
UNION ALL
SELECT 'injection', injection, injection_action, count(*)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s AND injection <> ''
GROUP BY 2, 3
"""


def screened(period: Period) -> Screened:
    """The period's personal data by type and its injections by kind, each by action."""
    result = Screened()
    with connection.cursor() as cursor:
        cursor.execute(_SCREENED_SQL, {"start": period.start, "end": period.end})
        for what, name, action, count in cursor.fetchall():
            if what == "requests":
                result.personal_requests[action] = count
            else:
                table = result.personal_data if what == "type" else result.injections
                table.setdefault(name, {})[action] = count
    return result
