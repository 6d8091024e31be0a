"""The request log in the admin: read-only rows filtered by time first, exported as CSV
(observability.export); the operators' dashboard served beside it (observability.dashboard)."""

import json
from datetime import date, datetime, time, timedelta

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.core.paginator import Paginator
from django.db import OperationalError, connections, transaction
from django.db.models import QuerySet
from django.http import HttpResponseBadRequest
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from psycopg import errors as pg_errors

from inference_ops.models import ModelEndpoint
from observability.dashboard import PERIOD_NAMES, dashboard_page
from observability.export import QueryOnlyChangeList, export_response
from observability.models import REQUEST_FEATURES, RequestLog
from observability.selectors import periods
from privacy.detector import TYPES
from privacy.injection import KINDS as INJECTION_KINDS


class CountOrEstimatePaginator(Paginator):
    """The exact count when PostgreSQL gives it quickly, else the planner's estimate: the request
    log holds millions of rows, and the changelist counts before it shows a page."""

    timeout_ms = 300
    estimated = False

    @cached_property
    def count(self) -> int:
        # The admin pages a queryset.
        queryset: QuerySet = self.object_list  # type: ignore[assignment]
        try:
            with transaction.atomic(using=queryset.db):
                with connections[queryset.db].cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('statement_timeout', %s, true)", [str(self.timeout_ms)]
                    )
                count = queryset.count()
                # Rolled back, so a caller's own transaction keeps its statement_timeout.
                transaction.set_rollback(True, using=queryset.db)
                return count
        except OperationalError as exc:
            if not isinstance(exc.__cause__, pg_errors.QueryCanceled):
                raise
        self.estimated = True
        plan = json.loads(queryset.order_by().explain(format="json"))
        return int(plan[0]["Plan"]["Plan Rows"])


class TimeFilter(admin.ListFilter):
    """The last hour, day or week, or a range of days. The last day unless asked otherwise: a
    period keeps every list and export on the few daily partitions it names."""

    title = "time"
    template = "admin/observability/requestlog/time_filter.html"
    # The dashboard's periods, so its links to the log name the same ones.
    PERIODS = {
        **{name: (PERIOD_NAMES[name], span) for name, (span, _) in periods.PERIODS.items()},
        "all": ("any time", None),
    }
    DEFAULT = "day"

    def __init__(self, request, params, model, model_admin):
        super().__init__(request, params, model, model_admin)
        self.hidden: list[
            tuple[str, str]
        ] = []  # the list's other parameters, kept by the range form
        for name in self.expected_parameters():
            if name in params:
                self.used_parameters[name] = params.pop(name)[-1]
        self.since = self._day(request, "since")
        self.until = self._day(request, "until")
        period = self.used_parameters.get("period")
        if period is not None and period not in self.PERIODS:
            messages.warning(
                request, f"Unknown period “{period}”: showing the {self.PERIODS[self.DEFAULT][0]}."
            )
            period = None
        if self.since or self.until:
            period = None
        self.period = period or (None if self.since or self.until else self.DEFAULT)

    def _day(self, request, name) -> date | None:
        value = self.used_parameters.get(name)
        if not value:
            return None
        try:
            return date.fromisoformat(value)  # type: ignore[arg-type]  # a date parameter is a str
        except ValueError:
            messages.warning(
                request, f"“{value}” is not a date (YYYY-MM-DD): the {name} date is ignored."
            )
            return None

    def has_output(self):
        return True

    def expected_parameters(self):
        return ["period", "since", "until"]

    def choices(self, changelist):
        self.hidden = [
            (k, v) for k, v in changelist.params.items() if k not in self.expected_parameters()
        ]
        for key, (label, _) in self.PERIODS.items():
            yield {
                "selected": self.period == key,
                "display": label,
                "query_string": changelist.get_query_string(
                    {"period": key}, remove=["since", "until"]
                ),
            }

    def queryset(self, request, queryset):
        if self.period:
            span = self.PERIODS[self.period][1]
            return queryset if span is None else queryset.filter(at__gte=timezone.now() - span)
        zone = timezone.get_current_timezone()
        if self.since:
            queryset = queryset.filter(at__gte=datetime.combine(self.since, time.min, tzinfo=zone))
        if self.until:  # the whole of that day
            queryset = queryset.filter(
                at__lt=datetime.combine(self.until + timedelta(days=1), time.min, tzinfo=zone)
            )
        return queryset


class RoadFilter(admin.SimpleListFilter):
    title = "road"
    parameter_name = "road"

    def lookups(self, request, model_admin):
        return [
            ("kb", "knowledge base"),
            ("local", "local model"),
            ("external", "external model"),
            ("none", "none (failed before routing)"),
        ]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset if value is None else queryset.filter(road="" if value == "none" else value)


class _NamedInFilter(admin.SimpleListFilter):
    """Requests whose space-separated names in `field` include the one chosen, of `names`."""

    field: str
    names: dict[str, str]  # name -> its label

    def lookups(self, request, model_admin):
        return list(self.names.items())

    def queryset(self, request, queryset):
        value = self.value()
        if value not in self.names:
            return queryset
        return queryset.filter(**{f"{self.field}__regex": rf"(^| ){value}( |$)"})


class FeatureFilter(_NamedInFilter):
    """Requests that asked for tools, a structured output, ...: one of the names in `features`."""

    title = "asked for"
    parameter_name = "feature"
    field = "features"
    names = dict(REQUEST_FEATURES)


class PersonalDataFilter(_NamedInFilter):
    """Requests that held a personal data type: one of the names in `personal_data`."""

    title = "personal data"
    parameter_name = "personal_data"
    field = "personal_data"
    names = {kind: kind for kind in TYPES}


