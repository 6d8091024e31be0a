from django import forms
from django.contrib import admin

from core.admin import SuperuserEdits
from privacy.detector import TYPES
from privacy.models import PrivacySettings


class PrivacySettingsForm(forms.ModelForm):
    types = forms.TypedMultipleChoiceField(
        choices=[(kind, kind) for kind in TYPES],
        widget=forms.CheckboxSelectMultiple,
        required=False,
        label="Types looked for",
        help_text=PrivacySettings._meta.get_field("types").help_text,
    )

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
