"""The request log's rows (written by observability.requestlog, read by the admin and the
dashboard)."""

from django.conf import settings
from django.db import models

# What a request asked of the model beyond text (the request log's `features`, space-separated).
REQUEST_FEATURES = {
    "tools": "tools offered",
    "tool_calls": "the model called a tool",
    "tool_results": "tool results to read",
    "structured": "a structured output (JSON schema, JSON, choice, regex)",
    "logprobs": "logprobs",
    "n": "several choices",
    "media": "images, audio or files",
}


class RequestLog(models.Model):
    """One row per answered request: what its user saw, in numbers and short names (see
    observability.requestlog). The table is partitioned by day on `at` and its key is (id, at);
    Django sees `id` alone, which its identity keeps unique. Rows are written by the request log's
    batch writer, never through this model, and never changed; references are plain ids (no
    foreign key), so deleting a user, key or entry keeps its history and costs no lookup in a table
    this size."""

    class Interface(models.TextChoices):
        WEB = "web", "browser"
        API = "api", "chat API"
        V1 = "v1", "/v1 API"

    class Api(models.TextChoices):
        """The API a request called: a chat answer (every interface), or /v1's raw completions
        and embeddings."""

        CHAT = "chat", "chat"
        COMPLETIONS = "completions", "completions"
        EMBEDDINGS = "embeddings", "embeddings"

    class Status(models.TextChoices):
        COMPLETE = "complete", "complete"
        PARTIAL = "partial", "partial"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"

    class PersonalDataAction(models.TextChoices):
        """Where a question holding personal data went (routing.screening; routing.events.Spent)."""

        LOCAL = "local", "answered locally"
        REDACTED = "redacted", "sent out redacted"
        SENT = "sent", "sent to an endpoint allowed the types"
        REFUSED = "refused", "refused"

    class InjectionAction(models.TextChoices):
        """What came of a suspected prompt injection (privacy.policy's setting, as carried out)."""

        LOGGED = "logged", "logged"
        ROUTED = "routed", "routed by its rule"
        REFUSED = "refused", "refused"

    id = models.BigIntegerField(primary_key=True)
    at = models.DateTimeField("time")
    interface = models.CharField(max_length=8, choices=Interface.choices)
    api = models.CharField("API", max_length=16, choices=Api.choices, default=Api.CHAT)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # Named by its label, not imported: the chat app writes rows through this app, never the
    # other way round.
    api_key = models.ForeignKey(
        "chat.ApiKey", null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    session_id = models.BigIntegerField(null=True)
    road = models.CharField(max_length=16, blank=True)
    rule = models.CharField(max_length=100, blank=True)
    target = models.CharField(max_length=100, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices)
    error_code = models.CharField(max_length=40, blank=True)
    ttft_ms = models.FloatField("TTFT ms", null=True)
    latency_ms = models.FloatField("latency ms")
    overhead_ms = models.FloatField("gateway ms", null=True)
    # Time spent waiting for room at an endpoint's capacity (inference_ops.admission), every
    # attempt together; part of ttft_ms and overhead_ms. None: it never waited.
    wait_ms = models.FloatField("wait ms", null=True)
    # Its priority class at an endpoint's capacity (inference_ops.admission.CLASSES); "" when no
    # model was asked (a direct answer, a refusal before the chain).
    priority = models.CharField("class", max_length=16, blank=True, default="")
    prompt_tokens = models.IntegerField("tokens in", null=True)
    completion_tokens = models.IntegerField("tokens out", null=True)
    # In SPEND_CURRENCY, by the endpoint's prices: 0 for a direct answer, None when no price
    # could apply (failed before a model ran).
    cost = models.FloatField(null=True)
    kb_method = models.CharField("KB match", max_length=16, blank=True)
    kb_hit = models.BooleanField("KB answered", default=False)
    kb_entry = models.ForeignKey(
        "knowledge.Entry",
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    kb_score = models.FloatField("KB score", null=True)
    fallbacks = models.SmallIntegerField(default=0)
    # Same-target retries before the first token (routing.chain): how many, the time they
    # waited in all, their causes (engine failure kinds, space-separated, each once).
    retries = models.SmallIntegerField(default=0)
    retry_wait_ms = models.FloatField("retry wait ms", null=True)
    retry_causes = models.CharField(max_length=100, blank=True, default="")
    # Unreadable chunks of the engine's stream passed over.
    skipped_chunks = models.SmallIntegerField(default=0)
    # REQUEST_FEATURES' names, space-separated: what the request asked beyond text.
    features = models.CharField(max_length=100, blank=True, default="")
    # What the screening found (routing.screening), never the values: the personal data types
    # (privacy.detector.TYPES, space-separated) and where the question went with them; a
    # suspected prompt injection's kind (privacy.injection) and what came of it. "": none found.
    personal_data = models.CharField(max_length=100, blank=True, default="")
    personal_data_action = models.CharField(
        max_length=16, choices=PersonalDataAction.choices, blank=True, default=""
    )
    injection = models.CharField(max_length=40, blank=True, default="")
    injection_action = models.CharField(
        max_length=16, choices=InjectionAction.choices, blank=True, default=""
    )
    request_key = models.UUIDField()

    class Meta:
        # A partitioned table: made by chat's migration 0002 (the log was chat's then, hence the
        # name), its partitions kept by observability.requestlog.
        db_table = "chat_requestlog"
        ordering = ["-at"]
        verbose_name = "request log row"

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.interface} {self.road or '-'} {self.status}"
