"""Limits and budgets in the admin: one row per API key, user or group, with what it has used in
the current windows (read from Redis, one read per row)."""

from django.conf import settings
from django.contrib import admin

from spend.ledger import MONEY, readings
from spend.models import Limit
from spend.policy import spec_of
from spend.prices import MICROS


@admin.register(Limit)
class LimitAdmin(admin.ModelAdmin):
    list_display = [
        "subject",
        "requests_per_minute",
        "tokens_per_minute",
        "tokens_per_day",
        "budget_shown",
        "over_budget",
        "used_now",
    ]
    list_filter = ["budget_period", "over_budget"]
    search_fields = ["api_key__name", "user__username", "group__name"]
    autocomplete_fields = ["api_key", "user", "group"]
    fieldsets = [
        (
            "Whose (exactly one)",
            {
                "fields": ["api_key", "user", "group"],
                "description": "A request answers to its API key's limits, its user's and each "
                "of its user's groups' (a group's limit is the whole group's).",
            },
        ),
        (
            "Rate limits (empty: none)",
            {"fields": ["requests_per_minute", "tokens_per_minute", "tokens_per_day"]},
        ),
        ("Budget", {"fields": ["budget", "budget_period", "warn_at", "over_budget"]}),
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("api_key__user", "user", "group")

    @admin.display(description="whose")
    def subject(self, obj):
        return obj.subject_label

    @admin.display(description="budget")
    def budget_shown(self, obj):
        if obj.budget is None:
            return "—"
        return f"{obj.budget:.2f} {settings.SPEND_CURRENCY} per {obj.budget_period}"

    @admin.display(description="used now")
    def used_now(self, obj):
        try:
            found = readings((spec_of(obj),))
        except Exception:  # noqa: BLE001 - the page stays usable while Redis is away
            return "Redis unavailable"
        parts = []
        for reading in found:
            if reading.unit == MONEY:
                parts.append(
                    f"{reading.used / MICROS:.4f} of {reading.limit / MICROS:.2f} "
                    f"{settings.SPEND_CURRENCY}"
                )
            else:
                parts.append(f"{reading.used}/{reading.limit} {reading.dimension}")
        return "; ".join(parts) or "—"
