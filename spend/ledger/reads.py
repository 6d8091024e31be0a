"""What the counters say: the caller's tightest limits after a reservation (its Standing, which
/v1 sends as OpenAI's x-ratelimit-* headers: chat.openai_api.ratelimit), a reset written as
OpenAI writes it, whether a budget that reroutes is spent (the pipeline's one read before it
picks a rule), and every counter of a set of limits (the usage endpoint and the dashboard)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from django.conf import settings
from redis.exceptions import RedisError

from core import redis as core_redis
from spend.ledger.counter import MONEY, REQUESTS, TOKENS, Counter, counters
from spend.policy import Spec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Window:
    """One limit as a client's headers say it."""

    limit: int
    remaining: int
    reset: float  # seconds


@dataclass(frozen=True, slots=True)
class Standing:
    """The tightest request and token limits after a reservation (OpenAI's x-ratelimit-*)."""

    requests: Window | None = None
    tokens: Window | None = None


def duration(seconds: float) -> str:
    """OpenAI's way of writing a reset: 1s, 6m0s, 2h3m4s (in /v1's x-ratelimit-reset-* headers
    and in the refusals' words alike)."""
    seconds = max(0, math.ceil(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def standing_of(found: list[Counter], counts: list[int]) -> Standing:
    """The tightest request and token limits of these counters at these counts."""
    tightest: dict[str, Window] = {}
    for counter, count in zip(found, counts, strict=True):
        if counter.limit is None or counter.dimension.endswith("per day"):
            continue
        if counter.unit not in (REQUESTS, TOKENS):
            continue
        window = Window(counter.limit, counter.limit - count, counter.reset)
        best = tightest.get(counter.unit)
        if best is None or window.remaining < best.remaining:
            tightest[counter.unit] = window
    return Standing(requests=tightest.get(REQUESTS), tokens=tightest.get(TOKENS))


async def aover_budget(specs: tuple[Spec, ...]) -> bool:
    """Whether any budget that reroutes is spent (one read). Redis unreachable: as
    LIMITS_ON_REDIS_OUTAGE says (closed: over, so the cheaper rules take the request)."""
    found = [c for c in counters(tuple(s for s in specs if s.reroute)) if c.unit == MONEY]
    if not found:
        return False
    try:
        values = await core_redis.aclient().mget([c.key for c in found])
    except (TimeoutError, RedisError, OSError):
        logger.warning("cannot read the budgets that reroute", exc_info=True)
        return settings.LIMITS_ON_REDIS_OUTAGE != "open"
    return any(
        int(value or 0) >= (c.spec.budget_micros or 0)
        for c, value in zip(found, values, strict=True)
    )


@dataclass(frozen=True)
class Reading:
    """One limit's counter as the usage endpoint and the dashboard show it."""

    spec: Spec
    dimension: str
    unit: str
    limit: int
    used: int
    reset: float

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


def readings(specs: tuple[Spec, ...]) -> list[Reading]:
    """Every counter of these limits now (blocking; for the usage endpoint and the dashboard)."""
    found = counters(specs)
    if not found:
        return []
    values = core_redis.client().mget([c.key for c in found])
    return [
        Reading(
            c.spec,
            c.dimension,
            c.unit,
            c.spec.budget_micros if c.unit == MONEY else c.limit,  # type: ignore[arg-type]
            int(value or 0),
            c.reset,
        )
        for c, value in zip(found, values, strict=True)
    ]
