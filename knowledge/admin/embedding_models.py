"""Embedding models in the admin, with the operating point each answers at and its latest
calibration run."""

from django.contrib import admin
from django.db.models import OuterRef, Subquery
from django.urls import reverse
from django.utils.html import format_html

from core.admin import SuperuserEdits
from knowledge.models import Calibration, EmbeddingModel


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
