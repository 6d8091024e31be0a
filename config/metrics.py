"""/metrics: the gateway's counts for Prometheus, and the state of its targets read at scrape time.

Counts (observability.metrics; the worker's engine checks in inference_ops.supervisor) are in
every process's files in settings.METRICS_DIR, and a scrape adds them up. What is state rather
than a count is read here, from where it is kept: each endpoint's status and the gauges its engine
reported at its last health check, each engine's status (one query), each breaker (Redis), each
capacity's slots held (Redis, inference_ops.admission). So it is right whichever process or host
wrote it, and a request pays nothing for it.

Access: with METRICS_TOKEN set, `Authorization: Bearer <METRICS_TOKEN>` or 401. Without a token,
a loopback client may scrape while DEBUG is on (make run); everyone else gets 403, which says
that scraping is not configured.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from dataclasses import dataclass, field

from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector
from redis.exceptions import RedisError

from core.errors import unavailable
from inference_ops import admission
from inference_ops.models import EngineProcess, ModelEndpoint
from observability.selectors.spending import budgets
from routing import breaker

logger = logging.getLogger(__name__)

BREAKER_STATES = ("closed", "open", "half_open", "resting")


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(settings.METRICS_DIR))
    registry.register(_StateCollector(_state_read()))
    # The format the scraper asks for (OpenMetrics or one of the text versions), as
    # prometheus_client's own server answers.
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encode(registry), content_type=content_type)


def files_clear() -> int:
    """Remove every process's counts, for a launcher that starts all of a host's processes
    together, before it starts them: the files of processes that are gone would otherwise be
    added up forever, a killed process's in-flight requests with them. Returns the files removed."""
    removed = 0
    for path in settings.METRICS_DIR.glob("*.db"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def _refusal(request: HttpRequest) -> HttpResponse | None:
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()
        ):
            return None
        response = HttpResponse(
            "A valid token is required: send Authorization: Bearer <METRICS_TOKEN>.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if settings.DEBUG and _loopback(request.META.get("REMOTE_ADDR", "")):
        return None
    return HttpResponse(
        "Scraping is not configured: set METRICS_TOKEN (without one, only a loopback client "
        "may scrape, and only with DEBUG on).\n",
        status=403,
        content_type="text/plain; charset=utf-8",
    )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


# --- state, read at scrape time ------------------------------------------------------------------


@dataclass
class _State:
    readable: bool = True
    endpoints: dict[str, dict] = field(default_factory=dict)  # active endpoints by name
    engines: dict[str, dict] = field(default_factory=dict)
    breakers: dict[str, breaker.BreakerState] = field(default_factory=dict)
    # endpoints with a capacity: the slots held now by every process, None when Redis is away
    held: dict[str, admission.Occupancy] | None = None
    # budgets by (subject kind, state): ok, warn (past the warning share), spent
    budgets: dict[tuple[str, str], int] | None = None


def _state_read() -> _State:
    state = _State()
    try:
        # One query: each endpoint with its engines (a row per engine, or one without).
        rows = ModelEndpoint.objects.values(
            "name",
            "kind",
            "active",
            "status",
            "checked_at",
            "requests_running",
            "requests_waiting",
            "kv_cache_usage",
            "capacity",
            "engines__name",
            "engines__status",
        )
        for row in rows:
            if row["active"]:
                state.endpoints.setdefault(row["name"], row)  # type: ignore[arg-type]  # a row of values() is a dict
            if row["engines__name"]:
                state.engines[row["engines__name"]] = {
                    "endpoint": row["name"],
                    "status": row["engines__status"],
                }
    except Exception as exc:
        if unavailable(exc) is None:
            raise
        # The counts are still worth a scrape while the database is away.
        logger.warning("metrics: endpoint and engine state unavailable: %s", exc)
        return _State(readable=False)
    if state.endpoints:
        # The breaker's own reading (its Redis trouble reads as closed, as routing then lets
        # requests through), every endpoint in one round trip.
        state.breakers = async_to_sync(breaker.states)(list(state.endpoints))
    try:
        state.held = async_to_sync(admission.occupancy)(
            [name for name, row in state.endpoints.items() if row["capacity"]]
        )
    except RedisError as exc:
        logger.warning("metrics: admission slots unavailable: %s", exc)
    try:
        state.budgets = {}
        for budget in budgets():
            key = (budget.kind, budget.state)
            state.budgets[key] = state.budgets.get(key, 0) + 1
    except Exception as exc:  # noqa: BLE001 - Redis away: the scrape goes on without them
        logger.warning("metrics: budgets unavailable: %s", exc)
        state.budgets = None
    return state


class _StateCollector:
    def __init__(self, state: _State):
        self._state = state

    def collect(self):
        state = self._state
        ok = GaugeMetricFamily(
            "gateway_state_read_ok",
            "1 when this scrape could read the endpoints' and engines' state from the database.",
        )
        ok.add_metric([], 1.0 if state.readable else 0.0)
        yield ok
        if not state.readable:
            return

        status = GaugeMetricFamily(
            "gateway_endpoint_status",
            "1 for the endpoint's status as its health checks last saw it, 0 for the others.",
            labels=["endpoint", "kind", "status"],
        )
        gauges = {
            "requests_running": GaugeMetricFamily(
                "gateway_endpoint_requests_running",
                "Requests the engine was running at its last check.",
                labels=["endpoint"],
            ),
            "requests_waiting": GaugeMetricFamily(
                "gateway_endpoint_requests_waiting",
                "Requests waiting in the engine's queue at its last check.",
                labels=["endpoint"],
            ),
            "kv_cache_usage": GaugeMetricFamily(
                "gateway_endpoint_kv_cache_usage_ratio",
                "The engine's KV-cache use (0 to 1) at its last check.",
                labels=["endpoint"],
            ),
        }
        checked = GaugeMetricFamily(
            "gateway_endpoint_checked_timestamp_seconds",
            "When the endpoint's gauges were last read from its engine (Unix time).",
            labels=["endpoint"],
        )
        for name, row in state.endpoints.items():
            for choice in ModelEndpoint.Status.values:
                status.add_metric(
                    [name, row["kind"], choice], 1.0 if row["status"] == choice else 0.0
                )
            for column, family in gauges.items():
                if row[column] is not None:
                    family.add_metric([name], row[column])
            if row["checked_at"] is not None:
                checked.add_metric([name], row["checked_at"].timestamp())
        yield status
        yield from gauges.values()
        yield checked

        engines = GaugeMetricFamily(
            "gateway_engine_status",
            "1 for the engine's status, 0 for the others.",
            labels=["engine", "endpoint", "status"],
        )
        for name, engine in state.engines.items():
            for choice in EngineProcess.Status.values:
                engines.add_metric(
                    [name, engine["endpoint"], choice], 1.0 if engine["status"] == choice else 0.0
                )
        yield engines

        states = GaugeMetricFamily(
            "gateway_breaker_state",
            "1 for the endpoint's circuit-breaker state, 0 for the others.",
            labels=["endpoint", "state"],
        )
        failures = GaugeMetricFamily(
            "gateway_breaker_failures",
            "Retryable failures in a row the breaker has counted.",
            labels=["endpoint"],
        )
        for name, reading in state.breakers.items():
            for choice in BREAKER_STATES:
                states.add_metric([name, choice], 1.0 if reading.state == choice else 0.0)
            failures.add_metric([name], float(reading.failures))
        yield states
        yield failures

        capacity = GaugeMetricFamily(
            "gateway_admission_capacity",
            "Requests the endpoint takes at once from all gateway processes (its capacity).",
            labels=["endpoint"],
        )
        held = GaugeMetricFamily(
            "gateway_admission_held",
            "Slots of the endpoint's capacity held now, by every gateway process (Redis).",
            labels=["endpoint"],
        )
        for name, row in state.endpoints.items():
            if row["capacity"]:
                capacity.add_metric([name], float(row["capacity"]))
                if state.held is not None and name in state.held:
                    held.add_metric([name], float(state.held[name].held))
        yield capacity
        yield held

        if state.budgets is not None:
            budget_states = GaugeMetricFamily(
                "gateway_budgets",
                "Budgets (spend limits) by subject kind and state: ok, warn (past their warning "
                "share: the soft budget) or spent (the hard budget).",
                labels=["kind", "state"],
            )
            for kind in ("key", "user", "group"):
                for choice in ("ok", "warn", "spent"):
                    budget_states.add_metric(
                        [kind, choice], float(state.budgets.get((kind, choice), 0))
                    )
            yield budget_states
