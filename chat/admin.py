from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied

from chat.apikeys import apikey_client_set, apikey_priority_set, apikey_revoke
from chat.exceptions import ApiKeyInvalid
from chat.models import ApiKey, ChatSession, Message
from routing.validation import client_name_problem


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    can_delete = False
    fields = [
        "created_at",
        "role",
        "status",
        "road",
        "target",
        "content",
        "ttft_ms",
        "latency_ms",
        "error",
    ]
    readonly_fields = fields  # type: ignore[assignment]  # names only


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "user", "source", "updated_at"]
    list_filter = ["source"]
    search_fields = ["title", "user__username"]
    inlines = [MessageInline]
    readonly_fields = ["user", "source", "created_at", "updated_at"]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "session",
        "role",
        "status",
        "road",
        "rule",
        "target",
        "ttft_ms",
        "latency_ms",
        "created_at",
    ]
    list_filter = ["role", "status", "road", "superseded"]
    search_fields = ["content"]
    readonly_fields = [f.name for f in Message._meta.fields]

    def has_add_permission(self, request):
        return False


class ApiKeyForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = ["client_name", "priority"]

    def clean_client_name(self):
        name = (self.cleaned_data.get("client_name") or "").strip()
        if name and (problem := client_name_problem(name)):
            raise forms.ValidationError(f"The client name {problem}.")
        return name


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """A key's client name and priority class are what staff change in its form: what routing
    rules know its traffic by ("client:NAME") and its place at a full endpoint, so they are
    staff's to give, never the owner's (a key's own name is its user's choice, and another user's
    key may share it). The rest is immutable: an un-revoked
    key would bring a leaked one back. Revoking is the action; both need the change permission.
    A revoked key is read-only. The owner revokes their own from the keys page."""

    form = ApiKeyForm
    fields = [
        "name",
        "user",
        "client_name",
        "priority",
        "prefix",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_display = fields  # type: ignore[assignment]  # names only
    list_filter = ["revoked_at"]
    search_fields = ["name", "client_name", "user__username", "prefix"]
    readonly_fields = [f for f in fields if f not in ("client_name", "priority")]  # type: ignore[misc]  # names only
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # keys are created by their owner (page, API) or `manage.py createapikey`

    def has_change_permission(self, request, obj=None):
        if obj is not None and obj.revoked_at is not None:
            return False  # nothing of a revoked key changes, superusers included
        return super().has_change_permission(request, obj)

    def has_revoke_permission(self, request):
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    def save_model(self, request, obj, form, change):
        try:
            apikey_client_set(key=obj, client_name=form.cleaned_data["client_name"])
            apikey_priority_set(key=obj, priority=form.cleaned_data["priority"])
        except ApiKeyInvalid as exc:  # revoked meanwhile: the form was checked before
            raise PermissionDenied(str(exc)) from None

    @admin.action(description="Revoke selected keys", permissions=["revoke"])
    def revoke(self, request, queryset):
        live = list(queryset.filter(revoked_at__isnull=True))
        for key in live:
            apikey_revoke(key=key)  # also forgets it in this process's cache of recent keys
        self.message_user(request, f"{len(live)} key(s) revoked.")
