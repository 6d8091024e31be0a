"""Direct answers in the admin, and the review queue: the questions users marked wrong (👎) that
no curator has judged, one row per question and entry, the most reported first. A curator marks
each right or wrong; the verdicts feed calibration from traffic (`manage.py kb_calibrate
--from-log`)."""

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from knowledge.hits import hits_with_feedback, hits_with_reports, review_queue
from knowledge.models import Feedback, Hit
from knowledge.services.verdicts import hits_review


class QueueFilter(admin.SimpleListFilter):
    title = "review"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [
            ("open", "To review (👎, no curator verdict; one row a question)"),
            ("rated", "Rated by users"),
            ("reviewed", "Reviewed"),
        ]

    def queryset(self, request, queryset):
        if self.value() == "open":
            return review_queue(queryset)
        if self.value() == "rated":
            return queryset.filter(user_verdict__isnull=False)
        if self.value() == "reviewed":
            return queryset.exclude(review="")
        return queryset


@admin.register(Hit)
class HitAdmin(admin.ModelAdmin):
    """What the KB answered directly, newest first. Requests write the rows; curators only judge
    them."""

    list_display = [
        "question",
        "entry_link",
        "method",
        "score_shown",
        "lead_shown",
        "users_verdict",
        "users_comment",
        "reports_shown",
        "review",
        "created_at",
    ]
    list_filter = [QueueFilter, "review", "method"]
    search_fields = ["question"]
    ordering = ["-created_at"]
    readonly_fields = [
        "question",
        "entry",
        "method",
        "score",
        "lead",
        "model",
        "created_at",
        "key",
        "review",
        "reviewed_by",
        "reviewed_at",
    ]
    exclude = ["embedding", "normalized"]
    actions = ["mark_right", "mark_wrong"]

    def get_queryset(self, request):
        # ModelAdmin.get_queryset orders before we could annotate what the queue orders by.
        queryset = hits_with_reports(hits_with_feedback(Hit.objects.select_related("entry")))
        return queryset.order_by(*self.get_ordering(request))

    def get_ordering(self, request):
        if request.GET.get(QueueFilter.parameter_name) == "open":
            return ["-reports", "-created_at"]  # the queue: the most reported question first
        return super().get_ordering(request)

    def has_add_permission(self, request):
        return False

    @admin.display(description="entry")
    def entry_link(self, obj):
        if obj.entry_id is None:
            return "— (deleted)"
        url = reverse("admin:knowledge_entry_change", args=[obj.entry_id])
        return format_html('<a href="{}">KB#{}</a> {}', url, obj.entry_id, obj.entry.question[:60])

    @admin.display(description="score", ordering="score")
    def score_shown(self, obj):
        return "—" if obj.score is None else f"{obj.score:.3f}"

    @admin.display(description="lead", ordering="lead")
    def lead_shown(self, obj):
        return "—" if obj.lead is None else f"{obj.lead:.3f}"

    @admin.display(description="user's verdict", ordering="user_verdict")
    def users_verdict(self, obj):
        return dict(Feedback.Verdict.choices).get(obj.user_verdict, "—")

    @admin.display(description="user's comment")
    def users_comment(self, obj):
        return obj.user_comment or ""

    @admin.display(description="people who marked it wrong", ordering="reports")
    def reports_shown(self, obj):
        return obj.reports or "—"

    @admin.action(description="Mark right: the entry answers the question", permissions=["change"])
    def mark_right(self, request, queryset):
        self._review(request, queryset, Hit.Review.RIGHT)

    @admin.action(description="Mark wrong: the entry does not answer it", permissions=["change"])
    def mark_wrong(self, request, queryset):
        self._review(request, queryset, Hit.Review.WRONG)

    def _review(self, request, queryset, verdict):
        changed = hits_review(
            hit_ids=queryset.values_list("pk", flat=True), verdict=verdict, curator=request.user
        )
        self.message_user(request, f"{changed} direct answer(s) marked {verdict}.")
