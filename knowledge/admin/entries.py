"""Entries in the admin: their form and filters, the actions on a selection, and the two pages
the entry list links to, "try a question" and the file import."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, Q
from django.template.response import TemplateResponse
from django.urls import path

from core.forms import LinesField
from knowledge.exceptions import EntryInvalid
from knowledge.importing import detect_format, kb_import
from knowledge.models import Entry, PassageVector, Phrasing
from knowledge.selectors import context_passages, direct_answer, serving_model
from knowledge.services.entries import (
    entries_set_active,
    entry_create,
    entry_update,
    entry_validate,
)
from knowledge.services.vectors import configured_spec
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
            entry_validate({k: cleaned.get(k) for k in ("question", "answer", "kind", "threshold")})  # type: ignore[union-attr]  # clean returns cleaned_data
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
            saved = entry_update(entry=obj, **data)
        else:
            saved = entry_create(**data, author=request.user)
        obj.pk, obj.version = saved.pk, saved.version

    @admin.action(description="Activate selected entries", permissions=["change"])
    def activate(self, request, queryset):
        count = entries_set_active(ids=queryset.values_list("pk", flat=True), active=True)
        self.message_user(request, f"{count} entries activated.")

    @admin.action(description="Deactivate selected entries", permissions=["change"])
    def deactivate(self, request, queryset):
        count = entries_set_active(ids=queryset.values_list("pk", flat=True), active=False)
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
            f"Re-embedding with {configured_spec().name} queued; "
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
