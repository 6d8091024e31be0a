"""Liveness and readiness probes.

/healthz answers from the process alone, so a load balancer never restarts a
healthy web process because a dependency is down. /readyz checks what a request
needs (database with pgvector, Redis, a live Celery worker) and names each one,
and reports what the process warmed at start-up (config.warmup). A process that is
shutting down (config.drain) answers only `draining`, failing, from the signal on: it
takes no new chats, and the balancer should send them elsewhere.

A probe is anonymous, and an exception's text names hosts, ports, database users
and versions: anyone sees which checks fail, staff (a logged-in staff session) see
each check's detail, and every failure's detail goes to the log.

Anyone may call /readyz, so a call must not cost a query, a Redis round trip and a
Celery ping to every worker: a process checks at most once per READYZ_CACHE_SECONDS
and answers every probe in between with that verdict and its age; probes arriving
while a check runs wait for it instead of starting their own. The draining state is
the process's own and is answered at once.
"""

import functools
import logging
import time

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import Counter

from config import drain, warmup
from config.celery import app as celery_app
from core import db
from core.flight import SingleFlight

logger = logging.getLogger(__name__)

CHECKS_RUN = Counter(
    "gateway_readyz_checks_total",
    "Readiness checks run (database, Redis, a Celery ping); "
    "a verdict answers every probe for READYZ_CACHE_SECONDS.",
    ["result"],
)


@never_cache
@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


_PGVECTOR_SQL = "SELECT extversion FROM pg_extension WHERE extname = 'vector'"


def _check_database() -> str:
    # None when DATABASE_POOL_SIZE is 0.
    pool = connection.pool  # type: ignore[attr-defined]  # the postgresql backend's pool
    if pool is None:
        with connection.cursor() as cursor:  # bounded by DATABASE_CONNECT_TIMEOUT
            cursor.execute(_PGVECTOR_SQL)
            row = cursor.fetchone()
    else:
        # Not through Django's connection: its checkout waits DATABASE_POOL_TIMEOUT (10 s), a
        # request's patience. A probe gives up after READYZ_TIMEOUT like every check, or a refused
        # database kept /readyz 11 s from answering, past any balancer's probe timeout.
        pool.open()  # Django opens the pool at its first checkout; a no-op once open
        with pool.connection(timeout=settings.READYZ_TIMEOUT) as conn:
            row = conn.execute(_PGVECTOR_SQL).fetchone()
    if row is None:
        raise RuntimeError("the pgvector extension is not installed (run migrate)")
    return f"pgvector {row[0]}"


@functools.lru_cache(maxsize=2)
def _redis_client(url: str, timeout: float) -> redis.Redis:
    """One connection kept for the checks, not one per check.

    Named, so that CLIENT LIST shows it.
    """
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        max_connections=1,
        client_name=f"{settings.REDIS_KEY_PREFIX}:readyz",
    )


def _check_redis() -> str:
    _redis_client(settings.REDIS_URL, settings.READYZ_TIMEOUT).ping()
    return "PONG"


def _check_celery() -> str:
    with celery_app.connection_for_write(settings.CELERY_BROKER_URL) as conn:
        # ensure_connection fails fast instead of kombu's default retry-forever.
        conn.ensure_connection(max_retries=1, timeout=settings.READYZ_TIMEOUT)  # type: ignore[arg-type]  # kombu takes seconds as a float
        replies = celery_app.control.ping(connection=conn, timeout=settings.READYZ_TIMEOUT, limit=1)
    if not replies:
        raise RuntimeError("no Celery worker answered ping")
    return ", ".join(name for reply in replies for name in reply)


def _check_warm() -> str:
    # Never a failure. Under daphne the warm-up ends before the process listens, so a process
    # that can answer this has warmed; a step that failed is named here and loads on first use,
    # and the dependency behind it (database, Redis) has its own check above.
    report = warmup.report()
    if report is not None:
        return report.summary()
    return (
        "off (WEB_WARMUP)"
        if not settings.WEB_WARMUP
        else "not run in this process (it runs in config.asgi)"
    )


CHECKS = (
    ("database", _check_database),
    ("redis", _check_redis),
    ("celery", _check_celery),
    ("warm", _check_warm),
)


def _run_checks() -> dict[str, dict]:
    results: dict[str, dict] = {}
    for name, check in CHECKS:
        if name == "celery" and not results["redis"]["ok"]:
            # The broker is Redis: without it a ping can only time out.
            results[name] = {"ok": False, "error": "skipped: Redis is down"}
            continue
        started = time.perf_counter()
        try:
            results[name] = {"ok": True, "detail": check()}
        except Exception as exc:  # noqa: BLE001 - a probe reports every failure, it never raises
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            logger.warning("readiness check %s failed: %s", name, results[name]["error"])
        results[name]["ms"] = round((time.perf_counter() - started) * 1000, 1)
    CHECKS_RUN.labels("ok" if all(result["ok"] for result in results.values()) else "fail").inc()
    return results


_verdict: tuple[float, dict[str, dict]] | None = None  # (time.monotonic() of the check, results)
_checking = SingleFlight()


async def _check() -> tuple[float, dict[str, dict]]:
    global _verdict
    results = await db.run(_run_checks)
    _verdict = (time.monotonic(), results)
    return _verdict


async def _current_verdict() -> tuple[float, dict[str, dict]]:
    verdict = _verdict
    if verdict is not None and time.monotonic() - verdict[0] < settings.READYZ_CACHE_SECONDS:
        return verdict
    return await _checking.do("readyz", _check)


def verdict_forget() -> None:
    """The next probe checks again (for tests that change what the checks reach)."""
    global _verdict
    _verdict = None


@never_cache
@require_GET
async def readyz(request):
    if drain.draining:
        # The process's own state, not a dependency, named only while it holds. The balancer hears
        # it at once: the dependencies of a process that is going away no longer matter.
        checked_at, results = (
            time.monotonic(),
            {
                "draining": {
                    "ok": False,
                    "error": "shutting down: finishing its streams, taking no new chats",
                    "ms": 0.0,
                }
            },
        )
    else:
        checked_at, results = await _current_verdict()
    failing = [name for name, result in results.items() if not result["ok"]]
    if not await _is_staff(request):
        results = {name: {"ok": result["ok"]} for name, result in results.items()}
    body = {
        "status": "fail" if failing else "ok",
        "failing": failing,
        "checks": results,
        "age": round(time.monotonic() - checked_at, 1),
    }
    return JsonResponse(body, status=503 if failing else 200)


async def _is_staff(request) -> bool:
    # The session lives in the database: when that is what is down, nobody is staff.
    try:
        user = await request.auser()
        return bool(user.is_active and user.is_staff)
    except Exception:  # noqa: BLE001 - a probe never raises
        return False
