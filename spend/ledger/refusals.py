"""Why a request is refused, in the words its caller reads: a limit or a budget (which one, what
is counted, when to come back, or that waiting would not help), and Redis unreachable
(LIMITS_ON_REDIS_OUTAGE says whether a request with limits goes on uncounted or is refused)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings
from prometheus_client import Counter as MetricCounter

from spend.ledger.counter import MONEY, Counter
from spend.ledger.reads import Standing, duration, standing_of
from spend.prices import MICROS

logger = logging.getLogger(__name__)

UNCHECKED = MetricCounter(
    "gateway_spend_unchecked_total",
    "Requests with limits that Redis could not count, by what the gateway did "
    "(LIMITS_ON_REDIS_OUTAGE): let through (open) or refused (closed).",
    ["outcome"],
)


@dataclass(frozen=True)
class Refusal:
    code: str  # limit_exceeded | budget_exceeded | limits_unavailable
    message: str
    retry_after: int | None  # None: waiting does not help (the request alone is too large)
    standing: Standing | None = None


def refusal(counter: Counter, count: int, amount: int, found: list[Counter]) -> Refusal:
    retry = max(1, math.ceil(counter.reset))
    standing = standing_of(found, [count if c is counter else 0 for c in found])
    who, limit = counter.spec.label, counter.limit or 0  # a refusing counter has a limit
    if counter.unit == MONEY:
        return _budget_refusal(counter, count, amount, retry, standing)
    if amount > limit:
        return Refusal(
            "limit_exceeded",
            f"This request alone needs about {amount} {counter.unit}, more than the {who}'s "
            f"limit of {limit} {counter.dimension}: ask for fewer max_tokens or a "
            "shorter conversation.",
            None,
            standing,
        )
    return Refusal(
        "limit_exceeded",
        f"Over the {who}'s limit of {limit} {counter.dimension}: {count} counted, this "
        f"request needs {amount}. Try again in {duration(retry)}.",
        retry,
        standing,
    )


def _budget_refusal(
    counter: Counter, count: int, amount: int, retry: int, standing: Standing
) -> Refusal:
    """A budget refuses: spent, too small for this request alone, or with less left than this
    request may cost (its tokens at the dearest target's prices, and its engine time)."""
    spec, limit, currency = counter.spec, counter.limit or 0, settings.SPEND_CURRENCY
    period = spec.budget_period
    if count >= limit:
        return Refusal(
            "budget_exceeded",
            f"The {spec.label}'s budget per {period} is spent ({count / MICROS:.4f} of "
            f"{limit / MICROS:.4f} {currency}); it renews in {duration(retry)}.",
            retry,
            standing,
        )
    if amount > limit:
        return Refusal(
            "budget_exceeded",
            f"This request alone may cost up to {_money(amount)} {currency}, more than the "
            f"{spec.label}'s budget of {_money(limit)} {currency} per {period}: ask for fewer "
            "max_tokens or a shorter conversation.",
            None,
            standing,
        )
    return Refusal(
        "budget_exceeded",
        f"The {spec.label}'s budget per {period} has {_money(limit - count)} of {_money(limit)} "
        f"{currency} left, and this request may cost up to {_money(amount)}; it renews in "
        f"{duration(retry)}.",
        retry,
        standing,
    )


def _money(amount: int) -> str:
    """Micro-units as a sum: 0.00015, 12.5."""
    return f"{amount / MICROS:.6f}".rstrip("0").rstrip(".")


_outage_logged = 0.0


def outage_lets_through(exc: BaseException, what: str) -> bool:
    """Redis could not count `what` (a limit): whether the request goes on uncounted
    (LIMITS_ON_REDIS_OUTAGE=open). Logged (once per 10 s of an outage, not once per request) and
    counted either way."""
    global _outage_logged
    opened = settings.LIMITS_ON_REDIS_OUTAGE == "open"
    UNCHECKED.labels("open" if opened else "closed").inc()
    now = time.monotonic()
    if now - _outage_logged > 10:
        _outage_logged = now
        logger.error(
            "%s cannot be counted (%s: %s); LIMITS_ON_REDIS_OUTAGE=%s: requests are %s",
            what,
            type(exc).__name__,
            exc,
            settings.LIMITS_ON_REDIS_OUTAGE,
            "let through uncounted" if opened else "refused",
        )
    return opened
