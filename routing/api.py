from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from knowledge.api import KBPermission
from routing.models import RoutingRule
from routing.selectors import apikey_find, asker, route_explain


class ExplainRequestSerializer(serializers.Serializer):
    text = serializers.CharField(max_length=32000)
    user = serializers.CharField(
        required=False, help_text="Username whose groups the rules should see."
    )
    api_key = serializers.CharField(
        required=False,
        max_length=16,
        help_text="A live API key's prefix: its owner's groups, its client and its priority class "
        "apply.",
    )
    client = serializers.CharField(
        required=False, max_length=100, help_text="Default: the API key's client, else web."
    )
    model = serializers.CharField(required=False, allow_null=True, max_length=200)

    def validate_user(self, value):
        user = get_user_model().objects.filter(username=value).first()
        if user is None:
            raise serializers.ValidationError(f"no user named {value!r}")
        return user

    def validate_api_key(self, value):
        key = apikey_find(value)
        if key is None:
            raise serializers.ValidationError("no live API key with this prefix")
        return key

    def validate(self, attrs):
        key, user = attrs.get("api_key"), attrs.get("user")
        if key is not None and user is not None and key.user_id != user.pk:
            raise serializers.ValidationError(
                {"api_key": f"this key is {key.user.get_username()}'s, not {user.get_username()}'s"}
            )
        return attrs


class ExplainPermission(KBPermission):
    """Reading the rules: the explanation lists every rule's conditions and the endpoints' failures,
    and runs nothing, so its POST needs the rules' view permission only. As for the KB API: a staff
    session, or a staff user's key with the `kb` scope (a chat key reaches chat only)."""

    model = RoutingRule
    perms_map = {**KBPermission.perms_map, "POST": KBPermission.VIEW}


class ExplainView(APIView):
    """Why would this question take the road it takes? Nothing is generated."""

    permission_classes = [ExplainPermission]

    @extend_schema(
        request=ExplainRequestSerializer,
        responses=inline_serializer(
            "Explanation",
            {
                "text": serializers.CharField(),
                "decision": serializers.DictField(),
                "kb": serializers.DictField(),
                "rules": serializers.ListField(),
                "chain": serializers.ListField(),
                "priority": serializers.DictField(),
            },
        ),
    )
    def post(self, request):
        params = ExplainRequestSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        result = async_to_sync(route_explain)(
            text=data["text"],
            model=data.get("model"),
            **asker(user=data.get("user"), key=data.get("api_key"), client=data.get("client")),
        )
        return Response(result)
