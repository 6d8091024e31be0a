"""Calibration runs in the admin: the chart and tables of a run, a run over the last days' traffic
(with the verdicts people gave), and applying the operating point a run recommends to its model,
logged."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect
from django.urls import path
from django.utils.safestring import mark_safe

from knowledge.calibration_traffic import calibrate_from_traffic, traffic_source
from knowledge.charts import calibration_chart
from knowledge.exceptions import EntryInvalid
from knowledge.models import Calibration
from knowledge.services.calibrations import calibration_apply, calibration_save


class TrafficForm(forms.Form):
    days = forms.IntegerField(min_value=1, max_value=90)
    target = forms.FloatField(min_value=0.5, max_value=1.0)


def _number(value, digits=3):
    return "—" if value is None else f"{value:.{digits}f}"


@admin.register(Calibration)
class CalibrationAdmin(admin.ModelAdmin):
    """Runs of `manage.py kb_calibrate`, read-only: the command writes them. Applying a run changes
    which questions every user gets a direct answer to, so only superusers apply (or delete)."""

    list_display = [
        "model",
        "created_at",
        "target",
        "questions",
        "threshold_shown",
        "margin_shown",
        "precision_shown",
        "recall_shown",
        "hit_rate_shown",
        "applied",
    ]
    list_display_links = ["created_at"]
    list_filter = ["model"]
    list_select_related = ["model"]
    fields = [
        "model",
        "created_at",
        "source",
        "target",
        "questions",
        "answerable",
        "threshold",
        "margin",
        "precision",
        "recall",
        "hit_rate",
        "applied",
        "applied_at",
        "applied_by",
    ]
    actions = ["apply"]
    change_list_template = "admin/knowledge/calibration/change_list.html"
    change_form_template = "admin/knowledge/calibration/change_form.html"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def has_apply_permission(self, request):
        return request.user.is_active and request.user.is_superuser

    def has_calibrate_permission(self, request):
        # A run changes nothing that serves; applying it does (has_apply_permission).
        return request.user.is_active and request.user.has_perm("knowledge.add_calibration")

    def changelist_view(self, request, extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "can_calibrate_traffic": self.has_calibrate_permission(request),
        }
        return super().changelist_view(request, extra_context)

    @admin.display(description="threshold", ordering="threshold")
    def threshold_shown(self, obj):
        return _number(obj.threshold)

    @admin.display(description="margin", ordering="margin")
    def margin_shown(self, obj):
        return _number(obj.margin)

    @admin.display(description="precision", ordering="precision")
    def precision_shown(self, obj):
        return _number(obj.precision)

    @admin.display(description="recall", ordering="recall")
    def recall_shown(self, obj):
        return _number(obj.recall)

    @admin.display(description="hit rate", ordering="hit_rate")
    def hit_rate_shown(self, obj):
        return _number(obj.hit_rate)

    @admin.action(description="Apply this operating point to its model", permissions=["apply"])
    def apply(self, request, queryset):
        runs = list(queryset.order_by("model_id", "-created_at"))
        if len({run.model_id for run in runs}) < len(runs):
            self.message_user(
                request,
                "Select one calibration per model: a model has one operating point.",
                messages.ERROR,
            )
            return
        for run in runs:
            self._apply(request, run.pk)

    def _apply(self, request, run_id):
        try:
            run = calibration_apply(run_id=run_id, by=request.user)
        except EntryInvalid as exc:
            self.message_user(request, exc.errors["calibration"], messages.ERROR)
            return
        done = (
            f"{run.model.name} now answers directly at threshold {run.threshold:.3f}, "
            f"margin {run.margin:.3f} (calibration #{run.pk})."
        )
        # In the admin's history of both the run and the model.
        self.log_change(request, run, [{"changed": {"fields": ["applied"]}}])
        self.log_change(request, run.model, done)
        self.message_user(request, done)

    def get_urls(self):
        extra = [
            path(
                "from-traffic/",
                self.admin_site.admin_view(self.from_traffic_view),
                name="knowledge_calibration_from_traffic",
            ),
            path(
                "<path:object_id>/apply/",
                self.admin_site.admin_view(self.apply_view),
                name="knowledge_calibration_apply",
            ),
        ]
        return extra + super().get_urls()

    def from_traffic_view(self, request):
        """Replay the last days' direct answers and misses with their stored vectors and the
        verdicts gathered; the run's page shows what it recommends, to apply in one click."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_calibrate_permission(request):
            raise PermissionDenied
        form = TrafficForm(request.POST)
        if not form.is_valid():
            problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())  # type: ignore[arg-type]  # an ErrorList holds str
            self.message_user(request, f"Not calibrated: {problems}", messages.ERROR)
            return redirect("admin:knowledge_calibration_changelist")
        days, target = form.cleaned_data["days"], form.cleaned_data["target"]
        try:
            result = calibrate_from_traffic(days=days, target=target)
        except EntryInvalid as exc:
            self.message_user(
                request, "Not calibrated: " + "; ".join(exc.errors.values()), messages.ERROR
            )
            return redirect("admin:knowledge_calibration_changelist")
        run = calibration_save(result=result, source=traffic_source(days, result))
        self.log_addition(request, run, [{"added": {}}])
        return redirect("admin:knowledge_calibration_change", run.pk)

    def apply_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_apply_permission(request):
            raise PermissionDenied
        run = get_object_or_404(Calibration, pk=unquote(object_id))
        self._apply(request, run.pk)
        return redirect("admin:knowledge_calibration_change", run.pk)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self._report(request, obj))
        return super().render_change_form(
            request, context, add=add, change=change, form_url=form_url, obj=obj
        )

    def _report(self, request, run):
        """The chart and the tables of the change page."""
        model = run.model
        current = (model.threshold, model.margin)
        recommended = None
        if run.threshold is not None:
            recommended = (run.threshold, run.margin, run.precision, run.recall)
            if (round(current[0], 4), round(current[1], 4)) == (
                round(run.threshold, 4),
                round(run.margin, 4),
            ):
                # the model already answers at this point: one mark says it
                current = None  # type: ignore[assignment]  # None: no second mark
        # calibration_chart escapes every text it writes.
        chart = mark_safe(  # noqa: S308 - core.charts escapes its text
            calibration_chart(
                run.curve,
                recommended=recommended,
                current=current,
                target=run.target,
                label=f"Precision and recall against threshold for {model.name}",
            )
        )
        kinds = [
            {
                "kind": kind,
                **{
                    key: row.get(key, 0)
                    for key in ("asked", "answerable", "answered", "correct", "wrong")
                },
            }
            for kind, row in sorted(run.by_kind.items())
        ]
        return {
            "chart": chart,
            "model_point": (model.threshold, model.margin),
            "point_is_current": current is None,
            "kinds": kinds,
            "wrong_rows": run.wrong,
            "wrong_total": sum(row["wrong"] for row in kinds),
            "can_apply": recommended is not None and self.has_apply_permission(request),
        }
