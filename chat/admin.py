from django.contrib import admin

from chat.models import ApiKey, ChatSession, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    can_delete = False
    fields = ["created_at", "role", "status", "road", "target", "content", "ttft_ms", "latency_ms", "error"]
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
    list_display = ["id", "session", "role", "status", "road", "rule", "target", "ttft_ms", "latency_ms",
                    "created_at"]
    list_filter = ["role", "status", "road"]
    search_fields = ["content"]
    readonly_fields = [f.name for f in Message._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "scopes", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__username", "prefix"]
    readonly_fields = ["user", "prefix", "key_hash", "scopes", "created_at", "last_used_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # keys are created by their owner (page, API) or `manage.py createapikey`

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        from django.utils import timezone

        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"{count} key(s) revoked.")
