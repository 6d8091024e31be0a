"""Reads for the operators' dashboard: the request log summed over a period, engine states, misses.

Every figure is summed in PostgreSQL, one statement per panel, bounded by the period on `at`:
the request log is partitioned by day on it, so a period reads only its days' partitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from asgiref.sync import async_to_sync
from django.db import connection
from django.db.models import OuterRef, Subquery
from redis.exceptions import RedisError

from inference_ops import admission
from inference_ops.models import EngineEvent, EngineProcess, ModelEndpoint
from knowledge.hits import review_queue
from spend.ledger import MONEY, readings
from spend.models import Limit
from spend.policy import spec_of
from spend.prices import MICROS

# name: (span, slot). Slots start on whole multiples of their length since the epoch (UTC), so a
# page reloaded within a slot shows the same slots.
PERIODS: dict[str, tuple[timedelta, timedelta]] = {
    "hour": (timedelta(hours=1), timedelta(minutes=5)),
    "day": (timedelta(days=1), timedelta(hours=1)),
    "week": (timedelta(days=7), timedelta(hours=6)),
}
ROADS = ("kb", "local", "external", "")  # "": the request failed before a road was chosen


@dataclass(frozen=True)
class Period:
    name: str
    start: datetime
    end: datetime  # exclusive; the slot now in progress is the last one
    slot: timedelta

    @property
    def slots(self) -> list[datetime]:
        count = round((self.end - self.start) / self.slot)
        return [self.start + i * self.slot for i in range(count)]


def period_at(name: str, *, now: datetime) -> Period:
    """The period `name` (a key of PERIODS) that ends with the slot holding `now`."""
    span, slot = PERIODS[name]
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    end = epoch + ((now - epoch) // slot + 1) * slot
    return Period(name=name, start=end - span, end=end, slot=slot)


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
            _TRAFFIC_SQL, {"slot": period.slot, "start": period.start, "end": period.end}
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
        AdmissionNow(endpoint_id=pk, endpoint=name, capacity=capacity, held=None, waiting=None)
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


@dataclass(frozen=True)
class MissedQuestion:
    id: int  # the head of its group of misses
    question: str
    has_answer: bool  # a generated answer to turn into an entry
    asked: int  # misses in the group, ever
    asked_in_period: int
    best_entry_id: int | None
    best_score: float | None


# The heads by count come from the index miss_group_heads; each head's misses of the period from
# the primary key and the group's index, a handful of rows per head.
_MISSES_SQL = """
SELECT w.waiting, h.id, h.question, h.answer <> '', h.count,
       (SELECT count(*) FROM knowledge_miss m
        WHERE (m.id = h.id OR m.group_id = h.id)
          AND m.created_at >= %(start)s AND m.created_at < %(end)s),
       h.best_entry_id, h.best_score
FROM (SELECT count(*) AS waiting FROM knowledge_miss WHERE grouped_at IS NULL) w
LEFT JOIN LATERAL (
    SELECT id, question, answer, count, best_entry_id, best_score FROM knowledge_miss
    WHERE group_id IS NULL AND grouped_at IS NOT NULL AND resolved_by_id IS NULL
    ORDER BY count DESC, id
    LIMIT %(limit)s
) h ON true
ORDER BY h.count DESC, h.id
"""


def top_misses(period: Period, *, limit: int = 10) -> tuple[list[MissedQuestion], int]:
    """The most-asked questions the KB has no entry for yet (unresolved groups of misses, as the
    misses admin lists them), with how often each was asked in the period; and how many misses
    wait to be grouped (the misses admin groups them when it opens)."""
    with connection.cursor() as cursor:
        cursor.execute(_MISSES_SQL, {"start": period.start, "end": period.end, "limit": limit})
        rows = cursor.fetchall()
    waiting = rows[0][0] if rows else 0
    misses = [
        MissedQuestion(
            id=row[1],
            question=row[2],
            has_answer=row[3],
            asked=row[4],
            asked_in_period=row[5],
            best_entry_id=row[6],
            best_score=row[7],
        )
        for row in rows
        if row[1] is not None
    ]
    return misses, waiting


# --- the KB's curation loop ---------------------------------------------------------------------


@dataclass
class LoopDay:
    day: date
    hits: int = 0  # direct answers kept (knowledge.Hit)
    misses: int = 0
    resolved: int = 0  # misses of the day a curator has since attached to an entry
    up: int = 0  # thumbs, on answers of every road
    down: int = 0
    direct_up: int = 0  # ...on direct answers
    direct_down: int = 0

    @property
    def hit_rate(self) -> float | None:
        """Direct answers among the questions the KB judged."""
        asked = self.hits + self.misses
        return self.hits / asked if asked else None

    @property
    def answerable_hit_rate(self) -> float | None:
        """Direct answers among the answerable questions: those answered directly, and the misses
        a curator has since attached to an entry (so the KB could have answered them)."""
        answerable = self.hits + self.resolved
        return self.hits / answerable if answerable else None


@dataclass
class KbLoop:
    days: list[LoopDay]
    review_open: int  # questions marked wrong that no curator has judged (the review queue)
    one_phrasing_groups: int  # open miss groups with a closest entry to attach them to
    one_phrasing_questions: int  # the questions those groups hold


_LOOP_SQL = """
SELECT 'hit', (created_at AT TIME ZONE 'UTC')::date, count(*), 0
FROM knowledge_hit WHERE created_at >= %(start)s GROUP BY 2
UNION ALL
SELECT 'miss', (created_at AT TIME ZONE 'UTC')::date, count(*),
       count(*) FILTER (WHERE resolved_by_id IS NOT NULL)
