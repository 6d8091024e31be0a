from django import forms
from django.contrib import admin

from core.admin import SuperuserEdits
from privacy.forms import types_field
from privacy.models import PrivacySettings


class PrivacySettingsForm(forms.ModelForm):
    types = types_field("Types looked for", PrivacySettings, "types")

    class Meta:
        model = PrivacySettings
        fields = ["types", "thresholds", "injection_action", "screen_passages"]


@admin.register(PrivacySettings)
class PrivacySettingsAdmin(SuperuserEdits, admin.ModelAdmin):
    """One row (pk 1): the list leads to it; a second is never offered, nor a delete."""

    form = PrivacySettingsForm
    readonly_fields = ["updated_at"]

    def has_add_permission(self, request):
        return super().has_add_permission(request) and not PrivacySettings.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False