class InjectionFilter(admin.SimpleListFilter):
    """Suspected prompt injections by kind, from the fixed set: a DISTINCT would read the log."""

    title = "suspected injection"
    parameter_name = "injection"

    def lookups(self, request, model_admin):
        return [(kind, kind) for kind in INJECTION_KINDS]

    def queryset(self, request, queryset):
        return queryset if self.value() is None else queryset.filter(injection=self.value())


class TargetFilter(admin.SimpleListFilter):
    """The endpoints by name: a DISTINCT over the log would read all of it."""

    title = "target"
    parameter_name = "target"

    def lookups(self, request, model_admin):
        names = ModelEndpoint.objects.order_by("name").values_list("name", flat=True)
        return [(name, name) for name in names]

    def has_output(self):
        return True  # a target a link names (from the dashboard) may be an endpoint since deleted

    def queryset(self, request, queryset):
        return queryset if self.value() is None else queryset.filter(target=self.value())


def _related(obj, name):
    """The related row, or None when there is none or it is gone (the log keeps ids, not keys)."""
    try:
        return getattr(obj, name)
    except ObjectDoesNotExist:
        return None


@admin.register(RequestLog)
class RequestLogAdmin(admin.ModelAdmin):
    """One row per answered request, as its user saw it: for reading, filtering and exporting
    only."""

    list_display = [
        "at",
        "interface",
        "api",
        "user_shown",
        "key_shown",
        "road",
        "rule",
        "target",
        "status",
        "error_code",
        "ttft_ms",
        "latency_ms",
        "overhead_ms",
        "wait_ms",
        "priority",
        "prompt_tokens",
        "completion_tokens",
        "cost",
        "entry_shown",
        "kb_score",
        "fallbacks",
        "features",
        "personal_data",
        "personal_data_action",
        "injection",
        "injection_action",
    ]
    list_filter = [
        TimeFilter,
        RoadFilter,
        TargetFilter,
        FeatureFilter,
        "status",
        "interface",
        "api",
        "priority",
        "kb_hit",
        PersonalDataFilter,
        "personal_data_action",
        InjectionFilter,
        "injection_action",
    ]
    search_fields = ["rule", "target", "error_code", "user__username"]
    search_help_text = "Rule, target, error code or user name."
    list_select_related = ["user", "api_key", "kb_entry"]
    sortable_by = [
        "at",
        "ttft_ms",
        "latency_ms",
        "overhead_ms",
        "wait_ms",
        "priority",
        "prompt_tokens",
        "completion_tokens",
        "kb_score",
        "fallbacks",
    ]
    fields = [
        "at",
        "interface",
        "api",
        "user_shown",
        "key_shown",
        "session_id",
        "road",
        "rule",
        "target",
        "status",
        "error_code",
        "ttft_ms",
        "latency_ms",
        "overhead_ms",
        "wait_ms",
        "priority",
        "prompt_tokens",
        "completion_tokens",
        "kb_method",
        "kb_hit",
        "entry_shown",
        "kb_score",
        "fallbacks",
        "features",
        "personal_data",
        "personal_data_action",
        "injection",
        "injection_action",
        "request_key",
    ]
    readonly_fields = fields  # type: ignore[assignment]  # names only
    list_per_page = 100
    # No count of the whole table next to the filtered one, no counts per filter choice.
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = CountOrEstimatePaginator
    actions = None
    change_list_template = "admin/observability/requestlog/change_list.html"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # old days go whole, by retention (observability.requestlog.requestlog_prune)

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user", "api_key", "kb_entry")

    @admin.display(description="user")
    def user_shown(self, obj):
        if obj.user_id is None:
            return "—"
        user = _related(obj, "user")
        if user is None:
            return f"#{obj.user_id} (deleted)"
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:auth_user_change", args=[user.pk]),
            user.get_username(),
        )

    @admin.display(description="API key")
    def key_shown(self, obj):
        if obj.api_key_id is None:
            return "—"
        key = _related(obj, "api_key")
        return f"#{obj.api_key_id} (deleted)" if key is None else f"{key.name} ({key.prefix}…)"

    @admin.display(description="KB entry")
    def entry_shown(self, obj):
        if obj.kb_entry_id is None:
            return "—"
        if _related(obj, "kb_entry") is None:
            return f"KB#{obj.kb_entry_id} (deleted)"
        return format_html(
            '<a href="{}">KB#{}</a>',
            reverse("admin:knowledge_entry_change", args=[obj.kb_entry_id]),
            obj.kb_entry_id,
        )

    def get_urls(self):
        extra = [
            path(
                "export.csv",
                self.admin_site.admin_view(self.export_view),
                name="observability_requestlog_export",
            ),
            path(
                "dashboard/",
                self.admin_site.admin_view(self.dashboard_view),
                name="observability_dashboard",
            ),
        ]
        return extra + super().get_urls()

    def get_changelist(self, request, **kwargs):
        if (
            request.resolver_match
            and request.resolver_match.url_name == "observability_requestlog_export"
        ):
            return QueryOnlyChangeList
        return super().get_changelist(request, **kwargs)

    def export_view(self, request):
        """The changelist's rows as CSV: the same filters, search and order as the page it was
        linked from, every page of it."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters as exc:
            return HttpResponseBadRequest(
                f"Those filters do not apply to the request log: {exc}",
                content_type="text/plain; charset=utf-8",
            )
        return export_response(request, changelist.queryset)

    def dashboard_view(self, request):
        return dashboard_page(request, admin_site=self.admin_site)
