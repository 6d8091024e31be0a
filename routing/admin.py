"""Routing rules and the route tester in the admin."""

from asgiref.sync import async_to_sync
from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path

from core.forms import LinesField
from privacy.forms import types_field
from routing.exceptions import RuleInvalid
from routing.models import GroupPriority, RouteTarget, RoutingRule
from routing.selectors import apikey_find, asker, route_explain
from routing.validation import rule_validate


class RuleForm(forms.ModelForm):
    keywords = LinesField(
        required=False, help_text="One per line; any of them matches (Chinese or English)."
    )
    intent_examples = LinesField(required=False, help_text="Example questions, one per line.")
    clients = LinesField(
        required=False,
        help_text='One per line: "web" (the chat page), or "client:NAME" for the API keys staff '
        "gave that client name (API keys in the admin).",
    )
    requested_models = LinesField(
        required=False, help_text="Model names an API request may ask for."
    )
    personal_data_types = types_field("Personal data types", RoutingRule, "personal_data_types")

    class Meta:
        model = RoutingRule
        fields = "__all__"  # noqa: DJ007 - the admin's fieldsets choose the fields

    def clean(self):
        cleaned = super().clean()
        try:
            rule_validate(fields=cleaned)  # type: ignore[arg-type]  # a ModelForm's clean returns its cleaned_data
        except RuleInvalid as exc:
            for field, message in exc.errors.items():
                self.add_error(field if field in self.fields else None, message)
        return cleaned


class TargetFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        if any(self.errors):
            return
        targets = [
            {
                "endpoint": f.cleaned_data.get("endpoint"),
                "position": f.cleaned_data.get("position", 1),
                "weight": f.cleaned_data.get("weight"),
            }
            for f in self.forms
            if f.cleaned_data and not f.cleaned_data.get("DELETE")
        ]
        # The admin hands the formset the rule as posted (not saved yet): its action counts.
        fields = {"action": self.instance.action, "is_default": self.instance.is_default}
        try:
            rule_validate(fields=fields, targets=targets)
        except RuleInvalid as exc:
            raise forms.ValidationError(
                [f"{field}: {message}" for field, message in exc.errors.items()]
            ) from None


class RouteTargetInline(admin.TabularInline):
    model = RouteTarget
    formset = TargetFormSet
    extra = 1
    fields = ["position", "endpoint", "lora_adapter", "weight"]


@admin.register(RoutingRule)
class RoutingRuleAdmin(admin.ModelAdmin):
    form = RuleForm
    inlines = [RouteTargetInline]
    list_display = ["name", "priority", "active", "is_default", "action", "conditions", "chain"]
    list_editable = ["priority", "active"]
    list_filter = ["active", "action", "is_default"]
    search_fields = ["name", "keywords", "regex"]
    filter_horizontal = ["groups"]
    change_list_template = "admin/routing/routingrule/change_list.html"
    fieldsets = [
        (None, {"fields": ["name", "priority", "active", "is_default", "action"]}),
        (
            "Conditions (all that are set must hold)",
            {
                "fields": [
                    "keywords",
                    "regex",
                    "intent_examples",
                    "intent_threshold",
                    "min_length",
                    "max_length",
                    "groups",
                    "clients",
                    "over_budget",
                    "requested_models",
                    "personal_data",
                    "personal_data_types",
                    "injection",
                ]
            },
        ),
        (
            "Generation",
            {
                "fields": [
                    "pin_named",
                    "redact_personal_data",
                    "system_prompt",
                    "use_kb_context",
                    "replay_passages",
                    "context_k",
                    "max_tokens",
                    "temperature",
                ]
            },
        ),
    ]

    @admin.display(description="conditions")
    def conditions(self, obj):
        parts = []
        if obj.is_default:
            return "everything else"
        if obj.keywords:
            parts.append("keywords: " + ", ".join(obj.keywords[:5]))
        if obj.regex:
            parts.append(f"regex /{obj.regex}/")
        if obj.intent_examples:
            parts.append(f"intent ({len(obj.intent_examples)} examples ≥ {obj.intent_threshold})")
        if obj.min_length or obj.max_length:
            parts.append(f"length {obj.min_length or 0}–{obj.max_length or '∞'}")
        if obj.clients:
            parts.append("clients: " + ", ".join(obj.clients))
        if obj.requested_models:
            parts.append("models: " + ", ".join(obj.requested_models))
        if obj.over_budget:
            parts.append("over budget")
        if obj.personal_data:
            kinds = f" ({', '.join(obj.personal_data_types)})" if obj.personal_data_types else ""
            parts.append(
                ("personal data" + kinds) if obj.personal_data == "with" else "no personal data"
            )
        if obj.injection:
            parts.append("suspected injection")
        return "; ".join(parts) or "—"

    @admin.display(description="chain")
    def chain(self, obj):
        return " → ".join(
            f"{t.endpoint.name}({t.weight})" for t in obj.targets.select_related("endpoint")
        )

    def get_urls(self):
        return [
            path("tester/", self.admin_site.admin_view(self.tester_view), name="routing_tester"),
            *super().get_urls(),
        ]

    def tester_view(self, request):
        # It lists every rule's conditions, the KB's matches and the endpoints' failures: reading
        # rules.
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = TesterForm(request.GET or None)
        result = None
        if request.GET and form.is_valid():
            data = form.cleaned_data
            result = async_to_sync(route_explain)(
                text=data["text"],
                model=data["model"] or None,
                **asker(user=data.get("user"), key=data.get("api_key"), client=data["client"]),
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Route tester",
            "opts": self.model._meta,
            "form": form,
            "result": result,
        }
        return TemplateResponse(request, "admin/routing/tester.html", context)


class TesterForm(forms.Form):
    text = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 80}))
    # Typed, not picked from a list: the page would otherwise list every username.
    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.all(),
        required=False,
        to_field_name="username",
        widget=forms.TextInput,
        help_text="A username: the rules see that user's groups.",
        error_messages={"invalid_choice": "There is no user with this username."},
    )
    api_key = forms.CharField(
        required=False,
        label="API key",
        max_length=16,
        help_text="A live key's prefix (API keys in the admin): its owner's groups, its client "
        "and its priority class apply.",
    )
    client = forms.CharField(
        required=False,
        help_text='"web", "client:NAME" (a key with that client name), or "api" (a key with none). '
        "Empty: the API key's, else web.",
    )
    model = forms.CharField(
        required=False, help_text="A model name from /v1/models forces that target."
    )

    def clean_api_key(self):
        prefix = self.cleaned_data["api_key"].strip()
        if not prefix:
            return None
        key = apikey_find(prefix)
        if key is None:
            raise forms.ValidationError("There is no live API key with this prefix.")
        return key

    def clean(self):
        cleaned = super().clean()
        # A ModelForm's clean returns its cleaned_data, never None.
        key, user = cleaned.get("api_key"), cleaned.get("user")  # type: ignore[union-attr]
        if key is not None and user is not None and key.user_id != user.pk:
            self.add_error("api_key", f"This key is {key.user.get_username()}'s, not {user}'s.")
        return cleaned


@admin.register(GroupPriority)
class GroupPriorityAdmin(admin.ModelAdmin):
    """Each group's priority class at an endpoint's capacity; an API key's own class, set on the
    key, comes first."""

    list_display = ["group", "priority"]
    list_editable = ["priority"]
    autocomplete_fields = ["group"]
