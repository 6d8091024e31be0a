"""The knowledge base: curated entries, their phrasings and passages, and vectors per model.

Vectors live in their own tables keyed by embedding model, because a model change
re-embeds everything while the old vectors keep serving: for a while each
phrasing has two vectors, of two models and possibly two dimensions. The vector
column is therefore untyped; each model gets a partial HNSW index on
`embedding::vector(dims)` (see `knowledge.services.vectors.embedding_model_index_ensure`).
"""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.core.exceptions import ValidationError
from django.db import models
from pgvector.django import VectorField

from core.key_env import key_env_problem
from knowledge.embedding import operating_point


class EmbeddingModel(models.Model):
    class Backend(models.TextChoices):
        LOCAL = "local", "sentence-transformers, in process"
        OPENAI = "openai", "OpenAI-compatible /v1/embeddings"

    class State(models.TextChoices):
        BUILDING = "building", "building (not serving yet)"
        SERVING = "serving", "serving"
        RETIRED = "retired", "retired"

    name = models.CharField(max_length=200, unique=True)
    backend = models.CharField(max_length=16, choices=Backend.choices)
    base_url = models.URLField(
        blank=True, help_text="For the openai backend: the server's /v1 URL."
    )
    api_key_env = models.CharField(
        max_length=100,
        blank=True,
        help_text="Name of the environment variable holding the API key (never the key).",
    )
    dimensions = models.PositiveIntegerField()
    # E5-style models are trained with a prefix per role; for the local E5 the engine adds them.
    query_prefix = models.CharField(
        max_length=40,
        blank=True,
        help_text="Prepended to questions and FAQ phrasings (E5 models: `query: `).",
    )
    passage_prefix = models.CharField(
        max_length=40,
        blank=True,
        help_text="Prepended to passages retrieved as context (E5 models: `passage: `).",
    )
    # Each model has its own similarity scale (E5's is compressed near 1): its operating point is
    # its own, set by `manage.py kb_calibrate --apply`; empty for the global KB_DIRECT_* settings.
    direct_threshold = models.FloatField(
        null=True,
        blank=True,
        help_text=(
            "Similarity a direct answer needs with this model; empty for KB_DIRECT_THRESHOLD."
        ),
    )
    direct_margin = models.FloatField(
        null=True,
        blank=True,
        help_text="Lead over the runner-up a direct answer needs; empty for KB_DIRECT_MARGIN.",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.BUILDING)
    created_at = models.DateTimeField(auto_now_add=True)
    serving_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # At most one model serves queries at a time.
            models.UniqueConstraint(
                fields=["state"], condition=models.Q(state="serving"), name="one_serving_model"
            ),
            models.CheckConstraint(
                condition=models.Q(direct_threshold__isnull=True)
                | models.Q(direct_threshold__gte=0, direct_threshold__lte=1),
                name="embeddingmodel_threshold_between_0_and_1",
            ),
            models.CheckConstraint(
                condition=models.Q(direct_margin__isnull=True)
                | models.Q(direct_margin__gte=0, direct_margin__lte=1),
                name="embeddingmodel_margin_between_0_and_1",
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.get_state_display()})"

    @property
    def threshold(self) -> float:
        """The similarity a direct answer needs: this row's, else KB_DIRECT_THRESHOLD, else the
        model's calibrated default (knowledge.embedding.OPERATING_POINTS); likewise below."""
        return self._point(self.direct_threshold, settings.KB_DIRECT_THRESHOLD, "threshold")

    @property
    def margin(self) -> float:
        return self._point(self.direct_margin, settings.KB_DIRECT_MARGIN, "margin")

    @property
    def context_min(self) -> float:
        """The similarity a passage needs to be context."""
        return self._point(None, settings.KB_CONTEXT_MIN_SCORE, "context_min")

    @property
    def group_score(self) -> float:
        """The similarity at which two KB misses group."""
        return self._point(None, settings.KB_MISS_GROUP_SCORE, "group")

    def _point(self, own: float | None, setting: float | None, field: str) -> float:
        for value in (own, setting):
            if value is not None:
                return value
        return getattr(operating_point(self.name), field)

    def clean(self):
        if problem := key_env_problem(self.api_key_env):
            raise ValidationError({"api_key_env": problem})