FROM knowledge_miss WHERE created_at >= %(start)s GROUP BY 2
UNION ALL
SELECT f.verdict, (f.updated_at AT TIME ZONE 'UTC')::date, count(*),
       count(*) FILTER (WHERE h.id IS NOT NULL)
FROM knowledge_feedback f LEFT JOIN knowledge_hit h ON h.key = f.request_key
WHERE f.updated_at >= %(start)s GROUP BY 1, 2
"""

_LOOP_OPEN_SQL = """
SELECT count(*), coalesce(sum(count), 0)
FROM knowledge_miss
WHERE group_id IS NULL AND grouped_at IS NOT NULL AND resolved_by_id IS NULL
  AND dismissed_at IS NULL AND best_entry_id IS NOT NULL
"""


def kb_loop(*, days: int, now: datetime) -> KbLoop:
    """The KB's loop over the last `days` days (UTC), one row per day: what it answered directly
    and what it missed, the hit rate of answerable traffic, and people's verdicts; with what waits
    for a curator now."""
    first = (now.astimezone(UTC) - timedelta(days=days - 1)).date()
    rows = {first + timedelta(days=i): LoopDay(day=first + timedelta(days=i)) for i in range(days)}
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute(_LOOP_SQL, {"start": start})
        for kind, day, count, extra in cursor.fetchall():
            row = rows.get(day)
            if row is None:
                continue
            if kind == "hit":
                row.hits = count
            elif kind == "miss":
                row.misses, row.resolved = count, extra
            elif kind == "up":
                row.up, row.direct_up = count, extra
            else:
                row.down, row.direct_down = count, extra
        cursor.execute(_LOOP_OPEN_SQL)
        groups, questions = cursor.fetchone()
    # The review queue's own rows: one a question, each person's thumbs down once.
    review_open = review_queue().count()
    return KbLoop(
        days=list(rows.values()),
        review_open=review_open,
        one_phrasing_groups=groups,
        one_phrasing_questions=questions,
    )


# --- spend ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spender:
    name: str  # a key ("laptop (alice)"), a user, a group or a target
    cost: float
    requests: int
    tokens_in: int
    tokens_out: int


@dataclass
class Spend:
    by_slot: dict[str, list[float]]  # target -> cost per slot of the period
    total: float
    keys: list[Spender]
    users: list[Spender]
    groups: list[Spender]
    targets: list[Spender]


_SPEND_SLOTS_SQL = """
SELECT date_bin(%(slot)s, at, %(start)s), target, sum(cost)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s AND cost > 0
GROUP BY 1, 2
"""

# Every spender at once: by key, by user, by target (grouping sets), and by group through the
# users' current groups.
_SPENDERS_SQL = """
SELECT CASE WHEN GROUPING(api_key_id) = 0 THEN 'key'
            WHEN GROUPING(user_id) = 0 THEN 'user' ELSE 'target' END,
       coalesce(api_key_id::text, user_id::text, target), sum(cost), count(*),
       coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s AND cost > 0
