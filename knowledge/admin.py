"""Curation in the Django admin: entries, a "try a question" tool, file import, misses, and the
calibration runs with the operating point each recommends."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, Q, Subquery
from django.http import HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from core.admin import SuperuserEdits
from core.forms import LinesField
from knowledge import miss_groups, services
from knowledge.calibration import calibration_apply
from knowledge.charts import calibration_chart
from knowledge.exceptions import EntryInvalid
from knowledge.importing import detect_format, kb_import
from knowledge.models import Calibration, EmbeddingModel, Entry, Miss, PassageVector, Phrasing
from knowledge.selectors import context_passages, direct_answer, serving_model
from knowledge.tasks import entry_embed_task, kb_reembed_task


class CommaField(forms.CharField):
    def prepare_value(self, value):
        return ", ".join(value) if isinstance(value, list) else value

    def to_python(self, value):
        return [item.strip() for item in (value or "").split(",") if item.strip()]


class EntryForm(forms.ModelForm):
    aliases = LinesField(required=False, help_text="Other phrasings of the question, one per line.")
    tags = CommaField(required=False, help_text="Comma-separated.")

    class Meta:
        model = Entry
        fields = ["kind", "question", "aliases", "answer", "tags", "active", "threshold"]
        widgets = {"question": forms.TextInput(attrs={"size": 80})}

    def clean(self):
        cleaned = super().clean()
        try:
            services.entry_validate(
                {k: cleaned.get(k) for k in ("question", "answer", "kind", "threshold")}
            )
        except EntryInvalid as exc:
            for field, message in exc.errors.items():
                self.add_error(field if field in self.fields else None, message)
        return cleaned


class TagFilter(admin.SimpleListFilter):
    title = "tag"
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        tags = sorted(
            {tag for tags in Entry.objects.values_list("tags", flat=True) for tag in tags}
        )
        return [(tag, tag) for tag in tags[:100]]

    def queryset(self, request, queryset):
        return queryset.filter(tags__contains=[self.value()]) if self.value() else queryset


class ReviewFilter(admin.SimpleListFilter):
    """The curators' queue: entries made from users' questions wait here, inactive, until
    activated."""

    title = "review"
    parameter_name = "review"

    def lookups(self, request, model_admin):
        return [("awaiting", "awaiting review"), ("reviewed", "reviewed or written by a curator")]

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        return queryset.filter(needs_review=self.value() == "awaiting")


class EmbeddedFilter(admin.SimpleListFilter):
    title = "embedding"
    parameter_name = "embedded"

    def lookups(self, request, model_admin):
        return [("yes", "current"), ("no", "missing")]

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        queryset = queryset.annotate(_embedded=_embedded_subquery())
        return queryset.filter(_embedded=self.value() == "yes")


def _embedded_subquery():
    model = serving_model()
    return Exists(PassageVector.objects.filter(passage__entry=OuterRef("pk"), model=model))


@admin.register(Entry)
class EntryAdmin(admin.ModelAdmin):
    form = EntryForm
    list_display = [
        "id",
        "question",
        "kind",
        "active",
        "awaiting_review",
        "tag_list",
        "embedded",
        "updated_at",
    ]
    list_display_links = ["id", "question"]
    list_filter = [ReviewFilter, "kind", "active", EmbeddedFilter, TagFilter]
    search_fields = ["question"]  # see get_search_results
    readonly_fields = ["author", "version", "created_at", "updated_at"]
    actions = ["activate", "deactivate", "reembed_selected", "reembed_everything"]
    change_list_template = "admin/knowledge/entry/change_list.html"
    list_per_page = 50

    def get_search_results(self, request, queryset, search_term):
        # Aliases live in an array column; their phrasings are plain rows and searchable.
        if not search_term:
            return queryset, False
        found = (
            Q(question__icontains=search_term)
            | Q(answer__icontains=search_term)
            | Q(external_id=search_term)
        )
        found |= Q(pk__in=Phrasing.objects.filter(text__icontains=search_term).values("entry_id"))
        return queryset.filter(found), False

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_embedded=_embedded_subquery())

    @admin.display(description="tags")
    def tag_list(self, obj):
        return ", ".join(obj.tags)

    @admin.display(description="awaiting review", boolean=True, ordering="needs_review")
    def awaiting_review(self, obj):
        return obj.needs_review

    @admin.display(description="embedded", boolean=True, ordering="_embedded")
    def embedded(self, obj):
        return obj._embedded

    def save_model(self, request, obj, form, change):
        data = {k: form.cleaned_data[k] for k in EntryForm.Meta.fields}
        if change:
            saved = services.entry_update(entry=obj, **data)
        else:
            saved = services.entry_create(**data, author=request.user)
        obj.pk, obj.version = saved.pk, saved.version

    @admin.action(description="Activate selected entries", permissions=["change"])
    def activate(self, request, queryset):
        count = services.entries_set_active(ids=queryset.values_list("pk", flat=True), active=True)
        self.message_user(request, f"{count} entries activated.")

    @admin.action(description="Deactivate selected entries", permissions=["change"])
    def deactivate(self, request, queryset):
        count = services.entries_set_active(ids=queryset.values_list("pk", flat=True), active=False)
        self.message_user(request, f"{count} entries deactivated.")

    @admin.action(
        description="Re-embed selected entries (in the background)", permissions=["change"]
    )
    def reembed_selected(self, request, queryset):
        for entry_id, version in queryset.values_list("pk", "version"):
            entry_embed_task.delay(entry_id, version)
        self.message_user(request, f"{queryset.count()} entries queued for embedding.")

    # Costly (every entry through the model) whatever the selection: for those who may edit entries.
    @admin.action(
        description="Re-embed the whole KB with the configured model (in the background)",
        permissions=["change"],
    )
    def reembed_everything(self, request, queryset):
        kb_reembed_task.delay()
        self.message_user(
            request,
            f"Re-embedding with {services.configured_spec().name} queued; "
            "the current model serves until it is done.",
        )

    def has_import_permission(self, request):
        # A row whose question an entry already has updates that entry: an import adds and edits.
        return self.has_add_permission(request) and self.has_change_permission(request)

    def changelist_view(self, request, extra_context=None):
        # The list offers the import only to those its view lets in (trying a question needs the
        # view permission the list itself needs).
        extra_context = {**(extra_context or {}), "may_import": self.has_import_permission(request)}
        return super().changelist_view(request, extra_context)

    def get_urls(self):
        extra = [
            path("try/", self.admin_site.admin_view(self.try_view), name="knowledge_entry_try"),
            path(
                "import/",
                self.admin_site.admin_view(self.import_view),
                name="knowledge_entry_import",
            ),
        ]
        return extra + super().get_urls()

    def try_view(self, request):
        # It shows the entries, their scores and the passages a question would get: reading entries.
        if not self.has_view_permission(request):
            raise PermissionDenied
        question = request.GET.get("q", "").strip()
        result = direct_answer(question, with_matches=True) if question else None
        context = {
            **self.admin_site.each_context(request),
            "title": "Try a question",
            "opts": self.model._meta,
            "question": question,
            "result": result,
            "passages": context_passages(question) if question else [],
            "model": serving_model(),
        }
        return TemplateResponse(request, "admin/knowledge/entry/try.html", context)

    def import_view(self, request):
        if not self.has_import_permission(request):
            raise PermissionDenied
        form = ImportForm(request.POST or None, request.FILES or None)
        report = None
        if request.method == "POST" and form.is_valid():
            upload = form.cleaned_data["file"]
            try:
                fmt = detect_format(upload.name)
                text = upload.read().decode("utf-8-sig")
            except EntryInvalid as exc:
                form.add_error("file", str(exc))
            except UnicodeDecodeError:
                form.add_error("file", "the file is not UTF-8 text")
            else:
                report = kb_import(
                    text=text, fmt=fmt, author=request.user, embed=form.cleaned_data["embed"]
                )
                level = messages.WARNING if report.errors else messages.SUCCESS
                self.message_user(request, f"Import: {report.summary()}.", level)
        context = {
            **self.admin_site.each_context(request),
            "title": "Import entries",
            "opts": self.model._meta,
            "form": form,
            "report": report,
        }
        return TemplateResponse(request, "admin/knowledge/entry/import.html", context)


class ImportForm(forms.Form):
    file = forms.FileField(
        help_text="JSONL or CSV: question, answer, aliases, kind, tags, optional id."
    )
    embed = forms.ChoiceField(
        choices=[
            ("sync", "now (entries answer when the import finishes)"),
            ("async", "in the background"),
        ],
        initial="sync",
    )


@admin.register(Miss)
class MissAdmin(admin.ModelAdmin):
    """Most-asked missing questions first: one row per group of similar misses.

    Requests only write misses; the list groups what waits before it shows the groups."""

    list_display = [
        "question",
        "count",
        "best_entry_link",
        "best_score",
        "created_at",
        "resolved_by",
    ]
    list_filter = [("resolved_by", admin.EmptyFieldListFilter)]
    search_fields = ["question", "answer"]
    readonly_fields = [
        "question",
        "normalized",
        "answer",
        "best_entry",
        "best_score",
        "group",
        "count",
        "model",
        "resolved_by",
        "created_at",
        "grouped_at",
    ]
    exclude = ["embedding"]
    ordering = ["-count", "-created_at"]
    actions = ["make_entry"]

    def changelist_view(self, request, extra_context=None):
        miss_groups.misses_group()
        return super().changelist_view(request, extra_context)

    def get_queryset(self, request):
        heads = super().get_queryset(request).filter(group__isnull=True, grouped_at__isnull=False)
        return heads.select_related("best_entry", "resolved_by")

    def has_add_permission(self, request):
        return False

    def has_make_entry_permission(self, request):
        # It adds an entry and marks the misses it answers as resolved.
        return self.has_change_permission(request) and request.user.has_perm("knowledge.add_entry")

    @admin.display(description="closest entry")
    def best_entry_link(self, obj):
        if obj.best_entry is None:
            return "—"
        url = reverse("admin:knowledge_entry_change", args=[obj.best_entry.pk])
        return format_html('<a href="{}">KB#{}</a>', url, obj.best_entry.pk)

    @admin.action(
        description="Turn the generated answer into a KB entry", permissions=["make_entry"]
    )
    def make_entry(self, request, queryset):
        created = []
        for miss in queryset:
            if not miss.answer:
                self.message_user(
                    request,
                    f"“{miss.question[:60]}” has no generated answer to keep.",
                    messages.WARNING,
                )
                continue
            created.append(miss_groups.miss_to_entry(miss=miss, author=request.user))
        # A user's question and the answer they steered a model to: no one gets it unread.
        if len(created) == 1:
            self.message_user(
                request,
                "Entry created, inactive until you activate it: review its question and "
                "answer first.",
            )
            return redirect("admin:knowledge_entry_change", created[0].pk)
        if created:
            self.message_user(
                request,
                f"{len(created)} entries created, inactive until you activate them; the "
                "review filter's “awaiting review” lists them.",
            )
        return None


@admin.register(EmbeddingModel)
class EmbeddingModelAdmin(SuperuserEdits, admin.ModelAdmin):
    """Its URL receives every KB text and question, with the key its `api_key_env` names."""

    list_display = [
        "name",
        "backend",
        "dimensions",
        "state",
        "operating_point",
        "latest_calibration",
        "serving_since",
        "created_at",
    ]
    readonly_fields = [
        "state",
        "operating_point",
        "latest_calibration",
        "serving_since",
        "created_at",
    ]

    def get_queryset(self, request):
        latest = Calibration.objects.filter(model=OuterRef("pk")).order_by("-created_at", "-pk")
        return (
            super()
            .get_queryset(request)
            .annotate(_latest_calibration=Subquery(latest.values("pk")[:1]))
        )

    @admin.display(description="threshold / margin")
    def operating_point(self, obj):
        if obj.pk is None:
            return "—"
        own = obj.direct_threshold is not None or obj.direct_margin is not None
        return f"{obj.threshold:.3f} / {obj.margin:.3f} ({'own' if own else 'default'})"

    @admin.display(description="latest calibration")
    def latest_calibration(self, obj):
        pk = getattr(obj, "_latest_calibration", None)
        if pk is None:
            return "—"
        url = reverse("admin:knowledge_calibration_change", args=[pk])
        return format_html('<a href="{}">calibration #{}</a>', url, pk)


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
        "applied",
    ]
    actions = ["apply"]
    change_form_template = "admin/knowledge/calibration/change_form.html"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def has_apply_permission(self, request):
        return request.user.is_active and request.user.is_superuser

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
            run = calibration_apply(run_id=run_id)
        except EntryInvalid as exc:
            self.message_user(request, exc.errors["calibration"], messages.ERROR)
            return
        self.message_user(
            request,
            f"{run.model.name} now answers directly at threshold {run.threshold:.3f}, "
            f"margin {run.margin:.3f}.",
        )

    def get_urls(self):
        extra = [
            path(
                "<path:object_id>/apply/",
                self.admin_site.admin_view(self.apply_view),
                name="knowledge_calibration_apply",
            )
        ]
        return extra + super().get_urls()

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
                current = None  # the model already answers at this point: one mark says it
        # calibration_chart escapes every text it writes.
        chart = mark_safe(
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
