"""Misses in the admin: the groups of questions the KB did not answer, and the action that turns
a generated answer into an entry awaiting review."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from knowledge import miss_groups
from knowledge.models import Entry, Miss


class PickEntryForm(forms.Form):
    entry = forms.ModelChoiceField(
        queryset=Entry.objects.filter(kind=Entry.Kind.FAQ),
        widget=forms.NumberInput,
        label="Entry (its KB number)",
        error_messages={"invalid_choice": "No FAQ entry has that number."},
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
        "reason",
        "created_at",
        "resolved_by",
    ]
    list_filter = [
        ("resolved_by", admin.EmptyFieldListFilter),
        ("dismissed_at", admin.EmptyFieldListFilter),
    ]
    search_fields = ["question", "answer"]
    readonly_fields = [
        "question",
        "normalized",
        "answer",
        "best_entry",
        "best_score",
        "reason",
        "group",
        "count",
        "model",
        "resolved_by",
        "created_at",
        "grouped_at",
        "dismissed_at",
    ]
    exclude = ["embedding"]
    ordering = ["-count", "-created_at"]
    actions = ["add_as_phrasings", "add_to_entry", "make_entry", "dismiss"]

    def changelist_view(self, request, extra_context=None):
        miss_groups.misses_group()
        return super().changelist_view(request, extra_context)

    def get_queryset(self, request):
        heads = super().get_queryset(request).filter(group__isnull=True, grouped_at__isnull=False)
        return heads.select_related("best_entry", "resolved_by")

    def get_changelist(self, request, **kwargs):
        # Groups a curator dismissed leave the list unless its filter asks for them: the most-asked
        # groups still to decide come first, not the same refused ones every day.
        changelist = super().get_changelist(request, **kwargs)
        if "dismissed_at__isempty" in request.GET or request.method == "POST":
            return changelist  # an action runs on the rows selected, whichever list showed them

        class Undecided(changelist):  # type: ignore[valid-type, misc]  # the class the admin gives
            def get_queryset(self, request, exclude_parameters=None):
                return (
                    super()
                    .get_queryset(request, exclude_parameters)
                    .filter(dismissed_at__isnull=True)
                )

        return Undecided

    def has_add_permission(self, request):
        return False

    def has_make_entry_permission(self, request):
        # It adds an entry and marks the misses it answers as resolved.
        return self.has_change_permission(request) and request.user.has_perm("knowledge.add_entry")

    def has_add_as_phrasings_permission(self, request):
        # It changes an entry (its phrasings) and marks the misses it answers as resolved.
        return self.has_change_permission(request) and request.user.has_perm(
            "knowledge.change_entry"
        )

    @admin.display(description="closest entry")
    def best_entry_link(self, obj):
        if obj.best_entry is None:
            return "—"
        url = reverse("admin:knowledge_entry_change", args=[obj.best_entry.pk])
        return format_html('<a href="{}">KB#{}</a>', url, obj.best_entry.pk)

    @admin.action(
        description="Add the questions as phrasings of their closest entry",
        permissions=["add_as_phrasings"],
    )
    def add_as_phrasings(self, request, queryset):
        added, entries = 0, set()
        for miss in queryset.select_related("best_entry"):
            entry = miss.best_entry
            if entry is None or entry.kind != entry.Kind.FAQ:
                self.message_user(
                    request,
                    f"“{miss.question[:60]}” has no closest FAQ entry: turn it into an entry "
                    "instead.",
                    messages.WARNING,
                )
                continue
            added += len(miss_groups.miss_group_to_phrasings(miss=miss, entry=entry))
            entries.add(entry.pk)
        if entries:
            self.message_user(
                request,
                f"{added} question(s) added as phrasings of {len(entries)} entr"
                f"{'y' if len(entries) == 1 else 'ies'}: the KB answers them directly once they "
                "are embedded (seconds).",
            )

    @admin.action(
        description="Add the questions as phrasings of an entry you pick…",
        permissions=["add_as_phrasings"],
    )
    def add_to_entry(self, request, queryset):
        misses = list(queryset.select_related("best_entry"))
        if "apply" in request.POST:
            form = PickEntryForm(request.POST)
            if form.is_valid():
                entry = form.cleaned_data["entry"]
                added = sum(
                    len(miss_groups.miss_group_to_phrasings(miss=miss, entry=entry))
                    for miss in misses
                )
                self.message_user(
                    request,
                    f"{added} question(s) added as phrasings of KB#{entry.pk}: the KB answers "
                    "them directly once they are embedded (seconds).",
                )
                return None
        else:
            closest = next((m.best_entry for m in misses if m.best_entry is not None), None)
            form = PickEntryForm(initial={"entry": closest.pk if closest else None})
        return TemplateResponse(
            request,
            "admin/knowledge/miss/pick_entry.html",
            {
                **self.admin_site.each_context(request),
                "title": "Add the questions as phrasings of an entry",
                "misses": misses,
                "form": form,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "opts": self.model._meta,
            },
        )

    @admin.action(description="Dismiss: the KB should not answer these", permissions=["change"])
    def dismiss(self, request, queryset):
        dismissed = miss_groups.miss_groups_dismiss(heads=list(queryset))
        self.message_user(
            request,
            f"{dismissed} group(s) dismissed: they leave the list (its “dismissed” filter shows "
            "them).",
        )

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
