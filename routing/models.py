"""Routing rules: which road a question takes, curated in the admin.

A rule matches when every condition it sets holds (unset conditions are ignored).
Rules are tried by priority; the default rule catches the rest. A *generate*
rule names an ordered chain of targets; targets at the same position split the
traffic by weight (canary), later positions are fallbacks.
"""

from django.contrib.auth.models import Group
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from inference_ops.admission import CLASSES
from inference_ops.models import ModelEndpoint
from privacy.detector import TYPES as PERSONAL_DATA_TYPES


class RoutingRule(models.Model):
    class Action(models.TextChoices):
        KB_ONLY = "kb_only", "KB only (answer from the KB or say it is not known)"
        GENERATE = "generate", "Generate with the target chain"

    name = models.CharField(max_length=100, unique=True)
    priority = models.IntegerField(default=100, help_text="Lower runs first.")
    active = models.BooleanField(default=True)
    is_default = models.BooleanField(
        default=False, help_text="Catches every question no other rule takes."
    )

    keywords = ArrayField(
        models.CharField(max_length=100),
        default=list,
        blank=True,
        help_text="Matches when the question contains any of them (case and width folded).",
    )
    regex = models.CharField(
        max_length=500,
        blank=True,
        help_text=(
            "RE2 regular expression, searched (linear time; no lookaround or backreferences; "
            "\\w and \\d are ASCII, \\p{Han} and \\p{L} match other scripts)."
        ),
    )
    intent_examples = ArrayField(
        models.TextField(),
        default=list,
        blank=True,
        help_text="Example questions; matches when one is similar enough.",
    )
    intent_threshold = models.FloatField(
        default=0.86,
        validators=[MinValueValidator(0), MaxValueValidator(1)],
        help_text="Similarity to an example, in the serving embedding model's scale: "
        "about 0.86 for multilingual-e5-small, 0.55 for all-MiniLM-L6-v2. "
        "Try questions in the rule tester.",
    )
    min_length = models.PositiveIntegerField(null=True, blank=True, help_text="In characters.")
    max_length = models.PositiveIntegerField(null=True, blank=True, help_text="In characters.")
    groups = models.ManyToManyField(
        Group, blank=True, help_text="Only for users in one of these groups."
    )
    clients = ArrayField(
        models.CharField(max_length=100),
        default=list,
        blank=True,
        help_text='Only for these clients: "web" (the chat page), or "client:NAME" for the API '
        "keys staff gave that client name (API keys in the admin; never a key's own name, "
        "which its user chooses).",
    )
    requested_models = ArrayField(
        models.CharField(max_length=200),
        default=list,
        blank=True,
        help_text="Only when the API request names one of these models.",
    )

    over_budget = models.BooleanField(
        "over budget",
        default=False,
        help_text="Only for requests whose budget is spent and set to reroute (spend limits): "
        "e.g. a rule sending them to a local model. A request over such a budget that no "
        "over-budget rule takes is refused.",
    )

    personal_data = models.CharField(
        "personal data",
        max_length=8,
        blank=True,
        choices=[("", "Either"), ("with", "Holds personal data"), ("without", "Holds none")],
        help_text="Only for questions that hold personal data (of the types below, or any "
        "type when none is chosen), or only for those that hold none (privacy settings say "
        "which types are looked for).",
    )
    personal_data_types = ArrayField(
        models.CharField(max_length=16, choices=[(kind, kind) for kind in PERSONAL_DATA_TYPES]),
        default=list,
        blank=True,
        help_text='With "holds personal data": only these types count.',
    )
    injection = models.BooleanField(
        "suspected prompt injection",
        default=False,
        help_text="Only for questions the screening reads as a prompt injection (privacy "
        'settings: with "route", only such a rule takes them).',
    )

    action = models.CharField(max_length=16, choices=Action.choices, default=Action.GENERATE)
    redact_personal_data = models.BooleanField(
        "redact personal data for external targets",
        default=False,
        help_text="Off: a question holding personal data an external target may not receive "
        "never goes there (it stays local or is refused). On: it may, with each finding "
        "replaced by a typed placeholder ([PHONE_1]) before it leaves, and put back in the "
        "answer as it streams. Text answers only: a request with tools, a schema or several "
        "choices is still kept from it.",
    )
    pin_named = models.BooleanField(
        "named requests use only the named model",
        default=False,
        help_text="Off: a request naming a model of this rule's chain gets it first, then the "
        "rest of the chain as fallbacks. On: only the model named, no fallback.",
    )
    system_prompt = models.TextField(blank=True)
    use_kb_context = models.BooleanField(default=True)
    replay_passages = models.BooleanField(
        "replay earlier questions with their passages",
        default=True,
        help_text="On: in a conversation the gateway keeps (the chat page, the chat API), each "
        "earlier question is sent again with the KB passages it was sent with, so the prompt "
        "starts as the last turn's did and the engine reuses its prefix cache; the prompt is "
        "longer. Off: earlier questions as their text, a shorter prompt the cache serves only "
        "up to the first question.",
    )
    context_k = models.PositiveIntegerField(default=4, validators=[MaxValueValidator(20)])
    max_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The longest answer, in tokens: a client asking for more gets this, "
        "one asking for nothing too. Empty: the gateway's default, "
        "capped by ROUTING_MAX_TOKENS_CEILING.",
    )
    temperature = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(2)]
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["priority", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True, active=True),
                name="one_active_default_rule",
            ),
        ]

    def __str__(self):
        return self.name


class RouteTarget(models.Model):
    rule = models.ForeignKey(RoutingRule, on_delete=models.CASCADE, related_name="targets")
    position = models.PositiveIntegerField(
        default=1, help_text="1 first; higher positions are fallbacks."
    )
    endpoint = models.ForeignKey(ModelEndpoint, on_delete=models.PROTECT, related_name="+")
    lora_adapter = models.CharField(
        max_length=200, blank=True, help_text="Overrides the endpoint's adapter."
    )
    weight = models.PositiveIntegerField(
        default=100, help_text="Share among the targets at the same position."
    )

    class Meta:
        ordering = ["position", "-weight", "pk"]

    def __str__(self):
        adapter = f" + {self.lora_adapter}" if self.lora_adapter else ""
        return f"{self.position}. {self.endpoint.name}{adapter}"


class GroupPriority(models.Model):
    """A user group's priority class at an endpoint's capacity (inference_ops.admission): its
    members' requests wait in that class, unless their API key names another. A user in several
    groups gets the best of their classes."""

    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="priority_class")
    priority = models.CharField(
        "priority class",
        max_length=16,
        choices=[(name, name) for name in CLASSES],
        help_text="interactive first, then api, then batch, each with its own deadline "
        "(ADMISSION_DEADLINE_*).",
    )

    class Meta:
        verbose_name = "group priority class"
        verbose_name_plural = "group priority classes"

    def __str__(self):
        return f"{self.group.name}: {self.priority}"
