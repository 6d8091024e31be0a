"""The operators' dashboard: the last hour, day or week of traffic, latency, errors, engine
states and missed questions, drawn on the server (core.charts). The admin serves it
(observability.admin), so it has the admin's login, staff check and layout; reading it also takes
the request log's view permission, as its rows do."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.safestring import mark_safe

from core import charts
from inference_ops.admission import CLASSES
from inference_ops.models import EngineProcess
from knowledge.models import Hit, Miss
from observability.models import REQUEST_FEATURES, RequestLog
from observability.selectors import curation, endpoints, periods, request_log, spending

ROADS = {
    "kb": ("knowledge base", "#2a9d4b"),
    "local": ("local model", "#2f6db5"),
    "external": ("external model", "#d9730d"),
    "": ("no road", "#888888"),
}
FAILED, FELL_BACK, HIT_RATIO = "#c0392b", "#8a5cd1", "#2a9d4b"
TTFT, LATENCY = "#2f6db5", "#d9730d"
STATES = {
    EngineProcess.Status.READY: "#2a9d4b",
    EngineProcess.Status.STARTING: "#2f6db5",
    EngineProcess.Status.RESTARTING: "#8a5cd1",
    EngineProcess.Status.UNHEALTHY: "#d9a10d",
    EngineProcess.Status.CRASHED: "#c0392b",
    EngineProcess.Status.STOPPED: "#888888",
    EngineProcess.Status.PORT_TAKEN: "#7a4b1f",
}
NO_RECORD = "#d0d0d0"
PERIOD_NAMES = {"hour": "last hour", "day": "last day", "week": "last week"}
SLOT_LABEL = {"hour": "%H:%M", "day": "%H:%M", "week": "%a %H:%M"}
TICK_EVERY = {"hour": 3, "day": 6, "week": 4}  # slots between two marks under the engines' bands
RECENT_EVENTS = 20
LOOP_DAYS = 14  # the KB loop's panel: whatever period the page shows, the last two weeks by day
ANSWERABLE = "#8a5cd1"
SPEND_COLOURS = ("#d9730d", "#2f6db5", "#2a9d4b", "#8a5cd1", "#c0392b", "#d9a10d", "#888888")


def dashboard_page(request: HttpRequest, *, admin_site: AdminSite) -> HttpResponse:
    if not request.user.has_perm("observability.view_requestlog"):
        raise PermissionDenied
    name = request.GET.get("period", "day")
    if name not in periods.PERIODS:
        return HttpResponseBadRequest(
            f"period must be one of: {', '.join(periods.PERIODS)}.",
            content_type="text/plain; charset=utf-8",
        )
    now = timezone.now()
    period = periods.period_at(name, now=now)
    if request.GET.get("panel") == "admission":
        # What the page's script refreshes: the panel's live cells, without the period's waits.
        return TemplateResponse(
            request, "admin/observability/admission.html", _admission_context(period, live=True)
        )
    traffic = request_log.traffic(period)
    targets = request_log.latency_by_target(period)
    errors = request_log.errors(period)
    features = request_log.features(period)
    screened = request_log.screened(period)
    engines, events_cut = endpoints.engine_history(period)
    miss_admin = admin_site.get_model_admin(Miss) if admin_site.is_registered(Miss) else None
    can_see_misses = miss_admin is not None and miss_admin.has_view_permission(request)
    misses, misses_waiting = curation.top_misses(period) if can_see_misses else ([], 0)
    hit_admin = admin_site.get_model_admin(Hit) if admin_site.is_registered(Hit) else None
    can_see_loop = (
        can_see_misses and hit_admin is not None and hit_admin.has_view_permission(request)
    )
    loop = curation.kb_loop(days=LOOP_DAYS, now=now) if can_see_loop else None
    spend = spending.spend(period)
    can_see_budgets = request.user.has_perm("spend.view_limit")
    budgets, budgets_unread = [], False
    if can_see_budgets:
        try:
            budgets = spending.budgets()
        except Exception:  # noqa: BLE001 - Redis away: the page says so and shows the rest
            budgets_unread = True

    labels = [timezone.localtime(at).strftime(SLOT_LABEL[name]) for at in period.slots]
    context = {
        **admin_site.each_context(request),
        "title": "Dashboard",
        "period": period,
        "periods": [(key, label, key == name) for key, label in PERIOD_NAMES.items()],
        "traffic": traffic,
        "roads": [(road, label, traffic.road_total(road)) for road, (label, _) in ROADS.items()],
        "hits_by_method": sorted(traffic.hits_by_method.items()),
        "targets": [_target_row(t) for t in targets],
        "errors": errors,
        "features": [(f, REQUEST_FEATURES.get(f.feature, f.feature)) for f in features],
        "personal_data": _screened_table(
            screened.personal_data, RequestLog.PersonalDataAction, total=screened.personal_requests
        ),
        "injections": _screened_table(screened.injections, RequestLog.InjectionAction),
        "engines": engines,
        "events_cut": events_cut,
        "recent_events": _recent_events(engines),
        "misses": misses,
        "misses_waiting": misses_waiting,
        "can_see_misses": can_see_misses,
        "loop": loop,
        "spend": spend,
        "spenders": [
            (kind, rows)
            for kind, rows in (
                ("API key", spend.keys),
                ("user", spend.users),
                ("group", spend.groups),
                ("target", spend.targets),
            )
            if rows
        ],
        "currency": settings.SPEND_CURRENCY,
        "can_see_budgets": can_see_budgets,
        "budgets": budgets,
        "budgets_unread": budgets_unread,
        "spend_chart": mark_safe(  # noqa: S308 - core.charts escapes its text
            charts.bars_over_time(
                labels,
                [
                    charts.Series(target or "—", SPEND_COLOURS[i % len(SPEND_COLOURS)], costs)
                    for i, (target, costs) in enumerate(sorted(spend.by_slot.items()))
                ],
                label=f"Spend by target, {PERIOD_NAMES[name]} ({settings.SPEND_CURRENCY})",
                css="chart-spend",
                unit=settings.SPEND_CURRENCY,
            )
        ),
        "loop_chart": mark_safe(_loop_chart(loop)) if loop is not None else "",  # noqa: S308 - core.charts escapes its text
        "can_add_phrasings": can_see_misses
        and "add_as_phrasings" in miss_admin.get_actions(request),  # type: ignore[union-attr]  # the misses admin is registered
        # The misses admin's own action: the page's button posts the miss to it, as its list would.
        "can_make_entry": can_see_misses and "make_entry" in miss_admin.get_actions(request),  # type: ignore[union-attr]  # the misses admin is registered
        # Every chart escapes the text it writes.
        "road_chart": mark_safe(  # noqa: S308 - core.charts escapes its text
            charts.bars_over_time(
                labels,
                [
                    charts.Series(label, colour, [s.by_road.get(road, 0) for s in traffic.slots])
                    for road, (label, colour) in ROADS.items()
                ],
                label=f"Requests by road, {PERIOD_NAMES[name]}",
                css="chart-roads",
                unit="requests",
            )
        ),
        "hit_chart": mark_safe(  # noqa: S308 - core.charts escapes its text
            charts.lines_over_time(
                labels,
                [charts.Series("KB hit ratio", HIT_RATIO, [s.hit_ratio for s in traffic.slots])],
                label=f"Share of questions the knowledge base answered, {PERIOD_NAMES[name]}",
                css="chart-hits",
                percent=True,
            )
        ),
        "error_chart": mark_safe(  # noqa: S308 - core.charts escapes its text
            charts.lines_over_time(
                labels,
                [
                    charts.Series("failed", FAILED, [s.failed for s in traffic.slots]),
                    charts.Series("fell back", FELL_BACK, [s.fell_back for s in traffic.slots]),
                ],
                label=f"Failed requests and fallbacks, {PERIOD_NAMES[name]}",
                css="chart-errors",
                unit="requests",
            )
        ),
        "latency_chart": mark_safe(  # noqa: S308 - core.charts escapes its text
            charts.percentile_bars(
                [
                    (
                        _target_name(t),
                        [
                            ("TTFT", t.ttft_p50, t.ttft_p95),
                            ("latency", t.latency_p50, t.latency_p95),
                        ],
                    )
                    for t in targets
                    if t.ttft_p50 is not None or t.latency_p50 is not None
                ],
                measures=[("TTFT", TTFT), ("latency", LATENCY)],
                label=(
                    f"Time to first token and latency per target, p50 and p95, {PERIOD_NAMES[name]}"
                ),
                css="chart-latency",
            )
        ),
        "engine_chart": mark_safe(_engine_chart(engines, period, now=now, cut=events_cut)),  # noqa: S308 - core.charts escapes its text
        **_admission_context(period),
    }
    return TemplateResponse(request, "admin/observability/dashboard.html", context)


def _admission_context(period: periods.Period, *, live: bool = False) -> dict:
    rows = endpoints.admission_now(None if live else period)
    return {
        "period": period,
        "classes": CLASSES,
        "admission": [
            {
                "row": row,
                "classes": [
                    {
                        "name": name,
                        "waiting": "—" if row.waiting is None else row.waiting[name],
                        "waited": row.waited.get(name, 0),
                        "wait_p95": charts.number(row.wait_p95[name])
                        if row.wait_p95.get(name) is not None
                        else "—",
                    }
                    for name in CLASSES
                ],
            }
            for row in rows
        ],
        "admission_unread": any(row.held is None for row in rows),
        "admission_columns": 3 + 2 * len(CLASSES),
    }


def _screened_table(
    found: dict[str, dict[str, int]],
    actions: type[models.TextChoices],
    *,
    total: dict[str, int] | None = None,
) -> dict:
    """A type (or kind) per row, busiest first, and a column per action: the known ones always,
    in their order, and any other a row names ("": none noted) after them, so every request
    counts somewhere."""
    seen = {action for counts in found.values() for action in counts} | set(total or ())
    others = sorted(seen - set(actions.values))
    columns = [(a.value, a.label) for a in actions]
    columns += [(a, "no action noted" if a == "" else a) for a in others]
    rows = [
        {
            "name": name,
            "counts": [(action, counts.get(action, 0)) for action, _ in columns],
            "requests": sum(counts.values()),
        }
        for name, counts in sorted(found.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    ]
    return {
        "columns": columns,
        "rows": rows,
        "total": None
        if total is None
        else {
            "counts": [(action, total.get(action, 0)) for action, _ in columns],
            "requests": sum(total.values()),
        },
    }


def _loop_chart(loop: curation.KbLoop) -> str:
    return charts.lines_over_time(
        [day.day.strftime("%b %d") for day in loop.days],
        [
            charts.Series(
                "of answerable questions", ANSWERABLE, [d.answerable_hit_rate for d in loop.days]
            ),
            charts.Series("of all questions", HIT_RATIO, [d.hit_rate for d in loop.days]),
        ],
        label=f"Direct answers per day, the last {LOOP_DAYS} days",
        css="chart-loop",
        percent=True,
    )


def _target_name(t: request_log.TargetLatency) -> str:
    if t.road == "kb":
        return "knowledge base"
    return t.target or "no target"


def _target_row(t: request_log.TargetLatency) -> dict:
    ms = {
        name: "—" if getattr(t, name) is None else charts.number(getattr(t, name))
        for name in (
            "ttft_p50",
            "ttft_p95",
            "latency_p50",
            "latency_p95",
            "overhead_p50",
            "overhead_p95",
            "wait_p95",
        )
    }
    return {"name": _target_name(t), "road": t.road, "target": t.target, "row": t, "ms": ms}


def _recent_events(engines: list[endpoints.EngineHistory]) -> list[dict]:
    events: list[dict[str, Any]] = [
        {"engine": e.name, "at": ev.at, "status": ev.status, "reason": ev.reason}
        for e in engines
        for ev in e.events
    ]
    events.sort(key=lambda ev: ev["at"], reverse=True)
    return events[:RECENT_EVENTS]


def _engine_chart(
    engines: list[endpoints.EngineHistory], period: periods.Period, *, now: datetime, cut: bool
) -> str:
    span = (period.end - period.start).total_seconds()
    stop = min(now, period.end)

    def at(moment: datetime) -> float:
        return (moment - period.start).total_seconds() / span

    def clock(moment: datetime) -> str:
        return timezone.localtime(moment).strftime("%a %H:%M" if period.name == "week" else "%H:%M")

    rows = []
    for engine in engines:
        if cut:
            state = None  # the state before the oldest event read is not known
        elif engine.before is None and not engine.events:
            state = engine.status  # nothing happened to it since before the period
        else:
            state = engine.before
        since, segments = period.start, []
        for event in [*engine.events, None]:
            until = stop if event is None else event.at
            if until > since:
                colour = STATES.get(state, NO_RECORD) if state else NO_RECORD  # type: ignore[call-overload]  # state: a status name
                segments.append(
                    (
                        at(since),
                        at(until),
                        colour,
                        f"{engine.name}: {state or 'no record'} "
                        f"from {clock(since)} to {clock(until)}",
                    )
                )
            if event is not None:
                state, since = event.status, max(since, event.at)
        rows.append((engine.name, segments))
    every = TICK_EVERY[period.name]
    ticks = [
        (at(slot), timezone.localtime(slot).strftime("%a" if period.name == "week" else "%H:%M"))
        for index, slot in enumerate(period.slots)
        if index % every == 0
    ]
    return charts.timeline(
        rows,
        ticks=ticks,
        keys=[(str(state), colour) for state, colour in STATES.items()],
        label="Engine states over the period",
        css="chart-engines",
    )