GROUP BY GROUPING SETS ((api_key_id), (user_id), (target))
UNION ALL
SELECT 'group', g.name, sum(r.cost), count(*),
       coalesce(sum(r.prompt_tokens), 0), coalesce(sum(r.completion_tokens), 0)
FROM chat_requestlog r
JOIN auth_user_groups ug ON ug.user_id = r.user_id
JOIN auth_group g ON g.id = ug.group_id
WHERE r.at >= %(start)s AND r.at < %(end)s AND r.cost > 0
GROUP BY g.name
"""

_SPENDER_NAMES_SQL = """
SELECT 'key', k.id::text, k.name || ' (' || u.username || ')'
FROM chat_apikey k JOIN auth_user u ON u.id = k.user_id WHERE k.id = ANY(%(keys)s)
UNION ALL
SELECT 'user', u.id::text, u.username FROM auth_user u WHERE u.id = ANY(%(users)s)
"""


def spend(period: Period, *, top: int = 10) -> Spend:
    """Money spent in the period (the request log's cost, by the endpoints' prices): per target
    over time, in total, and the top spenders by API key, user, group and target."""
    by_slot: dict[str, list[float]] = {}
    index = {at: i for i, at in enumerate(period.slots)}
    found: dict[str, list[tuple]] = {"key": [], "user": [], "group": [], "target": []}
    params = {"slot": period.slot, "start": period.start, "end": period.end}
    with connection.cursor() as cursor:
        cursor.execute(_SPEND_SLOTS_SQL, params)
        for at, target, cost in cursor.fetchall():
            by_slot.setdefault(target or "", [0.0] * len(index))[index[at]] += cost
        cursor.execute(_SPENDERS_SQL, params)
        for kind, ident, cost, requests, tokens_in, tokens_out in cursor.fetchall():
            if ident is not None:
                found[kind].append((ident, cost, requests, tokens_in, tokens_out))
        total = sum(row[1] for row in found["target"])
        for kind in found:
            found[kind] = sorted(found[kind], key=lambda row: -row[1])[:top]
        cursor.execute(
            _SPENDER_NAMES_SQL,
            {
                "keys": [int(row[0]) for row in found["key"]],
                "users": [int(row[0]) for row in found["user"]],
            },
        )
        names = {(kind, ident): name for kind, ident, name in cursor.fetchall()}

    def spenders(kind: str) -> list[Spender]:
        return [
            Spender(
                names.get((kind, ident), f"#{ident} (deleted)")
                if kind in ("key", "user")
                else ident,
                cost,
                requests,
                tokens_in,
                tokens_out,
            )
            for ident, cost, requests, tokens_in, tokens_out in found[kind]
        ]

    return Spend(
        by_slot=by_slot,
        total=total,
        keys=spenders("key"),
        users=spenders("user"),
        groups=spenders("group"),
        targets=spenders("target"),
    )


@dataclass(frozen=True)
class BudgetState:
    whose: str
    kind: str  # key | user | group
    spent: float
    budget: float
    period: str
    warn_at: float
    over_budget: str  # what a request meets once it is spent: refuse | reroute
    limit_id: int

    @property
    def share(self) -> float:
        return self.spent / self.budget if self.budget else 1.0

    @property
    def state(self) -> str:
        """ok, warn (past the warning share: the soft budget) or spent (the hard budget)."""
        if self.share >= 1:
            return "spent"
        return "warn" if self.share >= self.warn_at else "ok"


def budgets() -> list[BudgetState]:
    """Every budget with what is spent of it in its current period (Redis, where it is counted),
    fullest first."""
    rows = list(
        Limit.objects.filter(budget__isnull=False).select_related("api_key__user", "user", "group")
    )
    specs = [spec_of(row) for row in rows]
    spent = {r.spec.subject: r.used for r in readings(tuple(specs)) if r.unit == MONEY}
    states = [
        BudgetState(
            whose=row.subject_label,
            kind=spec.kind,
            spent=spent.get(spec.subject, 0) / MICROS,
            budget=float(row.budget),
            period=row.budget_period,
            warn_at=row.warn_at,
            over_budget=row.over_budget,
            limit_id=row.pk,
        )
        for row, spec in zip(rows, specs, strict=True)
    ]
    return sorted(states, key=lambda b: -b.share)
