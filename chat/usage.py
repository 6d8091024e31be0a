"""What a caller may still spend: `GET /api/usage` for a key's owner (or a signed-in user).
Also its priority class at an endpoint's capacity (inference_ops.admission).

The limits that apply to the caller (its API key's, its own, its groups') with what each has
used in its current window, from Redis, where they are counted; and what the caller spent today
and this month, from the request log (every answer, also those under no limit)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import Sum

from chat.models import ApiKey
from inference_ops.admission import deadline_of
from observability.models import RequestLog
from routing.rules import snapshot
from spend.ledger import MONEY, readings
from spend.policy import policies
from spend.prices import MICROS


@dataclass(frozen=True)
class Usage:
    limits: list[dict]
    spend: dict
    priority: dict


def _priority(*, api_key_id: int | None, groups: frozenset[str]) -> dict:
    """The caller's priority class at a full endpoint, where it comes from, and how long its
    requests wait there at most (inference_ops.admission)."""
    own = (
        ApiKey.objects.filter(pk=api_key_id).values_list("priority", flat=True).first()
        if api_key_id
        else None
    )
    name, source = snapshot().class_of(own=own, groups=groups, api_key=bool(api_key_id))
    source = {
        "key": "this API key",
        "groups": "your groups",
        "default": "default for API keys" if api_key_id else "default",
    }[source]
    return {"class": name, "from": source, "deadline_seconds": deadline_of(name)}


def usage_read(*, user, api_key_id: int | None) -> Usage:
    groups = frozenset(user.groups.values_list("name", flat=True))
    specs = policies().applying(api_key_id=api_key_id, user_id=user.pk, groups=groups)
    limits = []
    for reading in readings(specs):
        money = reading.unit == MONEY
        scale = MICROS if money else 1
        limits.append(
            {
                "whose": reading.spec.label,
                "kind": reading.spec.kind,
                "limit": reading.dimension,
                "unit": settings.SPEND_CURRENCY if money else reading.unit,
                "allowed": reading.limit / scale if money else reading.limit,
                "used": reading.used / scale if money else reading.used,
                "remaining": reading.remaining / scale if money else reading.remaining,
                "resets_in_seconds": round(reading.reset),
                "over_budget": (
                    ("reroute" if reading.spec.reroute else "refuse") if money else None
                ),
            }
        )
    now = datetime.now(UTC)
    day = datetime(now.year, now.month, now.day, tzinfo=UTC)
    month = datetime(now.year, now.month, 1, tzinfo=UTC)
    mine = RequestLog.objects.filter(at__gte=month)
    mine = mine.filter(api_key_id=api_key_id) if api_key_id else mine.filter(user_id=user.pk)
    totals = mine.aggregate(month=Sum("cost"))
    today = mine.filter(at__gte=day).aggregate(day=Sum("cost"))
    return Usage(
        priority=_priority(api_key_id=api_key_id, groups=groups),
        limits=limits,
        spend={
            "currency": settings.SPEND_CURRENCY,
            "whose": "this API key" if api_key_id else "you",
            "today": round(today["day"] or 0.0, 6),
            "this_month": round(totals["month"] or 0.0, 6),
        },
    )
