"""What an API key, a user or a group may spend: rate limits in requests and tokens, and a money
budget. Set in the admin, counted in Redis (spend.ledger), priced by the endpoints' rows."""

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class Limit(models.Model):
    """One subject's limits, each optional. A request is checked against every limit that applies
    to it: its API key's, its user's and each of its user's groups' (a group's limit is the whole
    group's), and goes ahead only if all of them allow it."""

    class Period(models.TextChoices):
        DAY = "day", "per day (UTC)"
        MONTH = "month", "per month (UTC)"

    class OverBudget(models.TextChoices):
        REFUSE = "refuse", "refuse with an error"
        REROUTE = "reroute", "route by the rules marked “over budget” (e.g. local only)"

    api_key = models.OneToOneField(
        "chat.ApiKey",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="spend_limit",
        verbose_name="API key",
    )
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="spend_limit",
    )
    group = models.OneToOneField(
        Group, null=True, blank=True, on_delete=models.CASCADE, related_name="spend_limit"
    )
    requests_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Questions sent to a model per minute. Direct answers from the knowledge base "
        "are free.",
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Prompt and answer tokens per minute. A request reserves its prompt and its "
        "answer's ceiling (max_tokens) before it starts and settles to what the engine used.",
    )
    tokens_per_day = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Per UTC day."
    )
    budget = models.DecimalField(
        max_digits=14,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Money per period, priced by each endpoint's prices (in SPEND_CURRENCY).",
    )
    budget_period = models.CharField(max_length=8, choices=Period.choices, default=Period.MONTH)
    warn_at = models.FloatField(
        "warn at",
        default=0.8,
        validators=[MinValueValidator(0.01), MaxValueValidator(1)],
        help_text="The share of the budget at which a warning goes to the log, the metrics and "
        "the dashboard (the soft budget).",
    )
    over_budget = models.CharField(
        max_length=8,
        choices=OverBudget.choices,
        default=OverBudget.REFUSE,
        help_text="What happens to a request once the budget is spent (the hard budget).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(api_key__isnull=False, user__isnull=True, group__isnull=True)
                    | models.Q(api_key__isnull=True, user__isnull=False, group__isnull=True)
                    | models.Q(api_key__isnull=True, user__isnull=True, group__isnull=False)
                ),
                name="limit_one_subject",
            )
        ]

    def __str__(self):
        return self.subject_label

    @property
    def subject_label(self) -> str:
        if self.api_key_id:
            # api_key_id is set, so api_key is a key.
            return f"API key {self.api_key.name} ({self.api_key.user})"  # type: ignore[union-attr]
        if self.user_id:
            return f"user {self.user}"
        if self.group_id:
            return f"group {self.group}"
        return "no subject"

    def clean(self):
        subjects = [s for s in (self.api_key_id, self.user_id, self.group_id) if s]
        if len(subjects) != 1:
            raise ValidationError("Choose exactly one of an API key, a user or a group.")
        if not any(
            value is not None
            for value in (
                self.requests_per_minute,
                self.tokens_per_minute,
                self.tokens_per_day,
                self.budget,
            )
        ):
            raise ValidationError("Set at least one limit or a budget.")
