"""Operations in the admin: endpoints, engines (status, health, metrics, log tail,
start/stop/restart), adapters."""

import functools

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.utils.html import format_html

from core.admin import SuperuserEdits
from inference_ops import engine_command, engine_processes, lora, tasks
from inference_ops.exceptions import SupervisorError
from inference_ops.models import EngineEvent, EngineProcess, LoraAdapter, ModelEndpoint
from privacy.forms import types_field


class Operations:
    """Start, stop, load: operating the rows, not editing them; staff with the change permission
    may."""

    def has_operate_permission(self, request):
        opts = self.opts  # type: ignore[attr-defined]  # mixed into a ModelAdmin
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")


class ModelEndpointForm(forms.ModelForm):
    # A box per API rather than a comma-separated list to type.
    apis = forms.TypedMultipleChoiceField(
        choices=ModelEndpoint.Api.choices,
        widget=forms.CheckboxSelectMultiple,
        label="APIs",
        help_text=ModelEndpoint._meta.get_field("apis").help_text,
    )
    personal_data = types_field("May receive", ModelEndpoint, "personal_data")

    class Meta:
        model = ModelEndpoint
        fields = "__all__"  # noqa: DJ007 - the admin's fieldsets choose the fields


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(SuperuserEdits, admin.ModelAdmin):
    form = ModelEndpointForm
    list_display = [
        "name",
        "kind",
        "apis_shown",
        "model",
        "lora_adapter",
        "replica_group",
        "active",
        "status",
        "requests_running",
        "requests_waiting",
        "kv_cache_usage",
        "checked_at",
    ]
    list_filter = ["kind", "active", "status", "replica_group"]
    search_fields = ["name", "model", "base_url"]
    readonly_fields = [
        "status",
        "status_reason",
        "checked_at",
        "requests_running",
        "requests_waiting",
        "kv_cache_usage",
        "updated_at",
    ]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "name",
                    "kind",
                    "apis",
                    "active",
                    "base_url",
                    "api_key_env",
                    "model",
                    "lora_adapter",
                    "replica_group",
                    "context_window",
                    "max_concurrency",
                ]
            },
        ),
        (
            "Timeouts (seconds)",
            {"fields": ["connect_timeout", "first_token_timeout", "idle_timeout", "total_timeout"]},
        ),
        (
            "Retries and continuation",
            {"fields": ["retries", "retry_base", "retry_cap", "accepts_prefill"]},
        ),
        ("Personal data (external endpoints)", {"fields": ["personal_data"]}),
        (
            "Prices (the request log's cost and the budgets; empty: free)",
            {"fields": ["price_input", "price_output", "price_engine_second"]},
        ),
        (
            "Live status",
            {
                "fields": [
                    "status",
                    "status_reason",
                    "checked_at",
                    "requests_running",
                    "requests_waiting",
                    "kv_cache_usage",
                ]
            },
        ),
    ]

    @admin.display(description="APIs")
    def apis_shown(self, obj):
        return ", ".join(obj.apis)


class LoraAdapterInline(SuperuserEdits, admin.TabularInline):
    model = LoraAdapter
    extra = 0
    fields = ["name", "path", "base_model", "static", "state", "error"]
    readonly_fields = ["state", "error"]


class EngineEventInline(admin.TabularInline):
    model = EngineEvent
    extra = 0
    fields = ["at", "status", "reason"]
    readonly_fields = fields  # type: ignore[assignment]  # names only
    can_delete = False
    max_num = 0
    ordering = ["-at", "-pk"]

    def get_queryset(self, request):
        return super().get_queryset(request).order_by("-at", "-pk")


