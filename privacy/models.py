"""The screening's settings, one row edited in the admin (privacy.policy says what each does)."""

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.db import models

from privacy.detector import TYPES
from privacy.policy import INJECTION_ACTIONS, LOG, Policy


def _all_types() -> list[str]:
    return list(TYPES)


class PrivacySettings(models.Model):
    """The one row of settings (pk 1): absent, the defaults apply (every type, threshold 0.5,
    injections logged, passages screened)."""

    types = ArrayField(
        models.CharField(max_length=16, choices=[(kind, kind) for kind in TYPES]),
        default=_all_types,
        blank=True,
        help_text="The personal data types looked for. A type left out is never found: such a "
        "question may go to any endpoint, and is neither redacted nor counted.",
    )
    thresholds = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per type, the score a finding needs, 0 to 1, e.g. {"phone": 0.7}: higher '
        "finds less (a mainland mobile number without a word around it scores 0.6, beside "
        '"order" or "订单" 0.1). Unset types: 0.5.',
    )
    injection_action = models.CharField(
        "suspected prompt injection",
        max_length=8,
        choices=[
            ("log", "Log: noted, routed as usual (a rule for it may take it)"),
            ("route", "Route: only a rule with the injection condition takes it"),
            ("refuse", "Refuse: a clear error, no model reads it"),
        ],
        default=LOG,
    )
    screen_passages = models.BooleanField(
        "screen KB passages",
        default=True,
        help_text="A knowledge-base passage that reads as a prompt injection is left out of "
        "the prompt (and the route's reason says so).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "privacy settings"
        verbose_name_plural = "privacy settings"

    def __str__(self):
        return "Privacy settings"

    def save(self, *args, **kwargs):
        self.pk = 1  # one row
        super().save(*args, **kwargs)

    def clean(self):
        problems = {}
        if not isinstance(self.thresholds, dict):
            problems["thresholds"] = 'An object of type to score, e.g. {"phone": 0.7}.'
        else:
            unknown = sorted(set(self.thresholds) - set(TYPES))
            wrong = [
                kind
                for kind, value in self.thresholds.items()
                if isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value <= 1
            ]
            if unknown:
                problems["thresholds"] = (
                    f"Unknown types: {', '.join(unknown)}; the types are {', '.join(TYPES)}."
                )
            elif wrong:
                problems["thresholds"] = f"A score from 0 to 1, not so for {', '.join(wrong)}."
        if self.injection_action not in INJECTION_ACTIONS:
            problems["injection_action"] = "Choose log, route or refuse."
        if problems:
            raise ValidationError(problems)

    @property
    def policy(self) -> Policy:
        return Policy.of(self.types, self.thresholds, self.injection_action, self.screen_passages)


def current_policy() -> Policy:
    """The policy the row says, or the defaults when there is none (one query)."""
    row = PrivacySettings.objects.filter(pk=1).first()
    return row.policy if row is not None else Policy()
