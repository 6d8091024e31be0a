"""The chat API's usage: the caller's limits, what is left of them, its spend and its priority
class (chat.usage reads them)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from chat.auth import ChatScope
from chat.models import ApiKey
from chat.usage import usage_read


class UsageLimitSerializer(serializers.Serializer):
    whose = serializers.CharField(help_text='"API key NAME", "user NAME" or "group NAME"')
    kind = serializers.ChoiceField(choices=["key", "user", "group"])
    limit = serializers.CharField(help_text='e.g. "tokens per minute", "budget per month"')
    unit = serializers.CharField(help_text="requests, tokens, or the budget's currency")
    allowed = serializers.FloatField()
    used = serializers.FloatField(help_text="in the current window, reservations included")
    remaining = serializers.FloatField()
    resets_in_seconds = serializers.IntegerField()
    over_budget = serializers.ChoiceField(
        choices=["refuse", "reroute"], allow_null=True, help_text="budgets only"
    )


class UsageSpendSerializer(serializers.Serializer):
    currency = serializers.CharField()
    whose = serializers.CharField(help_text='"this API key" or "you"')
    today = serializers.FloatField()
    this_month = serializers.FloatField()


class UsagePrioritySerializer(serializers.Serializer):
    deadline_seconds = serializers.FloatField(
        help_text="how long a request waits at most at a full endpoint before a 429"
    )


# "class" and "from" are Python keywords: declared after the class statement.
UsagePrioritySerializer._declared_fields.update(
    {
        "class": serializers.CharField(help_text="interactive, api or batch"),
        "from": serializers.CharField(help_text="this API key, your groups, or a default"),
    }
)


class UsageSerializer(serializers.Serializer):
    limits = UsageLimitSerializer(many=True)
    spend = UsageSpendSerializer()
    priority = UsagePrioritySerializer(
        help_text="Your requests' priority class when an endpoint is at its capacity."
    )


class UsageView(APIView):
    """GET your limits, what is left of each in its window, and what you spent today and this
    month (with an API key: that key's spend). The limits are your key's, your own and your
    groups' (spend limits, set by the operators). Also your priority class when an endpoint is
    at its capacity, and how long your requests wait there at most."""

    permission_classes = [ChatScope]

    @extend_schema(responses=UsageSerializer)
    def get(self, request):
        api_key_id = request.auth.pk if isinstance(request.auth, ApiKey) else None
        usage = usage_read(user=request.user, api_key_id=api_key_id)
        return Response({"limits": usage.limits, "spend": usage.spend, "priority": usage.priority})