class Entry(models.Model):
    class Kind(models.TextChoices):
        FAQ = "faq", "FAQ (may be answered directly)"
        RULE = "rule", "Business rule (context only)"
        DOCUMENT = "document", "Document (context only, split into passages)"

    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.FAQ)
    external_id = models.CharField(
        max_length=200,
        null=True,
        blank=True,
        unique=True,
        help_text="The entry's id in the system it was imported from (a string `id` in an import "
        "file), so files round-trip between instances.",
    )
    question = models.TextField(help_text="The question, or the title of a rule or document.")
    aliases = ArrayField(
        models.TextField(), default=list, blank=True, help_text="Other phrasings, one per line."
    )
    answer = models.TextField(help_text="Markdown. For a document, its full text.")
    tags = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    active = models.BooleanField(default=True)
    # An entry made from a user's question (a KB miss) carries whatever answer that user steered a
    # model to give, and the question tops the misses as often as they repeat it: it waits,
    # inactive, until a curator activates it, and that activation is its review.
    needs_review = models.BooleanField(
        default=False,
        help_text="Made from a user's question: inactive until a curator reviews and activates it.",
    )
    reviewed_at = models.DateTimeField(
        null=True, blank=True, help_text="When a curator activated it out of review."
    )
    threshold = models.FloatField(
        null=True,
        blank=True,
        help_text="Similarity needed for a direct answer; empty for the global threshold.",
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # Bumped whenever the text changes: a queued embedding task for an older version does nothing.
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "entries"
        indexes = [GinIndex(fields=["tags"]), models.Index(fields=["kind", "active"])]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(threshold__isnull=True)
                | models.Q(threshold__gte=0, threshold__lte=1),
                name="entry_threshold_between_0_and_1",
            ),
            # Whatever path sets `active`, an entry awaiting review is never served.
            models.CheckConstraint(
                condition=~models.Q(active=True, needs_review=True),
                name="entry_inactive_while_awaiting_review",
            ),
        ]

    def __str__(self):
        return self.question[:80]

    @property
    def citation(self) -> str:
        return f"KB#{self.pk}: {self.question[:80]}"


class Phrasing(models.Model):  # noqa: DJ008 - shown only as its entry's text
    """The question or one alias of an entry, normalized for exact match."""

    entry = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="phrasings")
    text = models.TextField()
    normalized = models.TextField(db_index=True)
    primary = models.BooleanField(default=False)


class Passage(models.Model):  # noqa: DJ008 - shown only as its entry's text
    """A retrievable piece of an entry: the whole of a short entry, a paragraph group of a
    document."""

    entry = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="passages")
    ordinal = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        ordering = ["entry_id", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["entry", "ordinal"], name="passage_unique_ordinal")
        ]


class PhrasingVector(models.Model):  # noqa: DJ008 - a vector, never shown
    phrasing = models.ForeignKey(Phrasing, on_delete=models.CASCADE, related_name="vectors")
    model = models.ForeignKey(EmbeddingModel, on_delete=models.CASCADE)
    embedding = VectorField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["phrasing", "model"], name="phrasing_vector_unique")
        ]


class PassageVector(models.Model):  # noqa: DJ008 - a vector, never shown
    passage = models.ForeignKey(Passage, on_delete=models.CASCADE, related_name="vectors")
    model = models.ForeignKey(EmbeddingModel, on_delete=models.CASCADE)
    embedding = VectorField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["passage", "model"], name="passage_vector_unique")
        ]


class Miss(models.Model):
    """A question the KB did not answer directly and a model answered instead.

    Misses are grouped by similarity (`group` points at the first miss of its
    group) so curators see the most-asked missing questions first. Requests only
    append rows (`knowledge.misses`); grouping runs later over many rows at once
    (`knowledge.miss_groups.misses_group`), so a row waits with `grouped_at` empty.
    A head is a grouped row without a group.
    """

    question = models.TextField()
    normalized = models.TextField(db_index=True)
    answer = models.TextField(blank=True)
    best_entry = models.ForeignKey(
        Entry, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    best_score = models.FloatField(null=True, blank=True)
    reason = models.TextField(
        blank=True, default="", help_text="Why the KB did not answer it: the verdict's reason."
    )
    group = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="members"
    )
    count = models.PositiveIntegerField(
        default=1, help_text="On a group's first miss: how many misses it holds."
    )
    embedding = VectorField(null=True, blank=True)
    model = models.ForeignKey(EmbeddingModel, null=True, blank=True, on_delete=models.SET_NULL)
    resolved_by = models.ForeignKey(
        Entry, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    grouped_at = models.DateTimeField(
        null=True, blank=True, help_text="Empty until the miss is placed in a group."
    )
    dismissed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="On a group's first miss: when a curator decided the KB should not answer it.",
    )
    # Given by the request that noted the miss: a batch written twice (its first INSERT committed,
    # the answer lost with the connection) stores each miss once.
    note_key = models.UUIDField(null=True, blank=True, unique=True, editable=False)

    class Meta:
        verbose_name = "KB miss"
        verbose_name_plural = "KB misses"
        indexes = [
            models.Index(
                fields=["-count"],
                condition=models.Q(group__isnull=True, grouped_at__isnull=False),
                name="miss_group_heads",
            ),
            # The grouping pass reads the waiting rows in order; they are few next to the grouped
            # ones.
            models.Index(
                fields=["id"], condition=models.Q(grouped_at__isnull=True), name="miss_ungrouped"
            ),
        ]

    def __str__(self):
        return self.question[:80]


