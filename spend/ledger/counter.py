"""A limit's counters in Redis: one per limit and fixed window (requests and tokens per UTC
minute, tokens per UTC day, money in micro-units per UTC day or month), their keys, limits and
expiries, made once a minute; the Lua scripts that move them, run by their hash; and the budget
warnings a move that crosses a line logs and counts."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from prometheus_client import Counter as MetricCounter
from redis.exceptions import NoScriptError

from core import redis as core_redis
from spend.policy import Spec
from spend.prices import MICROS

logger = logging.getLogger(__name__)

REQUESTS, TOKENS, MONEY = "requests", "tokens", "money"

WARNINGS = MetricCounter(
    "gateway_spend_warnings_total",
    "Budgets that crossed their warning share (the soft budget) or their whole (the hard "
    "budget), by subject kind.",
    ["kind", "level"],
)

_SHAS: dict[str, str] = {}  # a script's text -> its hash


def redis_script(script: str) -> str:
    """A Lua script, its hash computed once (at import) so that it runs by its hash."""
    _SHAS[script] = hashlib.sha1(script.encode()).hexdigest()  # noqa: S324 - Redis names a script by its SHA-1
    return script


async def run_script(script: str, keys: list, args: list):
    """Run a script by its hash (Redis keeps it compiled), loading it first if Redis lost it."""
    client = core_redis.aclient()
    try:
        return await client.evalsha(_SHAS[script], len(keys), *keys, *args)
    except NoScriptError:
        return await client.eval(script, len(keys), *keys, *args)


def numbers(reply: bytes) -> list[int]:
    """A script's reply, comma-separated integers, as a list."""
    return [int(n) for n in reply.split(b",")]


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


def packed(specs: tuple[Spec, ...], found: list[Counter]) -> tuple[list[bytes], bytes]:
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


def crossed(counter: Counter, before: int, after: int) -> None:
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
