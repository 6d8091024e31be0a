from django.contrib import admin

from chat.apikeys import apikey_revoke
from chat.models import ApiKey, ChatSession, Message


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
    readonly_fields = fields


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


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are immutable but for revocation: an un-revoked key would bring a leaked one back, and a
    new name would move a key onto another client's routing rule (`key:NAME`). Revoking is the
    action, for staff with the change permission; the owner revokes their own from the keys page."""

    list_display = ["name", "user", "prefix", "scopes", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__username", "prefix"]
    fields = ["name", "user", "prefix", "scopes", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # keys are created by their owner (page, API) or `manage.py createapikey`

    def has_change_permission(self, request, obj=None):
        return False  # the change form is read-only for everyone, superusers included

    def has_revoke_permission(self, request):
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    @admin.action(description="Revoke selected keys", permissions=["revoke"])
    def revoke(self, request, queryset):
        live = list(queryset.filter(revoked_at__isnull=True))
        for key in live:
            apikey_revoke(key=key)  # also forgets it in this process's cache of recent keys
        self.message_user(request, f"{len(live)} key(s) revoked.")
