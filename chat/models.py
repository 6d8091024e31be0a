"""Conversations and API keys."""

import hashlib

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from inference_ops.admission import CLASSES
from routing.validation import CLIENT_PREFIX


class ChatSession(models.Model):
    class Source(models.TextChoices):
        WEB = "web", "browser"
        API = "api", "API"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    title = models.CharField(max_length=200, blank=True)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.WEB)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-pk"]
        indexes = [models.Index(fields=["user", "-updated_at"])]

    def __str__(self):
        return self.title or f"Session {self.pk}"


class Message(models.Model):  # noqa: DJ008 - its admin lists its fields; a name would change its pages
    """One turn. Written when it starts and when it ends, never per token."""

    class Role(models.TextChoices):
        USER = "user", "user"
        ASSISTANT = "assistant", "assistant"

    class Status(models.TextChoices):
        STREAMING = "streaming", "streaming"
        COMPLETE = "complete", "complete"
        PARTIAL = "partial", "partial (cut off after some tokens)"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    # A question's KB passages as the engine got them ahead of its text (routing.prompt's
    # passages block, "" for none): a later turn replays the question with them, byte for byte,
    # so the engine finds the conversation's start in its prefix cache. Written at the turn's end.
    context = models.TextField(blank=True, db_default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    road = models.CharField(max_length=16, blank=True)
    rule = models.CharField(max_length=100, blank=True)
    target = models.CharField(max_length=100, blank=True)
    kb_entry = models.ForeignKey(
        "knowledge.Entry", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    ttft_ms = models.FloatField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    citations = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    # The answer's request: its request-log row, its KB record (knowledge.Hit) and the user's
    # feedback (observability.Feedback) carry the same key.
    request_key = models.UUIDField(null=True, blank=True, editable=False)
    # A database default: the turn's start writes its rows in one raw statement.
    verdict = models.CharField(
        max_length=8,
        blank=True,
        db_default="",
        help_text="The user's thumbs on this answer: up, down or none.",
    )
    # Versions of the last exchange (regenerate, edit and resend): a later version names the
    # first one, and the versions it replaced are kept, superseded. The prompt's history and the
    # search read the current ones only. Database defaults: the turn's start writes its rows in
    # one raw statement.
    version_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    superseded = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "pk"]
        indexes = [
            # Also the search's way to a user's messages (chat.selectors): it matches those
            # only, so no index over every user's words (migration 0006 dropped it).
            models.Index(fields=["session", "created_at"]),
            # The sweeper looks for turns left streaming by a crashed process.
            models.Index(
                fields=["created_at"],
                condition=models.Q(status="streaming"),
                name="message_streaming",
            ),
        ]


class ApiKey(models.Model):
    """A per-user key for integrations. Only a SHA-256 of the key is stored: keys are long
    random strings, so a slow password hash would add latency without adding safety."""

    # Not a column: the names of the key's user's groups, set on the key as it is authenticated
    # (chat.apikeys), for routing and limits. Declared for the type checker only.
    group_names: frozenset[str]

    class Scope(models.TextChoices):
        CHAT = "chat", "chat (/v1 and the chat API)"
        KB = "kb", "knowledge base API"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    # Staff's (the admin): what routing rules know this key's traffic by. Never the key's own
    # name, which its user chooses and another user's key may share.
    client_name = models.CharField(
        "client name",
        max_length=100,
        blank=True,
        help_text='Routing rules that list "client:NAME" take this key\'s traffic. Set by staff '
        "here only; the key's owner cannot set it. Empty: no rule that lists clients takes it.",
    )
    # Staff's too: the key's priority class at an endpoint's capacity (inference_ops.admission).
    priority = models.CharField(
        "priority class",
        max_length=16,
        blank=True,
        choices=[(name, name) for name in CLASSES],
        help_text="Its requests' place when an endpoint is at its capacity: interactive first, "
        "then api, then batch, each with its own deadline (ADMISSION_DEADLINE_*). Empty: api.",
    )
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    scopes = ArrayField(models.CharField(max_length=16, choices=Scope.choices), default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=models.Q(revoked_at__isnull=True),
                name="apikey_unique_live_name",
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def hash(raw: str) -> str:
        return hashlib.sha256(raw.encode()).hexdigest()

    @property
    def client(self) -> str:
        """How routing rules name this key's traffic: "client:NAME" with the client name staff
        gave it, or "api", which no rule can list (routing.validation.clients_problem)."""
        return f"{CLIENT_PREFIX}{self.client_name}" if self.client_name else "api"