@admin.register(EngineProcess)
class EngineProcessAdmin(SuperuserEdits, Operations, admin.ModelAdmin):
    list_display = [
        "name",
        "kind",
        "model",
        "port",
        "desired_state",
        "status_badge",
        "status_reason_short",
        "last_check_at",
        "running",
        "waiting",
        "kv_cache",
    ]
    list_filter = ["kind", "status", "desired_state"]
    search_fields = ["name", "model"]
    inlines = [LoraAdapterInline, EngineEventInline]
    actions = ["start", "stop", "restart"]
    readonly_fields = [
        "status",
        "status_reason",
        "status_changed_at",
        "pid",
        "started_at",
        "restarts_in_window",
        "next_restart_at",
        "failed_checks",
        "last_check_at",
        "last_check_ok",
        "metrics",
        "command",
        "log",
    ]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "name",
                    "endpoint",
                    "host",
                    "kind",
                    "model",
                    "served_model_name",
                    "bind_host",
                    "port",
                    "desired_state",
                ]
            },
        ),
        (
            "vLLM options",
            {
                "fields": [
                    "max_model_len",
                    "gpu_memory_utilization",
                    "max_num_seqs",
                    "tensor_parallel_size",
                    "quantization",
                    "dtype",
                    "enable_prefix_caching",
                    "tool_call_parser",
                    "enable_lora",
                    "max_loras",
                    "max_lora_rank",
                    "runtime_lora_updating",
                    "extra_args",
                    "environment",
                    "startup_timeout",
                    "stop_timeout",
                ]
            },
        ),
        (
            "Live",
            {
                "fields": [
                    "status",
                    "status_reason",
                    "status_changed_at",
                    "pid",
                    "started_at",
                    "last_check_at",
                    "last_check_ok",
                    "failed_checks",
                    "restarts_in_window",
                    "next_restart_at",
                    "metrics",
                    "command",
                    "log",
                ]
            },
        ),
    ]

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj):
        colour = {
            "ready": "#1a7f37",
            "starting": "#9a6700",
            "restarting": "#9a6700",
            "unhealthy": "#bc4c00",
            "crashed": "#cf222e",
        }.get(obj.status, "#57606a")
        return format_html('<strong style="color:{}">{}</strong>', colour, obj.get_status_display())

    @admin.display(description="reason")
    def status_reason_short(self, obj):
        return obj.status_reason[:120]

    @admin.display(description="running")
    def running(self, obj):
        return obj.metrics.get("running")

    @admin.display(description="waiting")
    def waiting(self, obj):
        return obj.metrics.get("waiting")

    @admin.display(description="KV cache")
    def kv_cache(self, obj):
        value = obj.metrics.get("kv_cache_usage")
        return None if value is None else f"{value:.0%}"

    @admin.display(description="command line")
    def command(self, obj):
        if obj.pk is None:
            return "—"
        try:
            return " ".join(engine_command.command_line(obj))
        except SupervisorError as exc:
            return str(exc)

    @admin.display(description="log (last lines)")
    def log(self, obj):
        if obj.pk is None:
            return "—"
        return format_html(
            '<pre style="max-height:30em;overflow:auto;white-space:pre-wrap">{}</pre>',
            engine_processes.log_tail(obj, 80) or "(empty)",
        )

    def _enqueue(self, request, queryset, action):
        for engine in queryset:
            transaction.on_commit(lambda engine=engine: tasks.enqueue(action, engine))  # type: ignore[misc]  # a default binds each engine
        self.message_user(
            request,
            f"{action.capitalize()} queued for {queryset.count()} engine(s); "
            "the status column follows.",
        )

    @admin.action(description="Start selected engines", permissions=["operate"])
    def start(self, request, queryset):
        self._enqueue(request, queryset, "start")

    @admin.action(description="Stop selected engines", permissions=["operate"])
    def stop(self, request, queryset):
        self._enqueue(request, queryset, "stop")

    @admin.action(description="Restart selected engines", permissions=["operate"])
    def restart(self, request, queryset):
        self._enqueue(request, queryset, "restart")


@admin.register(LoraAdapter)
class LoraAdapterAdmin(SuperuserEdits, Operations, admin.ModelAdmin):
    list_display = ["name", "engine", "path", "static", "state", "error"]
    list_filter = ["state", "static", "engine"]
    readonly_fields = ["state", "error"]
    actions = ["load", "unload"]

    def _queue(self, request, queryset, action: str):
        """The engine is called from its own host's queue, not from this request: a load can take
        many seconds, and only that host is sure to reach the engine."""
        for adapter in queryset.select_related("engine"):
            if action == "load" and (refusal := lora.adapter_load_refusal(adapter)):
                self.message_user(request, refusal, messages.ERROR)
                continue
            transaction.on_commit(functools.partial(tasks.adapter_enqueue, action, adapter))
            self.message_user(
                request,
                f"{adapter.name}: {action} queued on {adapter.engine.queue}; its state and "
                "error show the engine's answer.",
            )

    @admin.action(
        description="Load selected adapters (runtime, on the engine's host)",
        permissions=["operate"],
    )
    def load(self, request, queryset):
        self._queue(request, queryset, "load")

    @admin.action(
        description="Unload selected adapters (runtime, on the engine's host)",
        permissions=["operate"],
    )
    def unload(self, request, queryset):
        self._queue(request, queryset, "unload")