class Hit(models.Model):
    """A question the KB answered directly, kept for the review queue and for calibration from
    traffic (`knowledge.hits`): the entry, how it matched and the question's vector. Requests only
    append rows, in batches off the event loop, as misses do; curators' verdicts come later.

    `key` is the request's key: the request log's row, the chat message and the user's feedback
    carry the same one."""

    class Review(models.TextChoices):
        RIGHT = "right", "right"
        WRONG = "wrong", "wrong"

    question = models.TextField()
    normalized = models.TextField()
    entry = models.ForeignKey(Entry, null=True, on_delete=models.SET_NULL, related_name="+")
    method = models.CharField(max_length=16, help_text="exact, typo, vector or rerank.")
    score = models.FloatField(null=True, blank=True)
    lead = models.FloatField(
        null=True, blank=True, help_text="The best score's lead over the runner-up."
    )
    embedding = VectorField(null=True, blank=True)
    model = models.ForeignKey(EmbeddingModel, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(db_index=True)
    key = models.UUIDField(unique=True, editable=False)
    review = models.CharField(
        "curator's verdict",
        max_length=8,
        choices=Review.choices,
        blank=True,
        help_text="A curator's verdict: it overrules the users' (Feedback) on every answer of the "
        "same question with the same entry.",
    )
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "KB direct answer"
        indexes = [
            # Verdicts count once per person and question: the review queue (knowledge.hits) and
            # calibration from traffic gather the answers of one question with one entry.
            models.Index(fields=["normalized", "entry"], name="hit_question_entry"),
        ]

    def __str__(self):
        return self.question[:80]


class Feedback(models.Model):
    """A user's thumbs on one answer, whatever its road, keyed by the answer's request: its
    request-log row, its chat message and, for a direct answer, its Hit carry the same key. One per
    answer: a second verdict replaces the first. A thumbs down on a direct answer puts it in the
    review queue (knowledge.admin.hits) while its user is within their allowance (`queued`)."""

    class Verdict(models.TextChoices):
        UP = "up", "👍 right"
        DOWN = "down", "👎 wrong"

    request_key = models.UUIDField(unique=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    verdict = models.CharField(max_length=8, choices=Verdict.choices)
    comment = models.TextField(blank=True)
    interface = models.CharField(max_length=8, help_text="web, api or v1: where it was given.")
    # Decided when the thumbs down is given (knowledge.services.verdicts.feedback_record), so that
    # one user cannot flood the curators' queue: past KB_REVIEW_DOWNVOTES_PER_DAY a day the verdict
    # is kept, and counts in calibration as any other, but it queues nothing and raises no priority.
    queued = models.BooleanField(
        default=False,
        help_text="A thumbs down within its user's daily allowance: it puts a direct answer in "
        "the review queue.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        verbose_name_plural = "feedback"
        indexes = [
            # The allowance counts a user's queued thumbs down of the last day.
            models.Index(
                fields=["user", "updated_at"],
                condition=models.Q(queued=True),
                name="feedback_queued_by_user",
            ),
        ]

    def __str__(self):
        return f"{self.get_verdict_display()} on {self.request_key}"


class Calibration(models.Model):
    """One run of `manage.py kb_calibrate`: the curve the admin draws, the recommended operating
    point, and the labelled questions it answers wrongly. Small JSON, written once per run."""

    model = models.ForeignKey(EmbeddingModel, on_delete=models.CASCADE, related_name="calibrations")
    created_at = models.DateTimeField(auto_now_add=True)
    source = models.CharField(
        max_length=200, help_text="The labelled file, or the traffic replayed."
    )
    target = models.FloatField(help_text="The precision asked for.")
    questions = models.PositiveIntegerField()
    answerable = models.PositiveIntegerField(help_text="Questions with an expected entry.")
    threshold = models.FloatField(
        null=True, blank=True, help_text="Recommended; empty when no point reaches the target."
    )
    margin = models.FloatField(null=True, blank=True)
    precision = models.FloatField(null=True, blank=True)
    recall = models.FloatField(null=True, blank=True)
    # [[threshold, margin, precision, recall], …]: per threshold, its best margin.
    curve = models.JSONField(default=list)
    wrong = models.JSONField(
        default=list, help_text="The direct answers at the recommended point that are wrong."
    )
    by_kind = models.JSONField(default=dict)
    hit_rate = models.FloatField(
        null=True,
        blank=True,
        help_text="From traffic: the share of all the questions replayed that the recommended "
        "point answers directly.",
    )
    applied = models.BooleanField(
        default=False, help_text="The recommended point became the model's."
    )
    applied_at = models.DateTimeField(null=True, blank=True)
    applied_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self):
        return f"{self.model.name} at {self.created_at:%Y-%m-%d %H:%M}"
